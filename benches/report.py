#!/usr/bin/env python3
"""Turns the outputs of benches/run.sh into the Markdown tables of
docs/BENCHMARKS.md (stdlib only).

  report.py RESULTS_DIR

RESULTS_DIR holds: machine.txt, criterion/<pass>/... (copies of
target/criterion after each pass), hook_ours_<n>.json, hook_otel_<n>.json,
collector_load.json. Every number is the median over the repeats/passes found.
"""

from __future__ import annotations

import glob
import json
import os
import statistics
import sys
from typing import Any, Dict, List, Optional

# Targets (docs/BENCHMARKS.md).
HOOK_MEDIAN_NS = 1000
HOOK_P99_NS = 5000
HOOK_RATIO = 20
EVENTS_PER_CORE = 500_000
RSS_IDLE_MIB = 30
RSS_10K_MIB = 200
BATCH_TIMEOUT_MS = 200
DELAY_SLACK_MS = 100


def med(values: List[Optional[float]]) -> Optional[float]:
    vals = [v for v in values if isinstance(v, (int, float))]
    return statistics.median(vals) if vals else None


def ok(flag: bool) -> str:
    return "**met**" if flag else "**not met**"


def fmt_ns(ns: Optional[float]) -> str:
    if ns is None:
        return "–"
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.2f} µs"
    return f"{ns:.0f} ns"


def fmt_rate(per_s: Optional[float]) -> str:
    if per_s is None:
        return "–"
    if per_s >= 1e6:
        return f"{per_s / 1e6:.2f} M/s"
    if per_s >= 1e3:
        return f"{per_s / 1e3:.1f} k/s"
    return f"{per_s:.0f} /s"


# ---------------------------------------------------------------- criterion


def criterion(results: str) -> Dict[str, Dict[str, Any]]:
    """full_id -> {ns (median over passes of criterion's median), elements, bytes}."""
    per_id: Dict[str, Dict[str, Any]] = {}
    for bench in glob.glob(os.path.join(results, "criterion", "*", "**", "new", "benchmark.json"), recursive=True):
        d = os.path.dirname(bench)
        est = os.path.join(d, "estimates.json")
        if not os.path.exists(est):
            continue
        with open(bench, encoding="utf-8") as f:
            meta = json.load(f)
        with open(est, encoding="utf-8") as f:
            estimates = json.load(f)
        entry = per_id.setdefault(meta["full_id"], {"samples": [], "throughput": meta.get("throughput")})
        entry["samples"].append(estimates["median"]["point_estimate"])
    out = {}
    for full_id, e in per_id.items():
        thr = e["throughput"] or {}
        out[full_id] = {
            "ns": med(e["samples"]),
            "passes": len(e["samples"]),
            "elements": thr.get("Elements"),
            "bytes": thr.get("Bytes"),
        }
    return out


