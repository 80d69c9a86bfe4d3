#!/usr/bin/env bash
# Instructions the collector executes per event, counted by callgrind, for
# comparing two builds where CPU time cannot: on this shared VM the same
# binary's events per CPU-second move by ±10 % or more between runs, the
# instructions per event by 1.5–4 % on a quiet machine (more beside other
# load): how many events one export batch or processing pass holds depends
# on timing. It also prints each stage's count (a function with what it
# calls), which repeats within ≈ 1–3 %: compare those for smaller
# differences; and the allocations per event by the function that made
# them, which CPU time feels more than their instructions (a cache miss on
# memory another thread freed, and that free).
#
# One collector under valgrind takes hermes-loadgen's load (4 agents, content
# off, exporting to hermes-bench-sink) twice over, in two processes: TURNS
# and then 2 × TURNS turns per agent. Instructions per event are the
# difference of the two totals over the difference of the events, so the
# start and the shutdown cancel out.
#
# It counts instructions only: no cache misses, page faults or waiting, which
# CPU time includes. Valgrind counts a `rep movsb`/`rep stosb` once per byte,
# so glibc is told not to use them (GLIBC_TUNABLES below): its vector loops
# copy and fill 32 bytes per instruction, closer to what such a copy costs
# (1 MiB copied: 1.05 M counted instructions with `rep movsb`, 0.10 M
# without). Builds the binaries as released (the `dist` profile, as
# benches/run.sh does) unless BIN_DIR names others.
#
#   benches/collector_instructions.sh [TURNS]   (default 250)
#   BIN_DIR=DIR benches/collector_instructions.sh   (prebuilt binaries)
#   GZIP=1 benches/collector_instructions.sh   (the OTLP exporter gzips)
#   GZIP=1 GZIP_LEVEL=N benches/collector_instructions.sh   (at level N)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
TURNS="${1:-250}"
if [[ -z "${BIN_DIR:-}" ]]; then
  cargo build --quiet --profile dist -p hermes-collector -p hermes-loadgen -p hermes-benches --bins
  BIN_DIR=target/dist
fi
BIN_DIR="$(cd "$BIN_DIR" && pwd)"
command -v valgrind >/dev/null || { echo "valgrind is needed (Debian: valgrind)" >&2; exit 1; }
OUT="$(mktemp -d /tmp/hermes-instructions-XXXXXX)"
. benches/lib.sh
if [[ -n "${GZIP:-}" ]]; then
  printf 'exporters:\n  otlp:\n    endpoint: http://127.0.0.1:4317\n    compression: gzip\n' > "$OUT/gzip.yaml"
  if [[ -n "${GZIP_LEVEL:-}" ]]; then
    printf '    compression_level: %s\n' "$GZIP_LEVEL" >> "$OUT/gzip.yaml"
  fi
  export COLLECTOR_CONFIG="$OUT/gzip.yaml"
fi

# Prints "<instructions> <events acknowledged>" for one collector process.
count() {
  local turns=$1 run="$OUT/$1"
  mkdir -p "$run"
  start_collector "$BIN_DIR" "$run/" env GLIBC_TUNABLES=glibc.cpu.x86_rep_movsb_threshold=4294967295:glibc.cpu.x86_rep_stosb_threshold=4294967295 \
    valgrind --tool=callgrind --callgrind-out-file="$run/callgrind.out" || exit 1
  "$BIN_DIR/hermes-loadgen" --endpoint "http://127.0.0.1:$LISTEN" --instances 4 \
    --turns "$turns" --batch 512 --give-up-secs 120 > "$run/loadgen.json"
  sleep 2   # the last spans reach the sink
  stop_collector
  local ir events
  ir=$(grep -oE 'Collected : [0-9]+' "$run/collector.log" | grep -oE '[0-9]+$')
  events=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["events_acked"])' "$run/loadgen.json")
  echo "$ir $events"
}

first=$(count "$TURNS")
second=$(count "$((2 * TURNS))")
read -r ir1 ev1 <<< "$first"
read -r ir2 ev2 <<< "$second"
echo "turns per agent $TURNS: $ir1 instructions, $ev1 events"
echo "turns per agent $((2 * TURNS)): $ir2 instructions, $ev2 events"
python3 -c "import sys; a,b,c,d=map(int,sys.argv[1:]); print(f'instructions per event: {(c-a)/(d-b):.0f}')" "$ir1" "$ev1" "$ir2" "$ev2"

# Per stage: a function's instructions including what it calls, summed over
# its call sites (the callers' "> " lines of the calling tree), as the same
# difference per event. Steadier than the total, which moves with how many
# events one export batch or processing pass holds.
for turns in "$TURNS" "$((2 * TURNS))"; do
  callgrind_annotate --tree=calling --inclusive=yes "$OUT/$turns/callgrind.out" > "$OUT/$turns/tree.txt" 2> /dev/null
