#!/usr/bin/env python3
"""Agent stall: turn latency added by our plugin when the collector is down
or hung, or up with its OTLP backend down, hung, failing (503) or slow,
against a healthy run.

Runs the real three-turn AIAgent session of benches/session_cost.py (same
child process, same scripted server, a fresh HERMES_HOME per process, our
plugin at its default level `metadata`) under each condition:

  healthy             collector up, exporting to hermes-bench-sink
  healthy_b           the same, as a separate condition: healthy_b - healthy
                      is a direct A/A estimate of the noise
  no_plugin           no plugin enabled (reference: what the plugin costs at all)
  collector_down      HERMES_COLLECTOR_ENDPOINT is a closed port (connection refused)
  collector_hung      HERMES_COLLECTOR_ENDPOINT accepts TCP and never answers
  backend_down        collector up, its OTLP/gRPC endpoint a closed port
  backend_hung        collector up, its OTLP/gRPC endpoint accepts TCP and never answers
  backend_503         collector up, OTLP/HTTP backend answering 503 to every export
  backend_slow        collector up, OTLP/HTTP backend answering 200 after --slow-s

Child processes of all conditions are interleaved, shuffled per round,
--rounds rounds; each runs --sessions-per-process sessions (the first is
"cold": first session of the process; the rest "warm"). The child runs
without the hook instrumentation (--no-instrument): only per-turn wall time
(time.perf_counter_ns around each run_conversation call) and the process's
exit delay (from the last turn's end to process exit, which includes the
plugin's bounded exit flush) are used.

Per condition, turn and phase: the median turn wall time and the difference
of medians to `healthy`, with a 95 % bootstrap interval of that difference
(resampling both groups, 4000 draws, fixed seed). Prints one JSON object;
benches/report.py turns it into tables.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import time
from typing import Any, Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import session_cost as sc  # noqa: E402

CONDITIONS = [
    "healthy",
    "healthy_b",
    "no_plugin",
    "collector_down",
    "collector_hung",
    "backend_down",
    "backend_hung",
    "backend_503",
    "backend_slow",
]


def bootstrap_diff(a: List[float], b: List[float], draws: int = 4000, seed: int = 7) -> Dict[str, float]:
    """Median(b) - median(a), with a 95 % percentile bootstrap interval."""
    rng = random.Random(seed)
    diffs = []
    for _ in range(draws):
        ra = [a[rng.randrange(len(a))] for _ in a]
        rb = [b[rng.randrange(len(b))] for _ in b]
        diffs.append(statistics.median(rb) - statistics.median(ra))
    diffs.sort()
    return {
        "diff": statistics.median(b) - statistics.median(a),
        "lo": diffs[int(0.025 * draws)],
        "hi": diffs[int(0.975 * draws) - 1],
    }


def summarize(runs: Dict[str, List[Dict[str, Any]]]) -> Dict[str, Any]:
    """Per condition and phase: turn walls (ms), session sums, exit delays,
    each with the difference to `healthy`."""

    def series(cond: str, phase: str) -> Dict[str, List[float]]:
        out: Dict[str, List[float]] = {"turn1": [], "turn2": [], "turn3": [], "session": []}
        for pr in runs[cond]:
            for s in pr["sessions"]:
                if (phase == "cold") != (s["session_index"] == 0):
                    continue
                walls = [t["wall_ns"] / 1e6 for t in s["turns"]]
                for i, w in enumerate(walls):
                    out[f"turn{i + 1}"].append(w)
                out["session"].append(sum(walls))
        return out

    summary: Dict[str, Any] = {}
    base = {ph: series("healthy", ph) for ph in ("cold", "warm")}
    base_exit = [pr["exit_delay_s"] * 1e3 for pr in runs["healthy"]]
    for cond in runs:
        entry: Dict[str, Any] = {}
        for ph in ("cold", "warm"):
            ser = series(cond, ph)
            entry[ph] = {}
            for key, vals in ser.items():
                if not vals:
                    continue
                e = {
                    "n": len(vals),
                    "median_ms": statistics.median(vals),
                    "p90_ms": sc.pct(vals, 0.9),
                    "iqr_ms": (sc.pct(vals, 0.75) or 0) - (sc.pct(vals, 0.25) or 0),
                }
                if cond != "healthy" and base[ph][key]:
                    e["vs_healthy"] = bootstrap_diff(base[ph][key], vals)
                entry[ph][key] = e
        exits = [pr["exit_delay_s"] * 1e3 for pr in runs[cond]]
        entry["exit_delay"] = {"median_ms": statistics.median(exits), "p90_ms": sc.pct(exits, 0.9)}
        if cond != "healthy":
            entry["exit_delay"]["vs_healthy"] = bootstrap_diff(base_exit, exits)
        stats = [pr["done"].get("shim_stats") for pr in runs[cond] if pr["done"].get("shim_stats")]
        if stats:
            last = stats[-1]
            entry["shim_stats_last"] = {
                k: last.get(k)
                for k in ("enqueued", "dropped", "acked_events", "unacked_batches", "connected", "last_error", "sent_batches")
                if k in last
            }
        summary[cond] = entry
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sc.add_common_args(ap, rounds=12, seed=2)
    ap.add_argument("--conditions", default=",".join(CONDITIONS))
    ap.add_argument("--slow-s", type=float, default=5.0, help="answer delay of the slow backend")
    args = sc.parse_common_args(ap)
    conditions = [c.strip() for c in args.conditions.split(",") if c.strip()]
    for c in conditions:
        if c not in CONDITIONS:
            raise SystemExit(f"unknown condition {c}")
    if "healthy" not in conditions:
        raise SystemExit("the healthy condition is the reference: keep it")

    work, logdir = sc.work_dirs("agent-stall-", args.logdir)
    sc.log(f"agent_stall: work dir {work}; load {sc.loadavg()}")
    homes = sc.Homes(args.venv, args.shim_path, work, [None, "hermes_collector"])

    # Everything the conditions need, started once and kept up for the run.
    closers: List[Any] = []
    collectors: Dict[str, sc.Collector] = {}
    endpoints: Dict[str, str] = {}
    backends: Dict[str, Any] = {}
    try:
        if "healthy" in conditions or "healthy_b" in conditions:
            collectors["healthy"] = sc.Collector(args.bins, logdir, "stall-healthy", sink=True)
            endpoints["healthy"] = endpoints["healthy_b"] = collectors["healthy"].endpoint
        if "collector_down" in conditions:
            endpoints["collector_down"] = f"http://127.0.0.1:{sc.free_port()}"
        if "collector_hung" in conditions:
            hole = sc.Blackhole()
            backends["collector_hung"] = hole
            endpoints["collector_hung"] = hole.endpoint
        if "backend_down" in conditions:
            collectors["backend_down"] = sc.Collector(
                args.bins, logdir, "stall-backend-down", otlp_endpoint=f"http://127.0.0.1:{sc.free_port()}")
        if "backend_hung" in conditions:
            hole = sc.Blackhole()
            backends["backend_hung"] = hole
            collectors["backend_hung"] = sc.Collector(args.bins, logdir, "stall-backend-hung", otlp_endpoint=hole.endpoint)
        if "backend_503" in conditions:
            rcv = sc.OtlpHttpReceiver("503")
            backends["backend_503"] = rcv
            collectors["backend_503"] = sc.Collector(
                args.bins, logdir, "stall-backend-503", otlp_endpoint=rcv.endpoint, otlp_protocol="http/protobuf")
        if "backend_slow" in conditions:
            rcv = sc.OtlpHttpReceiver("slow", args.slow_s)
            backends["backend_slow"] = rcv
            collectors["backend_slow"] = sc.Collector(
                args.bins, logdir, "stall-backend-slow", otlp_endpoint=rcv.endpoint, otlp_protocol="http/protobuf")
        for name, coll in collectors.items():
            if name != "healthy":
                endpoints[name] = coll.endpoint

        rng = random.Random(args.seed)
        runs: Dict[str, List[Dict[str, Any]]] = {c: [] for c in conditions}
        loads = [sc.loadavg()]
        t0 = time.time()
        for r in range(args.rounds):
            order = conditions[:]
            rng.shuffle(order)
            for cond in order:
                if cond == "no_plugin":
                    plugin, extra = None, {}
                else:
                    plugin = "hermes_collector"
                    extra = {
                        "HERMES_COLLECTOR_ENDPOINT": endpoints[cond],
                        "HERMES_COLLECTOR_SERVICE_NAME": "hermes-bench",
                        "HERMES_COLLECTOR_CAPTURE": "metadata",
                    }
                pdir = os.path.join(work, f"r{r}-{cond}")
                res = sc.run_child(homes, plugin, extra, args.sessions_per_process, pdir, instrument=False)
                res["round"] = r
                runs[cond].append(res)
                shutil.rmtree(pdir, ignore_errors=True)
            loads.append(sc.loadavg())
            sc.log(f"agent_stall: round {r + 1}/{args.rounds} done ({time.time() - t0:.0f} s, load {loads[-1]})")
    finally:
        coll_stats = {name: c.stop() for name, c in collectors.items()}
        backend_stats: Dict[str, Any] = {}
        for name, b in backends.items():
            backend_stats[name] = b.stop()

    result = {
        **sc.result_header("agent_stall", args),
        "conditions": conditions,
        "slow_s": args.slow_s,
        "queries": sc.QUERIES,
        "loads": loads,
        "seconds": time.time() - t0,
        "collectors": coll_stats,
        "backends": backend_stats,
        "summary": summarize(runs),
        "raw": {
            c: [
                {
                    "round": pr["round"],
                    "exit_delay_s": pr["exit_delay_s"],
                    "process_wall_s": pr["process_wall_s"],
                    "turns_ms": [[t["wall_ns"] / 1e6 for t in s["turns"]] for s in pr["sessions"]],
                    "shim_stats": pr["done"].get("shim_stats"),
                }
                for pr in runs[c]
            ]
            for c in conditions
        },
    }
    print(json.dumps(result))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
