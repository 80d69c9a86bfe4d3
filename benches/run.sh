#!/usr/bin/env bash
# Runs every benchmark of docs/BENCHMARKS.md and prints the tables.
#
#   benches/run.sh                 # everything (~60 min on 2 cores)
#   BENCH_REPEATS=1 BENCH_CRITERION_PASSES=1 benches/run.sh   # quicker
#
# Steps: (1) release build of the collector, loadgen and the bench helpers,
# copied to $OUT/bin so that rebuilds by others during the run change
# nothing; (2) the venvs: target/e2e-venv via tests/setup_venv.sh (the shim),
# target/bench-venv (OpenTelemetry SDK + OTLP gRPC exporter, and rotel's
# wheel for the collector's relay anchor; never installed into the e2e
# venv); (3) criterion (`cargo bench -p hermes-benches`);
# (4) hook cost in-process (benches/hook_cost.py) against a running release
# collector exporting to hermes-bench-sink; (5) collector throughput, memory
# and delay (benches/collector_load.py); (7) cost per real three-turn Hermes
# session, ours at each capture level against hermes-plugin-otel-tracing
# (benches/session_cost.py, in target/session-venv); (8) turn latency with
# the collector or its backend down/hung/failing (benches/agent_stall.py);
# (6) benches/report.py prints the tables, also written to $OUT/report.md.
#
# Environment:
#   BENCH_OUT                results directory (default target/bench-results/<date>)
#   BENCH_REPEATS            repeats of the hook-cost and collector runs (default 3)
#   BENCH_CRITERION_PASSES   passes of the criterion suite (default 1)
#   BENCH_HOOK_ITERATIONS    timed calls per hook and variant (default 50000;
#                            OpenTelemetry variants: a fifth of it)
#   BENCH_LOADGEN_TURNS      loadgen turns per agent, 4 agents (default 20000)
#   BENCH_DELAY_TURNS        real-time turns per agent of the delay run (default 8)
#   BENCH_SESSION_ROUNDS     child processes per variant of session_cost.py (default 20)
#   BENCH_STALL_ROUNDS       child processes per condition of agent_stall.py (default 12)
#   BENCH_SESSIONS_PER_PROCESS  sessions per child process, first one cold (default 3)
#   BENCH_SKIP_SETUP_VENV=1  use target/e2e-venv as it is
#   BENCH_ONLY               comma list of steps: criterion,hook,collector,session,stall
#                            (default all)
# Everything listens on 127.0.0.1 only.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$PWD"
OUT="${BENCH_OUT:-$ROOT/target/bench-results/$(date +%Y%m%d-%H%M%S)}"
REPEATS="${BENCH_REPEATS:-3}"
PASSES="${BENCH_CRITERION_PASSES:-1}"
ITER="${BENCH_HOOK_ITERATIONS:-50000}"
ONLY="${BENCH_ONLY:-criterion,hook,collector,session,stall}"
E2E_VENV="$ROOT/target/e2e-venv"
BENCH_VENV="$ROOT/target/bench-venv"
# hermes-agent 0.19.0 + the peer plugin (never installed into the e2e venv).
SESSION_VENV="$ROOT/target/session-venv"
PEER_PLUGIN="hermes-plugin-otel-tracing==0.1.1"
# The field's OTLP relay for the collector's anchor (its wheel bundles the binary).
ROTEL="rotel==0.0.1a15"
mkdir -p "$OUT/bin"
# Absolute: criterion runs with the bench crate as its working directory.
OUT="$(cd "$OUT" && pwd)"
log() { echo "run.sh: $*" >&2; }
want() { [[ ",$ONLY," == *",$1,"* ]]; }
unset OTEL_EXPORTER_OTLP_ENDPOINT OTEL_EXPORTER_OTLP_TRACES_ENDPOINT

# ---- machine
{
  echo "date:    $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit:  $(git rev-parse --short HEAD 2>/dev/null || echo '?') (working tree: $(git status --porcelain 2>/dev/null | wc -l) changed files)"
  echo "nproc:   $(nproc)"
  echo "cpu:     $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
  echo "memory:  $(free -h | awk '/^Mem:/ {print $2}')"
  echo "kernel:  $(uname -r)"
  echo "rustc:   $(rustc --version)"
  echo "uptime:  $(uptime)"
} > "$OUT/machine.txt"
cat "$OUT/machine.txt" >&2