done
echo "per stage (instructions per event, including callees):"
python3 - "$OUT/$TURNS/tree.txt" "$OUT/$((2 * TURNS))/tree.txt" "$ev1" "$ev2" <<'PY'
import re, sys
# Each stage: its label, then the function whose calls (with callees) it
# is, as the `dist` build names it, then as earlier builds did: the first
# name the calling tree holds counts, so two builds compare stage by stage.
# Whole-program optimization inlines the smaller stages (the batch checks,
# the sequencer, the batcher) into the task around them: those print "-",
# and the task lines ("..., all") hold them.
STAGES = [
    ("receiver task, all",
     ["hermes_receiver::Ingest as hermes_proto::server::event_ingest_server::EventIngest>::stream::{{closure}}::{{closure}}"]),
    ("  decode", ["hermes_proto::wire::WireBatch::read_wire",
                 "hermes_proto::wire::WireBatch::from_wire",
                 "SliceDecoder<U> as tonic::codec::Decoder>::decode"]),
    ("  batch checks", ["hermes_receiver::validate::check_batch"]),
    ("correlation stage, all", ["hermes_pipeline::driver::Driver<C>::run::{{closure}}"]),
    ("  sequencer", ["hermes_correlator::sequencer::Sequencer::push_batch",
                     "hermes_correlator::sequencer::Sequencer::push_at"]),
    ("  correlator", ["hermes_correlator::ingest::<impl hermes_correlator::Correlator>::ingest_view",
                      "hermes_correlator::ingest::<impl hermes_correlator::Correlator>::ingest_taking",
                      "hermes_correlator::ingest::<impl hermes_correlator::Correlator>::ingest",
                      "hermes_correlator::Correlator::ingest"]),
    ("  derived metrics", ["hermes_pipeline::derived::DerivedMetrics::observe",
                           "hermes_collector::derived::DerivedMetrics::record"]),
    ("  span processor", ["hermes_processor::SpanProcessor::span",
                          "hermes_processor::SpanProcessor::process"]),
    # Encoded on the stage's thread when every sink takes encoded requests
    # (`ExporterStage::encoder`); the exporter task then only sends.
    ("  OTLP encoding", ["hermes_exporter::batch::Encoder::encode"]),
    ("    freeing the encoded spans", ["drop_in_place<hermes_span::trace::v1::ResourceSpans>"]),
    ("exporter task, all", ["hermes_exporter::stage::SinkWorker::run::{{closure}}"]),
    ("  batcher", ["hermes_exporter::batch::Batcher::push"]),
    ("  OTLP export (encode, send)",
     ["GrpcExporter as hermes_exporter::sink::SpanExporter>::export",
      "SharedCodec as tonic::codec::Encoder>::encode"]),
    ("  gzip", ["hermes_exporter::gzip::gzip_parts",
                "hermes_exporter::gzip::gzip_frame",
                "flate2::mem::Compress as flate2::zio::Ops>::run_vec",
                "tonic::codec::compression::compress"]),
]
CALL = re.compile(r"^ *([0-9,]+) \([^)]*\)  >")

def total(path, name):
    """The instructions of every call of `name`, or None without one."""
    sum_ = None
    with open(path) as tree:
        for line in tree:
            m = CALL.match(line)
            if m and name + " " in line:
                sum_ = (sum_ or 0) + int(m.group(1).replace(",", ""))
    return sum_

small, large, ev1, ev2 = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
for label, names in STAGES:
    found = next((n for n in names if total(large, n) is not None), None)
    if found is None:
        print(f"  {'-':>7}  {label}")
        continue
    per_event = ((total(large, found) or 0) - (total(small, found) or 0)) / (ev2 - ev1)
    print(f"  {per_event:7.0f}  {label}")
PY
# Allocations per event by the function that asked for them (inlined code
# counts as the function it was inlined into): the calls into mimalloc, the
# collector's allocator, as the same difference per event. Each is also a
# free later, often on another thread.
for turns in "$TURNS" "$((2 * TURNS))"; do
  callgrind_annotate --tree=caller "$OUT/$turns/callgrind.out" > "$OUT/$turns/callers.txt" 2> /dev/null
done
echo "allocations per event, by caller (the largest):"
python3 - "$OUT/$TURNS/callers.txt" "$OUT/$((2 * TURNS))/callers.txt" "$ev1" "$ev2" <<'PY'
import re, sys
ALLOC = re.compile(r"\*  .*:(mi_malloc_aligned|mi_zalloc_aligned|mi_realloc_aligned) ")
CALLER = re.compile(r"^ *[0-9,]+ \([^)]*\)  < (.*?\.[A-Za-z]+|\?\?\?):(.*) \(([0-9,]+)x\)")

def calls(path):
    """Calls into the allocator per calling function."""
    by, block = {}, []
    with open(path) as tree:
        for line in tree:
            m = CALLER.match(line)
            if m:
                block.append((m.group(2), int(m.group(3).replace(",", ""))))
                continue
            if ALLOC.search(line):
                for caller, n in block:
                    by[caller] = by.get(caller, 0) + n
            block = []
    return by

small, large, ev1, ev2 = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
a, b = calls(small), calls(large)
rows = sorted(((b.get(k, 0) - a.get(k, 0)) / (ev2 - ev1), k) for k in set(a) | set(b))
print(f"  {sum(r[0] for r in rows):7.2f}  in all")
for per_event, caller in reversed(rows[-12:]):
    print(f"  {per_event:7.2f}  {caller[:110]}")
PY
echo "callgrind files: $OUT/*/callgrind.out (callgrind_annotate --inclusive=yes FILE; calling trees in $OUT/*/tree.txt)"
