#!/usr/bin/env bash
# Create (idempotently) the Python venv that the end-to-end tests run Hermes in.
#
#   venv:   ${HERMES_E2E_VENV:-<repo>/target/e2e-venv}
#   base:   hermes-agent==${HERMES_E2E_HERMES_VERSION:-0.19.0}, maturin and
#           atif==1.8.0 (the ATIF models the trajectory tests validate
#           with), from PyPI
#   shim:   pip install <repo>/agent-shim (the hermes-collector-shim plugin),
#           reinstalled whenever a source file of the shim (or of the proto
#           crate, or the workspace Cargo.toml/Cargo.lock) is newer than the
#           stamp of the last install.
#
# Environment:
#   HERMES_E2E_VENV            venv path (default <repo>/target/e2e-venv)
#   HERMES_E2E_PYTHON          interpreter that creates the venv (default python3, >= 3.11)
#   HERMES_E2E_HERMES_VERSION  hermes-agent version to install (default 0.19.0;
#                              the tests give older versions venvs of their own)
#   SKIP_SHIM=1                do not install the shim (harness development only)
#   HERMES_E2E_BUILD_ISOLATION=1  build the shim with pip's build isolation
#                              (default: --no-build-isolation, using the venv's maturin)
#   HERMES_E2E_LOCK_TIMEOUT    seconds to wait for the lock (default 1800)
#
# Parallel callers (several test binaries) serialise on "$VENV.lock" (flock).
# Prints every step it takes; prints "setup_venv: ready <venv>" at the end.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${HERMES_E2E_VENV:-$REPO/target/e2e-venv}"
PYTHON="${HERMES_E2E_PYTHON:-python3}"
HERMES_REQ="hermes-agent==${HERMES_E2E_HERMES_VERSION:-0.19.0}"
BASE_REQS=("$HERMES_REQ" "maturin>=1.5,<2" "atif==1.8.0")
BASE_SPEC="${BASE_REQS[*]}"
SHIM_DIR="$REPO/agent-shim"
SHIM_DIST="hermes-collector-shim"
LOCK_TIMEOUT="${HERMES_E2E_LOCK_TIMEOUT:-1800}"

log() { echo "setup_venv: $*"; }
# shellcheck source=tests/lib.sh
source "$REPO/tests/lib.sh"

venv_lock "$VENV"

BASE_STAMP="$VENV/.hermes-e2e-base"
SHIM_STAMP="$VENV/.hermes-e2e-shim"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check --no-input)
# The venv's tools (maturin, called by its PEP 517 backend) come first.
export PATH="$VENV/bin:$PATH"


# 1. The venv itself and the pinned base packages.
if [[ -x "$VENV/bin/python" && -x "$VENV/bin/hermes" && -f "$BASE_STAMP" && "$(cat "$BASE_STAMP")" == "$BASE_SPEC" ]]; then
  log "base packages already installed ($BASE_SPEC)"
else
  if [[ ! -x "$VENV/bin/python" ]]; then
    "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 required")'
  fi
  old_spec="$(cat "$BASE_STAMP" 2>/dev/null || true)"
  venv_create "$VENV" "$PYTHON"
  log "pip install $BASE_SPEC (quiet)"
  "${PIP[@]}" install -q "${BASE_REQS[@]}"
  # The shim is built against hermes-agent: reinstall it when that changed
  # (a test-only package added to the base does not touch it).
  if [[ " $old_spec " != *" $HERMES_REQ "* ]]; then
    rm -f "$SHIM_STAMP"
  fi
  echo "$BASE_SPEC" >"$BASE_STAMP"
fi

# 2. The shim (our plugin), rebuilt when its sources changed.
if [[ "${SKIP_SHIM:-0}" == "1" ]]; then
  log "SKIP_SHIM=1: not installing the shim"
elif [[ ! -f "$SHIM_DIR/pyproject.toml" ]]; then
  log "ERROR: $SHIM_DIR/pyproject.toml not found: the shim cannot be installed (SKIP_SHIM=1 skips it)"
  exit 1
else
  newer=""
  if [[ -f "$SHIM_STAMP" ]]; then
    newer="$(find "$SHIM_DIR" "$REPO/proto" "$REPO/Cargo.toml" "$REPO/Cargo.lock" \
      \( -name target -o -name __pycache__ -o -name '*.egg-info' -o -name dist -o -name '.*' \) -prune \
      -o -type f -newer "$SHIM_STAMP" -print 2>/dev/null | head -n 1)"
  fi
  if [[ -f "$SHIM_STAMP" && -z "$newer" ]] && "${PIP[@]}" show -q "$SHIM_DIST" >/dev/null 2>&1; then
    log "shim $SHIM_DIST up to date"
  else
    if [[ -n "$newer" ]]; then
      log "shim sources changed (e.g. $newer): reinstalling"
    fi
    # Stamp the time *before* building, so an edit made during the build
    # triggers another install next time.
    touch "$SHIM_STAMP.new"
    if "${PIP[@]}" show -q "$SHIM_DIST" >/dev/null 2>&1; then
      log "pip uninstall $SHIM_DIST"
      "${PIP[@]}" uninstall -q -y "$SHIM_DIST"
    fi
    install=(install -q --no-build-isolation "$SHIM_DIR")
    if [[ "${HERMES_E2E_BUILD_ISOLATION:-0}" == "1" ]]; then
      install=(install -q "$SHIM_DIR")
    fi
    log "pip ${install[*]} (builds the extension with maturin/cargo: may take minutes)"
    "${PIP[@]}" "${install[@]}"
    mv -f "$SHIM_STAMP.new" "$SHIM_STAMP"
  fi
fi

# 3. Report what is there.
"$VENV/bin/python" - <<'EOF'
import importlib.metadata as md
versions = {}
for dist in ("hermes-agent", "maturin", "hermes-collector-shim"):
    try:
        versions[dist] = md.version(dist)
    except md.PackageNotFoundError:
        versions[dist] = "-"
plugins = sorted(ep.name for ep in md.entry_points(group="hermes_agent.plugins"))
print("setup_venv: installed " + ", ".join(f"{k} {v}" for k, v in versions.items())
      + "; hermes_agent.plugins entry points: " + (", ".join(plugins) or "none"))
EOF
log "ready $VENV"
