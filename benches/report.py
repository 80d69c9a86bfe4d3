#!/usr/bin/env python3
"""Turns the outputs of benches/run.sh into the Markdown tables of
docs/BENCHMARKS.md (stdlib only).

  report.py RESULTS_DIR

RESULTS_DIR holds: machine.txt, criterion/<pass>/... (copies of
target/criterion after each pass), hook_ours_<n>.json, hook_otel_<n>.json,
collector_load.json, session_cost.json (benches/session_cost.py),
agent_stall.json (benches/agent_stall.py); any of them may be missing. Every number is the median over the repeats/passes found.
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


def read_json(path: str) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def load_jsons(pattern: str) -> List[Dict[str, Any]]:
    """Every result matching `pattern`, in path order."""
    return [read_json(path) for path in sorted(glob.glob(pattern))]


def load_json(path: str) -> Optional[Dict[str, Any]]:
    """The result at `path`; None where it is missing or not JSON."""
    if not os.path.exists(path):
        return None
    try:
        return read_json(path)
    except json.JSONDecodeError:
        return None


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
        "| hook | median | p99 | p99.9 | (a) noop median | median − (a) | (a) in bursts (`noop@16`): median | p99 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
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
                f"{fmt_ns(s_med - noop if noop is not None else None)} | "
                f"{fmt_ns(hook_stat(ours_runs, 'noop@16', hook, 'median_ns'))} | "
                f"{fmt_ns(hook_stat(ours_runs, 'noop@16', hook, 'p99_ns'))} |"
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
        def rate_row(metric: str, note: str, r: Dict[str, Any], value_note: str = "") -> str:
            """A row of events per CPU-second against the target."""
            e = r.get("events_per_cpu_second")
            return (f"| **{metric}**{note} | **{fmt_rate(e)}**{value_note} | {fmt_rate(EVENTS_PER_CORE)} | "
                    f"{e / EVENTS_PER_CORE:.2f} | {ok(e >= EVENTS_PER_CORE)} |")

        lines += [
            "| metric | value | target | ratio to target | result |",
            "|---|---:|---:|---:|---|",
            f"| events/s (wall, loadgen start → last span at the sink) | {fmt_rate(t.get('events_per_second'))} | | | |",
            f"| events/s acknowledged (loadgen's own figure) | {fmt_rate(t.get('loadgen_events_per_second'))} | | | |",
            f"| collector CPU seconds | {t.get('collector_cpu_seconds'):.2f} s for {t.get('events'):.0f} events, {t.get('spans'):.0f} spans | | | |",
            rate_row("events per CPU-second", " (content off)", t),
            f"| RSS right after the run (high-water mark) | {t.get('rss_after_mib'):.1f} MiB ({t.get('hwm_mib'):.1f} MiB) | | | |",
        ]
        workers = m.get("throughput_workers")
        if workers:
            lines.append(rate_row("events per CPU-second, the pipeline on the worker threads",
                                  " (`runtime.pipeline: workers`)", workers,
                                  f" ({fmt_rate(workers.get('events_per_second'))} wall)"))
        warm = m.get("throughput_warm")
        if warm:
            lines.append(rate_row(
                "events per CPU-second, third round on one collector",
                f" (first round {fmt_rate(warm.get('first_round_events_per_cpu_second'))}; system CPU in the third "
                f"round {warm.get('collector_system_seconds'):.2f} s)",
                warm))
        lines += [
            "",
            "Loads: " + "; ".join(str(x) for x in t.get("loads", [])),
            "",
        ]
    relay, gz = m.get("relay"), m.get("throughput_gzip")
    if relay:
        # Per span: the collector's spans come from ≈ 2.5 events each, the
        # relay's arrive as spans.
        lines += [
            "The field's anchor: rotel (a Rust OpenTelemetry collector) relaying the same spans over OTLP/gRPC "
            "(`hermes-bench-driver otlp` → rotel → sink; its exporter always gzips, so ours is also shown gzipping):",
            "",
            "| collector | input | CPU seconds | spans per CPU-second | ratio to rotel | events per CPU-second | RSS after (high-water) | loads |",
            "|---|---|---:|---:|---:|---:|---:|---|",
        ]
        rs = relay.get("spans_per_cpu_second")

        def relay_row(label: str, what: str, r: Dict[str, Any], cpu_key: str, events: bool) -> str:
            sp = r.get("spans_per_cpu_second")
            ratio = f"{sp / rs:.2f}" if sp and rs else ""
            ev = fmt_rate(r.get("events_per_cpu_second")) if events else "–"
            return (f"| {label} | {what} | {r.get(cpu_key):.2f} s | {fmt_rate(sp)} | {ratio} | {ev} | "
                    f"{r.get('rss_after_mib'):.1f} MiB ({r.get('hwm_mib'):.1f} MiB) | {'; '.join(map(str, r.get('loads', [])))} |")

        lines.append(relay_row(
            "rotel 0.0.1-alpha10 (relay: OTLP in, batch, OTLP out, gzip)",
            f"{relay.get('spans'):.0f} spans in {relay.get('requests'):.0f} requests ({relay.get('spans_at_sink'):.0f} at the sink)",
            relay, "relay_cpu_seconds", False))
        if gz:
            lines.append(relay_row(
                "ours, exporter gzip", f"{gz.get('events'):.0f} events → {gz.get('spans'):.0f} spans",
                gz, "collector_cpu_seconds", True))
        if t and t.get("spans_per_cpu_second"):
            lines.append(relay_row(
                "ours, defaults (no compression)", f"{t.get('events'):.0f} events → {t.get('spans'):.0f} spans",
                t, "collector_cpu_seconds", True))
        lines.append("")
    floors = [(k, m[k]) for k in ("floor_full", "floor_views", "floor_seqs") if m.get(k)]
    if floors:
        lines += [
            "The ingest alone under the same load (`hermes-bench-floor`: gRPC receive, decode, acknowledge, drop):",
            "",
            "| ingest floor | CPU per event | events per CPU-second | share of the collector's CPU per event | loads |",
            "|---|---:|---:|---:|---|",
        ]
        for key, f in floors:
            us = f.get("cpu_us_per_event")
            epc = (t or {}).get("events_per_cpu_second")
            whole = 1e6 / epc if epc else None
            share = f"{100 * us / whole:.0f} %" if us and whole else ""
            label = {
                "floor_full": "decoding every field into owned messages (as the collector does)",
                "floor_views": "reading every field into borrowed views (no allocation per field)",
                "floor_seqs": "decoding only the seqs",
            }[key]
            lines.append(
                f"| {label} | {us:.2f} µs | {fmt_rate(f.get('events_per_cpu_second'))} | {share} | {'; '.join(map(str, f.get('loads', [])))} |"
            )
        lines.append("")
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
    if idle and idle.get("cpu_us_per_second") is not None:
        lines += [
            "",
            f"An idle collector (no connection, 10 s): {idle['cpu_us_per_second']:.0f} µs of CPU and "
            f"{idle['wakeups_per_second']:.0f} wake-ups per second, all threads.",
        ]
    lines.append("")
    limit = BATCH_TIMEOUT_MS + DELAY_SLACK_MS
    lines += [
        "| delay capture → arrival at the OTLP sink | sender | events/s | events per batch | collector CPU (share of a core; per event) | spans | p50 | p99 | p99.9 | max | roots p99 | target p99 | result | loads |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    runs = load.get("runs", {})
    for key in sorted((k for k in m if k.startswith("delay_")), key=lambda k: float(k[len("delay_x"):])):
        d = m[key]
        delay = d.get("delay") or {}
        root = d.get("root_delay") or {}
        p99 = delay.get("p99_ms")
        sender = (runs.get(key) or [{}])[0].get("sender", "batched")
        per_batch = d["events"] / d["batches"] if d.get("batches") else None
        cpu = d.get("collector_cpu_seconds")
        share = d.get("collector_cpu_share")
        cpu_text = (
            f"{share * 100:.0f} %; {cpu / d['events'] * 1e6:.0f} µs"
            if share is not None and cpu is not None and d.get("events") else "–"
        )
        lines.append(
            f"| {d.get('instances'):.0f} agents, recorded gaps ÷ {d.get('speed'):g} | {sender} | {fmt_rate(d.get('events_per_second'))} | "
            f"{f'{per_batch:.1f}' if per_batch else '–'} | "
            f"{cpu_text} | "
            f"{d.get('spans'):.0f} | "
            f"{delay.get('p50_ms'):.0f} ms | {p99:.0f} ms | {delay.get('p999_ms'):.0f} ms | {delay.get('max_ms'):.0f} ms | "
            f"{root.get('p99_ms'):.0f} ms | ≤ {limit} ms | {ok(p99 <= limit)} | {'; '.join(map(str, d.get('loads', [])))} |"
        )
    lines.append("")
    idle = m.get("idle_sender")
    if idle:
        lines += [
            f"An idle shim sender (four connected senders, no events, {idle.get('seconds', 0):.0f} s; "
            f"`idle_poll_max` {idle.get('idle_poll_max_ms', 0):.0f} ms): "
            f"{idle.get('cpu_us_per_thread_second', 0):.0f} µs of CPU and "
            f"{idle.get('wakeups_per_thread_second', 0):.1f} wake-ups per sender thread per second.",
            "",
        ]
    return lines


# ---------------------------------------------------------------- session cost

SESSION_RATIO = 20  # target: our default level <= 1/20 of the peer's cost

VARIANT_LABELS = {
    "none": "no plugin",
    "noop": "no-op plugin (metadata's hooks, `def f(**kw): pass`)",
    "lean": "ours, `lean`",
    "metadata": "ours, `metadata` (default)",
    "content": "ours, `content`",
    "otel": "hermes-plugin-otel-tracing (OTLP/HTTP, its defaults)",
    "otel_quiet": "hermes-plugin-otel-tracing (no content, no log file)",
}


def fmt_us(ns: Optional[float]) -> str:
    if ns is None:
        return "–"
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    return f"{ns / 1e3:.0f} µs" if ns >= 1e5 else f"{ns / 1e3:.1f} µs"


def session_tables(d: Dict[str, Any]) -> List[str]:
    summ = d["summary"]
    variants = [v for v in d["variants"] if v in summ]
    spp = d.get("sessions_per_process", 1)
    lines = [
        f"{d['rounds']} child processes per variant, interleaved in a shuffled order per round, "
        f"{spp} sessions of 3 turns each per process (first = cold, the others warm); "
        f"{d['rounds'] * max(spp - 1, 0)} warm and {d['rounds']} cold sessions per variant; "
        f"{d.get('seconds', 0) / 60:.0f} min; Python {d.get('python', '?')}; "
        f"load before/after: {d['loads'][0]} / {d['loads'][-1]}. A session: 4 model calls, 1 tool call "
        f"(`terminal`, `echo turn-two`). Agent thread = the thread that runs `run_conversation`.",
        "",
    ]
    calib = [summ[v].get("calib_wall_ns") for v in variants]
    calib_cpu = [summ[v].get("calib_cpu_ns") for v in variants]
    lines.append(
        f"Instrumentation floor (an empty timed region, counted in every call below): "
        f"{fmt_ns(med(calib))} wall, {fmt_ns(med(calib_cpu))} thread CPU (`thread_time_ns` is a system call here)."
    )
    lines.append("")
    for phase, title in (("warm", "Warm sessions (2nd and later session of a process)"),
                         ("cold", "Cold sessions (1st session of a process)")):
        lines += [
            f"{title}, per session, agent thread, median (p90):",
            "",
            "| variant | hooks registered | dispatch calls | dispatch wall | payload building wall | **total wall** | total thread CPU | other threads' CPU during the session | session wall time |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for v in variants:
            ph = summ[v].get(phase)
            if not ph:
                continue
            ps = ph["per_session"]

            def mp(key: str) -> str:
                e = ps.get(key) or {}
                return f"{fmt_us(e.get('median'))} ({fmt_us(e.get('p90'))})"

            lines.append(
                f"| {VARIANT_LABELS.get(v, v)} | {len(summ[v].get('hooks_registered', {}))} | "
                f"{ps['dispatch_calls']['median']:.0f} + {ps['payload_calls']['median']:.0f} payload | "
                f"{mp('dispatch_wall_ns')} | {mp('payload_wall_ns')} | **{mp('total_wall_ns')}** | {mp('total_cpu_ns')} | "
                f"{mp('other_threads_session_cpu_ns')} | {fmt_us(ps['session_wall_ns']['median'])} |"
            )
        lines.append("")

    # Ratios against the peer.
    def tot(v: str, key: str, phase: str = "warm") -> Optional[float]:
        try:
            return summ[v][phase]["per_session"][key]["median"]
        except KeyError:
            return None

    peers = [p for p in ("otel", "otel_quiet") if p in summ]
    ours = [o for o in ("metadata", "lean", "content") if o in summ]
    if peers and ours:
        lines += [
            "Ours against the peer (warm sessions, medians per session, wall). *Total*: dispatch + payload "
            "building, as measured; *above no plugin*: minus the `none` variant (what Hermes dispatches anyway); "
            "*callbacks only*: dispatch minus the `noop` variant's dispatch (what the callbacks themselves cost, "
            "without Hermes' payload building that any plugin registering these hooks triggers):",
            "",
            "| ours | peer | total: ours / peer | ratio | above no plugin: ours / peer | ratio | callbacks only: ours / peer | ratio | ≤ 1/20? (total) |",
            "|---|---|---:|---:|---:|---:|---:|---:|---|",
        ]
        none_t = tot("none", "total_wall_ns") or 0.0
        noop_d = tot("noop", "dispatch_wall_ns")
        for o in ours:
            for p in peers:
                ot, pt = tot(o, "total_wall_ns"), tot(p, "total_wall_ns")
                od, pd = tot(o, "dispatch_wall_ns"), tot(p, "dispatch_wall_ns")
                if ot is None or pt is None:
                    continue
                r_tot = pt / ot if ot else None
                on, pn = ot - none_t, pt - none_t
                r_net = pn / on if on > 0 else None
                if noop_d is not None and od is not None and pd is not None:
                    oc, pcb = od - noop_d, pd - noop_d
                    r_cb = pcb / oc if oc > 0 else None
                    cb = f"{fmt_us(oc)} / {fmt_us(pcb)} | {r_cb:.1f}×" if r_cb else f"{fmt_us(oc)} / {fmt_us(pcb)} | –"
                else:
                    cb = "– | –"
                lines.append(
                    f"| {VARIANT_LABELS.get(o, o)} | {VARIANT_LABELS.get(p, p)} | {fmt_us(ot)} / {fmt_us(pt)} | "
                    f"{r_tot:.1f}× | {fmt_us(on)} / {fmt_us(pn)} | {f'{r_net:.1f}×' if r_net else '–'} | {cb} | "
                    f"{ok(bool(r_tot and r_tot >= SESSION_RATIO))} |"
                )
        lines.append("")

    # Per hook call.
    keys = sorted({k for v in variants for k in summ[v].get("warm", {}).get("per_call", {})},
                  key=lambda k: (k.split(":")[0] != "dispatch", k))
    lines += [
        "Per call on the agent thread, warm sessions, wall median (p90); calls per session in brackets. "
        "`dispatch:` = `PluginManager.invoke_hook` (one `**kwargs` pack + Hermes' loop over the callbacks); "
        "`payload:` = Hermes' payload builders, run only when a plugin registered the hook:",
        "",
        "| call | " + " | ".join(f"`{v}`" for v in variants) + " |",
        "|---|" + "---:|" * len(variants),
    ]
    for k in keys:
        cells = []
        for v in variants:
            h = summ[v].get("warm", {}).get("per_call", {}).get(k)
            cells.append(
                f"{fmt_us(h['wall_median_ns'])} ({fmt_us(h['wall_p90_ns'])}) [{h['calls_per_session']:g}]" if h else "–"
            )
        lines.append(f"| `{k}` | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Other threads' CPU during a warm session, by thread name (median, ns-resolution `/proc/self/task/*/schedstat`; threads alive at the session's end):")
    lines.append("")
    for v in variants:
        byn = summ[v].get("warm", {}).get("other_threads_cpu_ns_by_name", {})
        shown = ", ".join(f"`{n}` {fmt_us(ns)}" for n, ns in sorted(byn.items(), key=lambda x: -x[1]) if ns > 0)
        lines.append(f"* `{v}`: {shown or '–'}")
    lines.append("")
    lines.append(
        "Plugin discovery and load (`discover_and_load`, once per process, median): "
        + ", ".join(f"`{v}` {summ[v].get('discover_wall_ms', 0):.0f} ms" for v in variants)
        + "; process exit after the last turn (median): "
        + ", ".join(f"`{v}` {summ[v].get('exit_delay_ms', {}).get('median', 0):.0f} ms" for v in variants)
        + "."
    )
    coll = d.get("collector", {})
    lines.append(
        f"Collector during the run: {coll.get('hermes_collector_receiver_accepted_events_total', '?'):.0f} events accepted, "
        f"{coll.get('sink_spans', '?')} spans at the sink; peer's OTLP/HTTP receiver: "
        + ", ".join(f"`{p}` {c[0]} requests ({c[1]} B)" for p, c in (d.get("otlp_http_receiver") or {}).items())
        + "."
        if isinstance(coll.get("hermes_collector_receiver_accepted_events_total"), (int, float)) else ""
    )
    lines.append("")
    return lines


# ---------------------------------------------------------------- agent stall

STALL_LABELS = {
    "healthy": "healthy (reference)",
    "healthy_b": "healthy again (A/A: noise)",
    "no_plugin": "no plugin",
    "collector_down": "collector down (connection refused)",
    "collector_hung": "collector hung (accepts TCP, never answers)",
    "backend_down": "backend down (collector up, OTLP/gRPC refused)",
    "backend_hung": "backend hung (collector up, OTLP/gRPC never answers)",
    "backend_503": "backend answers 503 (collector up, OTLP/HTTP)",
    "backend_slow": "backend slow (collector up, OTLP/HTTP 200 after {slow}s)",
}


def fmt_diff(e: Optional[Dict[str, Any]]) -> str:
    v = (e or {}).get("vs_healthy")
    if not v:
        return "–"
    return f"{v['diff']:+.0f} [{v['lo']:+.0f}, {v['hi']:+.0f}]"


def stall_tables(d: Dict[str, Any]) -> List[str]:
    summ = d["summary"]
    conds = [c for c in d["conditions"] if c in summ]
    spp = d.get("sessions_per_process", 1)
    lines = [
        f"{d['rounds']} child processes per condition, interleaved in a shuffled order per round, {spp} sessions "
        f"of 3 turns per process (first = cold); our plugin at `metadata`; no hook instrumentation. "
        f"{d.get('seconds', 0) / 60:.0f} min; load before/after: {d['loads'][0]} / {d['loads'][-1]}. "
        "Cells: difference of the median turn wall time to `healthy`, in ms, with the 95 % bootstrap interval "
        "of that difference in brackets; **within noise** when the interval of the whole session contains 0.",
        "",
    ]
    verdicts: Dict[str, List[bool]] = {}
    for phase, title in (("warm", "Warm sessions"), ("cold", "Cold sessions (first of the process)")):
        base = summ["healthy"][phase]
        if not base:
            # e.g. one session per process: no warm session.
            lines += [f"{title}: none measured.", ""]
            continue
        lines += [
            f"{title}: healthy medians turn 1 / 2 / 3 = {base['turn1']['median_ms']:.0f} / "
            f"{base['turn2']['median_ms']:.0f} / {base['turn3']['median_ms']:.0f} ms "
            f"(IQR {base['turn1']['iqr_ms']:.0f} / {base['turn2']['iqr_ms']:.0f} / {base['turn3']['iqr_ms']:.0f} ms), "
            f"session {base['session']['median_ms']:.0f} ms, n = {base['session']['n']}.",
            "",
            "| condition | turn 1 Δ ms | turn 2 Δ ms | turn 3 Δ ms | session Δ ms | session median | within noise |",
            "|---|---:|---:|---:|---:|---:|---|",
        ]
        for c in conds:
            if c == "healthy":
                continue
            e = summ[c][phase]
            sess = e["session"].get("vs_healthy", {})
            within = sess.get("lo", 1) <= 0 <= sess.get("hi", -1)
            if c not in ("healthy_b", "no_plugin"):
                verdicts.setdefault(c, []).append(within)
            lines.append(
                f"| {STALL_LABELS.get(c, c).format(slow=d.get('slow_s'))} | {fmt_diff(e['turn1'])} | {fmt_diff(e['turn2'])} | "
                f"{fmt_diff(e['turn3'])} | {fmt_diff(e['session'])} | {e['session']['median_ms']:.0f} ms | "
                f"{'yes' if within else 'no'} |"
            )
        lines.append("")
    lines += [
        "Process exit after the last turn (includes the plugin's bounded exit flush), and the shim's counters "
        "at the end of the last process of each condition:",
        "",
        "| condition | exit median | Δ to healthy [95 %] | shim: enqueued / acked / dropped, connected, last error |",
        "|---|---:|---:|---|",
    ]
    for c in conds:
        e = summ[c]
        ex = e["exit_delay"]
        st = e.get("shim_stats_last") or {}
        shim = (
            f"{st.get('enqueued')} / {st.get('acked_events')} / {st.get('dropped')}, {st.get('connected')}, "
            f"{st.get('last_error') or '–'}" if st else "–"
        )
        lines.append(f"| {STALL_LABELS.get(c, c).format(slow=d.get('slow_s'))} | {ex['median_ms']:.0f} ms | {fmt_diff(ex)} | {shim} |")
    lines.append("")
    lines += ["| target | result |", "|---|---|"]
    for c, vs in verdicts.items():
        lines.append(
            f"| added turn latency 0 within noise: {STALL_LABELS.get(c, c).format(slow=d.get('slow_s'))} | "
            f"{ok(all(vs))} |"
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
    load = load_json(os.path.join(results, "collector_load.json")) or {}
    t = load.get("medians", {}).get("throughput") or {}
    spans_per_event = (t.get("spans") or 0) / t["events"] if t.get("events") else 0.397
    out += ["## Hook cost in the agent process", ""]
    out += hook_tables(load_jsons(os.path.join(results, "hook_ours_*.json")), load_jsons(os.path.join(results, "hook_otel_*.json")))
    out += ["## Collector: throughput, memory, delay", ""]
    out += collector_tables(load) if load else ["(no collector load results)", ""]
    out += ["## Criterion micro-benchmarks", ""]
    out += criterion_tables(criterion(results), spans_per_event)
    session = load_json(os.path.join(results, "session_cost.json"))
    if session:
        out += ["## Cost per real session", ""]
        out += session_tables(session)
    stall = load_json(os.path.join(results, "agent_stall.json"))
    if stall:
        out += ["## Agent stall", ""]
        out += stall_tables(stall)
    print("\n".join(out))


if __name__ == "__main__":
    main()
