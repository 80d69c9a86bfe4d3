#!/usr/bin/env bash
# CPU profile of the release collector under hermes-loadgen (content off),
# exporting to hermes-bench-sink: `perf record --call-graph dwarf` on the
# collector's PID, then the inclusive share of the functions that name the
# pipeline's stages. Needs `perf` (linux-perf) and the binaries of
# benches/run.sh (or target/dist, the profile releases are built with).
#
# The allocator's and memmove's time is also attributed to the nearest
# product function (`hermes_*`) on each sample's stack: callgrind counts
# allocations and copies at a small share of the instructions, while a
# block handed out cold or a copy of memory written long before costs CPU
# time far above that (docs/BENCHMARKS.md, "what each change bought", 13).
# The samples right after an atomic instruction are counted too (see
# below). FREQ sets the sampling frequency (default 499 Hz; 1999 gives about four
# times the samples for the same load).
#
#   benches/profile_collector.sh [BIN_DIR] [TURNS_PER_AGENT]
#   INSTANCES=2000 benches/profile_collector.sh DIR 40   (2 000 agents at once)
#   FIXTURE=benches/fixtures/open-turns.jsonl ...   (replays FILE's turn)
#   BATCH=4 ...   (events a batch; 512 unless set)
#   FREQ=1999 COLLECTOR_CONFIG=gzip.yaml benches/profile_collector.sh DIR 20000
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BIN="${1:-target/dist}"
TURNS="${2:-2000}"
OUT="$(mktemp -d /tmp/hermes-profile-XXXXXX)"
. benches/lib.sh
start_collector "$BIN" "$OUT/"
trap stop_collector EXIT
perf record -o "$OUT/perf.data" -F "${FREQ:-499}" --call-graph dwarf,16384 -p "$COLLECTOR_PID" 2> "$OUT/perf.log" &
PERF_PID=$!
sleep 0.5
echo "load: $(uptime)"
"$BIN/hermes-loadgen" --endpoint "http://127.0.0.1:$LISTEN" --instances "${INSTANCES:-4}" --turns "$TURNS" --batch "${BATCH:-512}" \
  ${FIXTURE:+--fixture "$(realpath "$FIXTURE")"}
sleep 2
kill -INT "$PERF_PID"; wait "$PERF_PID" || true
stop_collector
trap - EXIT

echo "samples: $(perf report -i "$OUT/perf.data" --stdio --sort dso 2>/dev/null | grep -m1 -o 'of event.*' || true)"
echo "inclusive share of the collector's CPU samples:"
perf report -i "$OUT/perf.data" --children --sort symbol --stdio --percent-limit 0.5 -g none 2>/dev/null \
  | grep -E '^ +[0-9]' \
  | grep -E 'pipeline::run::|Driver<C>::run::\{\{closure\}\}|Correlator>::ingest|driver::processed|SpanProcessor::span|SpanProcessor::process|Redactor::key_matches|KeyGlob::matches|normalize_into|apply_patterns|Correlator::ingest|Sequencer::push|SinkWorker::run|GrpcExporter as hermes_exporter::sink::SpanExporter>::export|ProstEncoder<T> as tonic::codec::Encoder>::encode|SharedCodec as tonic::codec::Encoder>::encode|ProstDecoder<U> as tonic::codec::Decoder>::decode|SliceDecoder<U> as tonic::codec::Decoder>::decode|hermes_exporter::encode::Lengths::of|drop_in_place<opentelemetry_proto::proto::tonic::trace::v1::ResourceSpans>|drop_in_place<hermes_span::trace::v1::ResourceSpans>|Vec<T,A> as core::clone::Clone>::clone|String as core::clone::Clone>::clone|EventIngest>::stream' \
  | grep -vE '\] (do_call|poll|poll_future|poll_inner|with_mut|catch_unwind|call_once)<|\(inlined\)' \
  | awk '!seen[$4]++ {printf "  %7s  %s\n", $1, substr($0, index($0, "[.]") + 4)}' | cut -c1-150