def criterion_tables(c: Dict[str, Dict[str, Any]], spans_per_event: float) -> List[str]:
    lines: List[str] = []
    if not c:
        return ["(no criterion results)"]
    passes = max(v["passes"] for v in c.values())
    lines.append(f"Median of criterion's median estimate over {passes} pass(es).")
    lines.append("")
    lines.append("| benchmark | time per iteration | elements | per element | throughput |")
    lines.append("|---|---:|---:|---:|---:|")
    for full_id in sorted(c):
        v = c[full_id]
        ns = v["ns"]
        if v["elements"]:
            per = ns / v["elements"]
            thr = fmt_rate(1e9 / per)
            elems = str(v["elements"])
            per_s = fmt_ns(per)
        elif v["bytes"]:
            per_s = "–"
            elems = f"{v['bytes']} B"
            thr = f"{v['bytes'] / ns * 1e9 / 2**20:.0f} MiB/s"
        else:
            per_s, elems, thr = "–", "–", "–"
        lines.append(f"| `{full_id}` | {fmt_ns(ns)} | {elems} | {per_s} | {thr} |")
    lines.append("")

    # Breakdown per event of the collector's in-process stages.
    def per_elem(full_id: str) -> Optional[float]:
        v = c.get(full_id)
        if not v or not v["ns"]:
            return None
        if v["elements"]:
            return v["ns"] / v["elements"]
        return None

    def span_bytes_per(full_id: str, spans: int) -> Optional[float]:
        v = c.get(full_id)
        return v["ns"] / spans if v and v["ns"] else None

    fixtures = ["basic", "retry", "parallel", "multiturn"]
    seq_corr = med([per_elem(f"sequencer_correlator/in_order/{f}") for f in fixtures])
    decode = per_elem("ingest_decode/metadata")
    proc = per_elem("processor/metadata")
    enc = span_bytes_per("otlp_encode/metadata", 512)
    whole = per_elem("stages_per_event/metadata")
    budget = 1e9 / EVENTS_PER_CORE
    rows = [
        ("decode `EventBatch` (receiver)", decode, 1.0),
        ("sequencer + correlator (in order, 4 fixtures)", seq_corr, 1.0),
        ("span processor (default config), per span", proc, spans_per_event),
        ("OTLP encode, per span", enc, spans_per_event),
    ]
    lines.append(
        f"Per-event CPU of the in-process stages (metadata capture; {spans_per_event:.3f} spans per event, "
        f"from the throughput run), against the budget of {fmt_ns(budget)} per event that "
        f"{EVENTS_PER_CORE // 1000}k events/s per core allows:"
    )
    lines.append("")
    lines.append("| stage | per unit | units per event | per event | share of budget |")
    lines.append("|---|---:|---:|---:|---:|")
    total = 0.0
    for name, unit, mult in rows:
        if unit is None:
            continue
        per_event = unit * mult
        total += per_event
        lines.append(
            f"| {name} | {fmt_ns(unit)} | {mult:.3f} | {fmt_ns(per_event)} | {per_event / budget * 100:.0f} % |"
        )
    lines.append(f"| **sum** | | | **{fmt_ns(total)}** | {total / budget * 100:.0f} % |")
    if whole:
        lines.append(
            f"| `stages_per_event/metadata` (all of the above in one loop) | | | {fmt_ns(whole)} "
            f"({fmt_rate(1e9 / whole)}) | {whole / budget * 100:.0f} % |"
        )
    lines.append("")
    return lines


# ---------------------------------------------------------------- hook cost


def load_jsons(pattern: str) -> List[Dict[str, Any]]:
    out = []
    for path in sorted(glob.glob(pattern)):
        with open(path, encoding="utf-8") as f:
            out.append(json.load(f))
    return out


def hook_stat(runs: List[Dict[str, Any]], variant: str, hook: str, stat: str) -> Optional[float]:
    return med([r["variants"].get(variant, {}).get(hook, {}).get(stat) for r in runs])


