#!/usr/bin/env bash
# The collector's CPU time (user and system, from /proc/PID/stat) for one
# fixed load, for two or more builds alternated round by round: A, B, A, B,
# ... so that the machine's drift falls on every build alike. The load is
# hermes-loadgen's (4 agents, TURNS turns each, content off, 512 events a
# batch: 1.26 M events at 20 000 turns), exported to hermes-bench-sink, the
# same as benches/profile_collector.sh; `--instances N` runs N agents at
# once instead (each with its stream and one open turn at a time: give it
# TURNS = 80 000 / N for the same events); `--fixture FILE` replays FILE's
# turn instead of the recorded fixtures (benches/fixtures/open-turns.jsonl:
# turns that open and never end, so that every agent stays at its limit of
# open turns and each new turn evicts one); `--batch N` sends N events a
# batch instead of 512. Prints one line per run and then
# each build's median and spread; compare medians, and only within one run
# of the script.
#
#   benches/collector_cpu.sh [--rounds N] [--turns T] [--instances N] [--fixture FILE] [--batch N] [--gzip] BIN_DIR...
#
# BIN_DIR holds a build's hermes-collector, hermes-bench-sink and
# hermes-loadgen (e.g. target/dist copied aside).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROUNDS=5
TURNS=20000
INSTANCES=4
BATCH=512
FIXTURE=()
DIRS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift 2 ;;
    --turns) TURNS=$2; shift 2 ;;
    --instances) INSTANCES=$2; shift 2 ;;
    --fixture) FIXTURE=(--fixture "$(realpath "$2")"); shift 2 ;;
    --batch) BATCH=$2; shift 2 ;;
    --gzip) GZIP=1; shift ;;
    -*) echo "unknown option $1" >&2; exit 64 ;;
    *) DIRS+=("$(cd "$1" && pwd)"); shift ;;
  esac
done
[[ ${#DIRS[@]} -ge 1 ]] || { echo "usage: $0 [--rounds N] [--turns T] [--instances N] [--fixture FILE] [--batch N] [--gzip] BIN_DIR..." >&2; exit 64; }
OUT="$(mktemp -d /tmp/hermes-cpu-XXXXXX)"
. benches/lib.sh
if [[ -n "${GZIP:-}" ]]; then
  printf 'exporters:\n  otlp:\n    endpoint: http://127.0.0.1:4317\n    compression: gzip\n' > "$OUT/gzip.yaml"
  export COLLECTOR_CONFIG="$OUT/gzip.yaml"
fi
TICKS=$(getconf CLK_TCK)

# Prints the collector's CPU seconds for one load on build $1.
run() {
  local bin=$1 run="$OUT/$2"
  mkdir -p "$run"
  start_collector "$bin" "$run/" || exit 1
  "$bin/hermes-loadgen" --endpoint "http://127.0.0.1:$LISTEN" --instances "$INSTANCES" \
    --turns "$TURNS" --batch "$BATCH" --give-up-secs 300 "${FIXTURE[@]}" > "$run/loadgen.json"
  sleep 2   # the last spans reach the sink
  # utime and stime, fields 14 and 15 (the command, field 2, has no spaces).
  local cpu
  cpu=$(awk -v t="$TICKS" '{printf "%.2f", ($14 + $15) / t}' "/proc/$COLLECTOR_PID/stat")
  stop_collector
  echo "$cpu"
}

for round in $(seq "$ROUNDS"); do
  for i in "${!DIRS[@]}"; do
    cpu=$(run "${DIRS[$i]}" "$round-$i")
    echo "round $round  ${DIRS[$i]}  ${cpu} s" | tee -a "$OUT/runs.txt"
  done
done
echo "medians (CPU seconds, lowest-highest):"
python3 - "$OUT/runs.txt" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    _, _, build, cpu, _ = line.split()
    runs.setdefault(build, []).append(float(cpu))
for build, cpus in runs.items():
    print(f"  {statistics.median(cpus):7.2f}  ({min(cpus):.2f}-{max(cpus):.2f})  {build}")
PY
echo "logs: $OUT"