# ---- 1. build
log "building (the dist profile, as releases are built)"
cargo build --profile dist -p hermes-collector -p hermes-loadgen -p hermes-benches --bins
for b in hermes-collector hermes-loadgen hermes-bench-sink hermes-bench-driver hermes-bench-floor; do
  cp "target/dist/$b" "$OUT/bin/$b"
done
BIN="$OUT/bin"

. benches/lib.sh

# ---- 3. criterion
if want criterion; then
  cargo bench -p hermes-benches --bench pipeline --bench shim --no-run
  for pass in $(seq 1 "$PASSES"); do
    log "criterion pass $pass/$PASSES (load: $(cut -d' ' -f1-3 /proc/loadavg))"
    echo "criterion pass $pass start: $(uptime)" >> "$OUT/loads.txt"
    timer=()
    if [[ -x /usr/bin/time ]]; then
      timer=(/usr/bin/time -a -o "$OUT/loads.txt"
        -f "criterion pass $pass: %e s wall, %U s user, %S s sys (CPU share of one core: %P)")
    fi
    CRITERION_HOME="$OUT/criterion/pass$pass" "${timer[@]}" \
      cargo bench -p hermes-benches --bench pipeline --bench shim > "$OUT/criterion_pass$pass.txt" 2>&1
    echo "criterion pass $pass end: $(uptime)" >> "$OUT/loads.txt"
  done
fi

# ---- 2. the e2e venv and a snapshot of the installed plugin
SHIM_SNAP="$OUT/shim"
if want hook || want collector || want session || want stall; then
  if [[ "${BENCH_SKIP_SETUP_VENV:-}" != 1 ]]; then
    bash tests/setup_venv.sh >&2
  fi
  # A copy of the installed plugin (package and dist-info, whose entry point
  # lets Hermes discover it from PYTHONPATH), taken under the venv's lock, is
  # what is measured: a concurrent tests/setup_venv.sh may reinstall it mid-run.
  rm -rf "$SHIM_SNAP"; mkdir -p "$SHIM_SNAP"
  flock -w 1800 "$E2E_VENV.lock" cp -r "$E2E_VENV"/lib/python3*/site-packages/hermes_collector \
    "$E2E_VENV"/lib/python3*/site-packages/hermes_collector_shim-*.dist-info "$SHIM_SNAP/"
  "$E2E_VENV/bin/python" -m pip show hermes-collector-shim 2>/dev/null | head -3 > "$OUT/shim-version.txt" || true
  ls -l --time-style=full-iso "$SHIM_SNAP"/hermes_collector/_core*.so >> "$OUT/shim-version.txt" 2>/dev/null || true
fi

# The anchors' venv: the OpenTelemetry Python SDK (hook cost) and rotel's
# wheel, which carries its collector binary (the collector's relay anchor).
bench_venv() {
  if [[ ! -x "$BENCH_VENV/bin/python" ]] || ! "$BENCH_VENV/bin/python" -c 'import opentelemetry.sdk, opentelemetry.exporter.otlp.proto.grpc, rotel' 2>/dev/null; then
    log "creating $BENCH_VENV (OpenTelemetry SDK, $ROTEL)"
    base_python="$("$E2E_VENV/bin/python" -c 'import sys; print(sys._base_executable)')"
    "$base_python" -m venv "$BENCH_VENV"
    "$BENCH_VENV/bin/python" -m pip install -q --disable-pip-version-check opentelemetry-sdk opentelemetry-exporter-otlp-proto-grpc "$ROTEL"
  fi
  "$BENCH_VENV/bin/python" -m pip list --disable-pip-version-check 2>/dev/null | grep -i -E '^(opentelemetry|grpcio|protobuf|rotel)' > "$OUT/bench-venv-packages.txt" || true
}