def hook_tables(ours_runs: List[Dict[str, Any]], otel_runs: List[Dict[str, Any]]) -> List[str]:
    if not ours_runs:
        return ["(no hook-cost results)"]
    hooks = ours_runs[0]["hooks"]
    lines = [
        f"{len(ours_runs)} run(s) with the e2e venv (ours, noop, queue), {len(otel_runs)} with "
        f"target/bench-venv (otel, otel_attrs, noop); {ours_runs[0]['iterations']} timed calls per hook "
        f"and variant (OpenTelemetry: {otel_runs[0]['iterations'] if otel_runs else '–'}), in chunks of "
        f"{ours_runs[0]['chunk']}; medians over the runs. Per-call times include the "
        f"`perf_counter_ns` pair (timer median {fmt_ns(hook_stat(ours_runs, 'timer', '*', 'median_ns'))}) "
        f"and the `**kwargs` dict that Hermes' call builds.",
        "",
        "| hook | ours median | ours p99 | ours p99.9 | (a) noop median | ours − (a) | (b) SimpleQueue.put median "
        "| (c) OTel span median | (c) with attributes | (c) / ours | (c − a) / (ours − a) | (c) p99 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    sparse_lines = [
        "",
        "Ours in bursts of 16 calls with the sender idle in between (`ours@16`, as in a Hermes turn):",
        "",
        "| hook | median | p99 | p99.9 | (a) noop median | median − (a) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    verdict = {"median": True, "p99": True, "ratio": True, "median_net": True}
    for hook in hooks:
        o_med = hook_stat(ours_runs, "ours", hook, "median_ns")
        o_p99 = hook_stat(ours_runs, "ours", hook, "p99_ns")
        o_p999 = hook_stat(ours_runs, "ours", hook, "p999_ns")
        noop = hook_stat(ours_runs, "noop", hook, "median_ns")
        q = hook_stat(ours_runs, "queue", hook, "median_ns")
        otel = hook_stat(otel_runs, "otel", hook, "median_ns")
        otel_p99 = hook_stat(otel_runs, "otel", hook, "p99_ns")
        otel_attrs = hook_stat(otel_runs, "otel_attrs", hook, "median_ns")
        ratio = otel / o_med if otel and o_med else None
        net = o_med - noop if o_med is not None and noop is not None else None
        otel_noop = hook_stat(otel_runs, "noop", hook, "median_ns")
        net_ratio = (
            (otel - otel_noop) / net if otel and otel_noop is not None and net and net > 0 else None
        )
        if net_ratio is not None:
            verdict["net_ratio"] = verdict.get("net_ratio", True) and net_ratio >= HOOK_RATIO
        if o_med is not None:
            verdict["median"] &= o_med <= HOOK_MEDIAN_NS
        if net is not None:
            verdict["median_net"] &= net <= HOOK_MEDIAN_NS
        if o_p99 is not None:
            verdict["p99"] &= o_p99 <= HOOK_P99_NS
        if ratio is not None:
            verdict["ratio"] &= ratio >= HOOK_RATIO
        lines.append(
            f"| `{hook}` | {fmt_ns(o_med)} | {fmt_ns(o_p99)} | {fmt_ns(o_p999)} | {fmt_ns(noop)} | "
            f"{fmt_ns(net)} | {fmt_ns(q)} | {fmt_ns(otel)} | {fmt_ns(otel_attrs)} | "
            f"{f'{ratio:.1f}×' if ratio else '–'} | {f'{net_ratio:.0f}×' if net_ratio else '–'} | {fmt_ns(otel_p99)} |"
        )
        s_med = hook_stat(ours_runs, "ours@16", hook, "median_ns")
        s_p99 = hook_stat(ours_runs, "ours@16", hook, "p99_ns")
        if s_med is not None:
            verdict["sparse_median"] = verdict.get("sparse_median", True) and s_med <= HOOK_MEDIAN_NS
            verdict["sparse_p99"] = verdict.get("sparse_p99", True) and (s_p99 or 0) <= HOOK_P99_NS
            sparse_lines.append(
                f"| `{hook}` | {fmt_ns(s_med)} | {fmt_ns(s_p99)} | "
                f"{fmt_ns(hook_stat(ours_runs, 'ours@16', hook, 'p999_ns'))} | {fmt_ns(noop)} | "
                f"{fmt_ns(s_med - noop if noop is not None else None)} |"
            )
    if len(sparse_lines) > 5:
        lines += sparse_lines
    lines.append("")
    cold_hooks = sorted({h for r in ours_runs for h in r.get("cold", {}).get("ours", {})})
    if cold_hooks:
        gap = ours_runs[0].get("cold_gap_ms")

        def cold(runs: List[Dict[str, Any]], variant: str, hook: str, part: str, stat: str) -> Optional[float]:
            return med([r.get("cold", {}).get(variant, {}).get(hook, {}).get(part, {}).get(stat) for r in runs])

        lines += [
            "",
            f"Cold calls: bursts of 4 calls, each burst after a {gap:g} ms sleep of the calling thread "
            "(as between model and tool calls in a turn); first call of the burst vs the other three:",
            "",
            "| hook | ours first: median / p99 | noop first | queue first | OTel first | ours rest: median / p99 | noop rest |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for hook in cold_hooks:
            lines.append(
                f"| `{hook}` | {fmt_ns(cold(ours_runs, 'ours', hook, 'first', 'median_ns'))} / "
                f"{fmt_ns(cold(ours_runs, 'ours', hook, 'first', 'p99_ns'))} | "
                f"{fmt_ns(cold(ours_runs, 'noop', hook, 'first', 'median_ns'))} | "
                f"{fmt_ns(cold(ours_runs, 'queue', hook, 'first', 'median_ns'))} | "
                f"{fmt_ns(cold(otel_runs, 'otel', hook, 'first', 'median_ns'))} | "
                f"{fmt_ns(cold(ours_runs, 'ours', hook, 'rest', 'median_ns'))} / "
                f"{fmt_ns(cold(ours_runs, 'ours', hook, 'rest', 'p99_ns'))} | "
                f"{fmt_ns(cold(ours_runs, 'noop', hook, 'rest', 'median_ns'))} |"
            )
    lines.append("")
    lines.append("Amortized cost per call, whole chunks timed as one block (includes the GIL time the "
                 "shim's sender thread and the OTel export thread take while the chunk runs):")
    lines.append("")
    lines.append("| hook | ours | (a) noop | (b) queue | (c) OTel | (c) with attributes |")
    lines.append("|---|---:|---:|---:|---:|---:|")
    for hook in hooks:
        lines.append(
            f"| `{hook}` | {fmt_ns(hook_stat(ours_runs, 'ours', hook, 'block_mean_ns'))} | "
            f"{fmt_ns(hook_stat(ours_runs, 'noop', hook, 'block_mean_ns'))} | "
            f"{fmt_ns(hook_stat(ours_runs, 'queue', hook, 'block_mean_ns'))} | "
            f"{fmt_ns(hook_stat(otel_runs, 'otel', hook, 'block_mean_ns'))} | "
            f"{fmt_ns(hook_stat(otel_runs, 'otel_attrs', hook, 'block_mean_ns'))} |"
        )
    lines.append("")
    stats = [r.get("ours_stats", {}) for r in ours_runs]
    lines.append(
        "Shim counters after each run (enqueued / dropped): "
        + ", ".join(f"{s.get('enqueued')}/{s.get('dropped')}" for s in stats)
    )
    lines.append("")
    lines.append("| target | result |")
    lines.append("|---|---|")
    lines.append(f"| median ≤ 1 µs per call, every hook (raw, as timed) | {ok(verdict['median'])} |")
    lines.append(f"| median ≤ 1 µs per call, every hook, above the no-op callback (a) | {ok(verdict['median_net'])} |")
    lines.append(f"| p99 ≤ 5 µs, every hook (back-to-back calls) | {ok(verdict['p99'])} |")
    if "sparse_p99" in verdict:
        lines.append(f"| median ≤ 1 µs, every hook, bursts of 16 (raw) | {ok(verdict['sparse_median'])} |")
        lines.append(f"| p99 ≤ 5 µs, every hook, bursts of 16 | {ok(verdict['sparse_p99'])} |")
    lines.append(f"| ≥ 20× below (c) (median), every hook | {ok(verdict['ratio'])} |")
    if "net_ratio" in verdict:
        lines.append(
            f"| ≥ 20× below (c), every hook, each above its no-op callback (a) | {ok(verdict['net_ratio'])} |"
        )
    lines.append("")
    return lines


# ---------------------------------------------------------------- collector


def collector_tables(load: Dict[str, Any]) -> List[str]:
    m = load.get("medians", {})
    lines: List[str] = [f"Medians over {load.get('repeats')} repeat(s); machine load (1/5/15 min) at each run in the last column.", ""]
    t = m.get("throughput")
    if t:
        epc = t.get("events_per_cpu_second")
        lines += [
            "| metric | value | target | ratio to target | result |",
            "|---|---:|---:|---:|---|",
            f"| events/s (wall, loadgen start → last span at the sink) | {fmt_rate(t.get('events_per_second'))} | | | |",
            f"| events/s acknowledged (loadgen's own figure) | {fmt_rate(t.get('loadgen_events_per_second'))} | | | |",
            f"| collector CPU seconds | {t.get('collector_cpu_seconds'):.2f} s for {t.get('events'):.0f} events, {t.get('spans'):.0f} spans | | | |",
            f"| **events per CPU-second** (content off) | **{fmt_rate(epc)}** | {fmt_rate(EVENTS_PER_CORE)} | "
            f"{epc / EVENTS_PER_CORE:.2f} | {ok(epc >= EVENTS_PER_CORE)} |",
            f"| RSS right after the run (high-water mark) | {t.get('rss_after_mib'):.1f} MiB ({t.get('hwm_mib'):.1f} MiB) | | | |",
            "",
            "Loads: " + "; ".join(str(x) for x in t.get("loads", [])),
            "",
        ]
    lines += ["| RSS | MiB (median) | high-water | per open turn | target | result | loads |", "|---|---:|---:|---:|---:|---|---|"]
    idle = m.get("idle")
    if idle:
        lines.append(
            f"| idle | {idle['rss_mib']:.1f} | {idle['hwm_mib']:.1f} | | ≤ {RSS_IDLE_MIB} | {ok(idle['rss_mib'] <= RSS_IDLE_MIB)} | {'; '.join(map(str, idle.get('loads', [])))} |"
        )
    for key, label, target in (
        ("open_turns_1000", "1 000 open turns", None),
        ("open_turns_10000", "10 000 open turns", RSS_10K_MIB),
        ("open_turns_10000_content", "10 000 open turns, capture=content", RSS_10K_MIB),
    ):
        o = m.get(key)
        if not o:
            continue
        lines.append(
            f"| {label} (open_turns metric {o.get('open_turns_metric'):.0f}) | {o['rss_mib']:.1f} | {o['hwm_mib']:.1f} | "
            f"{o['bytes_per_turn'] / 1024:.1f} KiB | {'≤ ' + str(target) if target else ''} | "
            f"{ok(o['rss_mib'] <= target) if target else ''} | {'; '.join(map(str, o.get('loads', [])))} |"
        )
    lines.append("")
    limit = BATCH_TIMEOUT_MS + DELAY_SLACK_MS
    lines += [
        "| delay capture → arrival at the OTLP sink | events/s | spans | p50 | p99 | p99.9 | max | roots p99 | target p99 | result | loads |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for key in sorted((k for k in m if k.startswith("delay_")), key=lambda k: float(k[len("delay_x"):])):
        d = m[key]
        delay = d.get("delay") or {}
        root = d.get("root_delay") or {}
        p99 = delay.get("p99_ms")
        lines.append(
            f"| {d.get('instances'):.0f} agents, recorded gaps ÷ {d.get('speed'):g} | {fmt_rate(d.get('events_per_second'))} | {d.get('spans'):.0f} | "
            f"{delay.get('p50_ms'):.0f} ms | {p99:.0f} ms | {delay.get('p999_ms'):.0f} ms | {delay.get('max_ms'):.0f} ms | "
            f"{root.get('p99_ms'):.0f} ms | ≤ {limit} ms | {ok(p99 <= limit)} | {'; '.join(map(str, d.get('loads', [])))} |"
        )
    lines.append("")
    return lines


def main() -> None:
    results = sys.argv[1] if len(sys.argv) > 1 else "."
    out: List[str] = []
    machine = os.path.join(results, "machine.txt")
    if os.path.exists(machine):
        with open(machine, encoding="utf-8") as f:
            out += ["## Machine", "", "```text", f.read().rstrip(), "```", ""]
    load_path = os.path.join(results, "collector_load.json")
    load: Dict[str, Any] = {}
    if os.path.exists(load_path):
        with open(load_path, encoding="utf-8") as f:
            try:
                load = json.load(f)
            except json.JSONDecodeError:
                load = {}
    t = load.get("medians", {}).get("throughput") or {}
    spans_per_event = (t.get("spans") or 0) / t["events"] if t.get("events") else 0.397
    out += ["## Hook cost in the agent process", ""]
    out += hook_tables(load_jsons(os.path.join(results, "hook_ours_*.json")), load_jsons(os.path.join(results, "hook_otel_*.json")))
    out += ["## Collector: throughput, memory, delay", ""]
    out += collector_tables(load) if load else ["(no collector load results)", ""]
    out += ["## Criterion micro-benchmarks", ""]
    out += criterion_tables(criterion(results), spans_per_event)
    print("\n".join(out))


if __name__ == "__main__":
    main()