# glibc's malloc/free, or mimalloc's (the collector's global allocator
# since it replaced glibc's), and the kernel zeroing pages the allocator
# takes fresh from the OS.
echo "self time in the allocator (glibc malloc/free, mimalloc) and page zeroing:"
{ perf report -i "$OUT/perf.data" --no-children --sort symbol --stdio --percent-limit 0.3 -g none 2>/dev/null \
  | grep -E '^ +[0-9]' | grep -E '\] (_int_malloc|_int_free|malloc|cfree@GLIBC_2.2.5|malloc_consolidate|unlink_chunk.constprop.0|_int_realloc|realloc|_?mi_[a-z0-9_]+|clear_page_(rep|erms|orig))( |$)' || true; } \
  | awk '{s += $1; printf "  %7s  %s\n", $1, $3} END {printf "  total %.1f%%\n", s}'
echo "allocation and copy time by the product function that asked for it:"
perf script -i "$OUT/perf.data" -F ip,sym --no-inline 2>/dev/null | python3 -c '
import re, sys
from collections import Counter
LEAF = re.compile(r"^(_?mi_[a-z0-9_]+|__(memmove|memcpy)[a-z0-9_]*)$")
samples, stack = [], []
for line in sys.stdin:
    if not line.strip():
        if stack:
            samples.append(stack)
        stack = []
        continue
    parts = line.split(None, 1)
    stack.append(parts[1].strip() if len(parts) == 2 else "?")
if stack:
    samples.append(stack)
by = Counter()
for frames in samples:
    if frames and LEAF.match(frames[0]):
        kind = "copy" if "mem" in frames[0] else "alloc"
        caller = next((f for f in frames[1:] if f.startswith(("hermes_", "<hermes_"))), "(no product frame)")
        by[(kind, caller)] += 1
total = len(samples) or 1
for (kind, caller), n in by.most_common(12):
    print(f"  {100 * n / total:6.2f}%  {kind:5}  {caller[:110]}")
'
# An atomic read-modify-write (a reference count's clone or drop, a lock)
# is one instruction to callgrind but waits for the thread's earlier
# stores to drain; its cost shows on the sample of the instruction after
# it. The samples that land right after a `lock`-prefixed instruction, by
# function (docs/BENCHMARKS.md, "what each change bought", 23).
echo "samples right after an atomic (lock-prefixed) instruction:"
perf script -i "$OUT/perf.data" -F ip,sym --no-inline 2>/dev/null | python3 -c '
import re, subprocess, sys
from collections import Counter
binary = sys.argv[1]
# perf prints addresses in the binary as file offsets; objdump as virtual
# addresses: the executable segment says how far apart they are.
shift = 0
for line in subprocess.run(["readelf", "-lW", binary], capture_output=True, text=True).stdout.splitlines():
    f = line.split()
    if f[:1] == ["LOAD"] and "E" in f[6:-1]:
        shift = int(f[2], 16) - int(f[1], 16)
        break
after, prev_lock = set(), False
for line in subprocess.run(["objdump", "-d", "--no-show-raw-insn", binary], capture_output=True, text=True).stdout.splitlines():
    m = re.match(r"\s+([0-9a-f]+):\s+(\S+)", line)
    if not m:
        continue
    if prev_lock:
        after.add(int(m.group(1), 16))
    prev_lock = m.group(2) == "lock"
total, hits, first = 0, Counter(), True
for line in sys.stdin:
    s = line.strip()
    if not s:
        first = True
        continue
    if first:
        first = False
        total += 1
        ip, _, sym = s.partition(" ")
        if int(ip, 16) + shift in after:
            hits[sym] += 1
total = total or 1
print(f"  total {100 * sum(hits.values()) / total:.2f}%")
for sym, n in hits.most_common(10):
    print(f"  {100 * n / total:6.2f}%  {sym[:110]}")
' "$BIN/hermes-collector"
echo "perf data: $OUT/perf.data"