# ---- 4. hook cost
if want hook; then
  bench_venv

  start_collector "$BIN" "$OUT/hook_"
  trap stop_collector EXIT
  for r in $(seq 1 "$REPEATS"); do
    log "hook cost run $r/$REPEATS (load: $(cut -d' ' -f1-3 /proc/loadavg))"
    echo "hook run $r ours start: $(uptime)" >> "$OUT/loads.txt"
    PYTHONPATH="$SHIM_SNAP" HERMES_COLLECTOR_ENDPOINT="http://127.0.0.1:$LISTEN" HERMES_COLLECTOR_CAPTURE=metadata \
      "$E2E_VENV/bin/python" benches/hook_cost.py --iterations "$ITER" \
      --variants ours,ours@16,noop,noop@16,queue,timer --cold-variants ours,noop,queue > "$OUT/hook_ours_$r.json"
    echo "hook run $r otel start: $(uptime)" >> "$OUT/loads.txt"
    "$BENCH_VENV/bin/python" benches/hook_cost.py --iterations $((ITER / 5)) \
      --variants otel,otel_attrs,noop,timer --cold-variants otel,noop --otlp-endpoint "http://127.0.0.1:$SINK_PORT" > "$OUT/hook_otel_$r.json"
    echo "hook run $r end: $(uptime)" >> "$OUT/loads.txt"
  done
  stop_collector
  trap - EXIT
fi

# ---- 5. collector
if want collector; then
  bench_venv
  log "collector load runs ($REPEATS repeats)"
  echo "collector start: $(uptime)" >> "$OUT/loads.txt"
  python3 benches/collector_load.py --bins "$BIN" --repeats "$REPEATS" \
    --scenarios idle,throughput,throughput_warm,throughput_workers,throughput_gzip,relay,floor_full,floor_views,floor_seqs,open_turns,delay,idle_sender \
    --turns "${BENCH_LOADGEN_TURNS:-20000}" --delay-turns "${BENCH_DELAY_TURNS:-8}" --logdir "$OUT/collector-logs" \
    > "$OUT/collector_load.json"
  echo "collector end: $(uptime)" >> "$OUT/loads.txt"
fi

# ---- 7 + 8. real Hermes sessions: cost per session, agent stall
if want session || want stall; then
  if [[ ! -x "$SESSION_VENV/bin/python" ]] || ! "$SESSION_VENV/bin/python" -c '
import importlib.metadata as md, sys
sys.exit(0 if md.version("hermes-agent") == "0.19.0" and md.version("hermes-plugin-otel-tracing") == "0.1.1" else 1)' 2>/dev/null; then
    log "creating $SESSION_VENV (hermes-agent 0.19.0 + $PEER_PLUGIN)"
    base_python="$("$E2E_VENV/bin/python" -c 'import sys; print(sys._base_executable)')"
    rm -rf "$SESSION_VENV"
    "$base_python" -m venv "$SESSION_VENV"
    "$SESSION_VENV/bin/python" -m pip install -q --disable-pip-version-check "hermes-agent==0.19.0" "$PEER_PLUGIN"
  fi
  "$SESSION_VENV/bin/python" -m pip list --disable-pip-version-check 2>/dev/null \
    | grep -i -E '^(hermes|opentelemetry|grpcio|protobuf|requests)' > "$OUT/session-venv-packages.txt" || true
fi
# real_sessions LABEL SCRIPT ROUNDS LOGS JSON: one of the two real-session
# scripts with the shared arguments, logs in $OUT/LOGS, results in $OUT/JSON.
real_sessions() {
  log "$1 (load: $(cut -d' ' -f1-3 /proc/loadavg))"
  echo "$1 start: $(uptime)" >> "$OUT/loads.txt"
  python3 "benches/$2" --venv "$SESSION_VENV" --shim-path "$SHIM_SNAP" --bins "$BIN" \
    --rounds "$3" --sessions-per-process "${BENCH_SESSIONS_PER_PROCESS:-3}" \
    --logdir "$OUT/$4" > "$OUT/$5"
  echo "$1 end: $(uptime)" >> "$OUT/loads.txt"
}
if want session; then
  real_sessions "session cost" session_cost.py "${BENCH_SESSION_ROUNDS:-20}" session-logs session_cost.json
fi
if want stall; then
  real_sessions "agent stall" agent_stall.py "${BENCH_STALL_ROUNDS:-12}" stall-logs agent_stall.json
fi

# ---- 6. tables
python3 benches/report.py "$OUT" | tee "$OUT/report.md"
log "results in $OUT"
