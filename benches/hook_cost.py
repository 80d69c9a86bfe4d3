#!/usr/bin/env python3
"""Cost of one hook call on the agent's thread, with the recorded kwargs.

For every hook the shim registers that appears in the recorded fixtures
(tests/fixtures/hermes-0.19.0/*.jsonl), calls each variant the way Hermes'
PluginManager.invoke_hook does (``cb(**kwargs)``, synchronously, on the
calling thread), rotating through the recorded calls of that hook, and times
each call with ``time.perf_counter_ns()``. Variants:

  ours        hermes_collector._core.hook_callback(name), registered by
              hermes_collector.register(ctx) with a fake ctx, sending to the
              running collector at HERMES_COLLECTOR_ENDPOINT
  noop        def f(**kw): pass                                  (anchor a)
  queue       queue.SimpleQueue().put(kwargs)                    (anchor b)
  otel        OpenTelemetry SDK: tracer.start_span(name).end(), with a
              BatchSpanProcessor and an OTLP/gRPC exporter to --otlp-endpoint
                                                                 (anchor c)
  otel_attrs  as otel, with the scalar kwargs as span attributes (what an
              in-process tracing plugin records)
  ours@16     'ours' in bursts of 16 calls, each followed by a flush: as in
              Hermes, where a turn fires a few hooks between model and tool
              calls, so the sender is idle when a hook fires
  noop@16     the anchor of ours@16: 'noop' in bursts of 16 calls, each
              followed by a 2 ms sleep of the calling thread (a flush waits
              at least that long: its wait looks every 2 ms), so the first
              call of a burst meets the same cold caches
  timer       nothing between the two clock reads: the timer's own cost,
              included in every other number

Calls run in chunks of --chunk; between chunks (untimed) the variant's
background work is drained (hermes_collector.flush, force_flush, emptying the
queue), so no queue fills up and nothing is dropped. The sender thread of the
shim and the BatchSpanProcessor's worker still compete with the timed calls
for the GIL while a chunk runs, as they would in the agent.

Prints one JSON object: per variant and hook, median, p99, p99.9 and mean
(ns) of the timed calls, and the mean of whole chunks timed as blocks
(no per-call timer overhead).

Run 'ours' with the Python of target/e2e-venv (the shim is installed there)
and 'otel*' with target/bench-venv (OpenTelemetry SDK installed there).
"""

from __future__ import annotations

import argparse
import gc
import glob
import json
import os
import platform
import queue
import sys
import time
from typing import Any, Callable, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "tests", "fixtures", "hermes-0.19.0")

sys.path.insert(0, HERE)
from shim_hooks import METADATA_HOOKS  # noqa: E402


def load_calls(directory: str) -> Dict[str, List[Dict[str, Any]]]:
    """Recorded kwargs per hook, in recording order."""
    calls: Dict[str, List[Dict[str, Any]]] = {}
    for path in sorted(glob.glob(os.path.join(directory, "*.jsonl"))):
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    rec = json.loads(line)
                    calls.setdefault(rec["hook"], []).append(rec["kwargs"])
    return calls


def percentile(sorted_values: List[int], q: float) -> float:
    if not sorted_values:
        return float("nan")
    i = min(len(sorted_values) - 1, max(0, round((len(sorted_values) - 1) * q)))
    return float(sorted_values[i])


class FakeCtx:
    """The part of Hermes' plugin context that register() uses."""

    def __init__(self) -> None:
        self.hooks: Dict[str, Callable[..., Any]] = {}

    def register_hook(self, name: str, callback: Callable[..., Any]) -> None:
        self.hooks[name] = callback


def make_ours() -> tuple:
    os.environ.setdefault("HERMES_COLLECTOR_CAPTURE", "metadata")
    os.environ.setdefault("HERMES_COLLECTOR_SERVICE_NAME", "hermes-bench")
    import hermes_collector  # noqa: PLC0415 (only in the e2e venv)

    ctx = FakeCtx()
    hermes_collector.register(ctx)
    if not ctx.hooks:
        raise SystemExit("hermes_collector registered no hook (HERMES_COLLECTOR_DISABLED?)")

    def drain() -> None:
        if not hermes_collector.flush(10000):
            raise SystemExit(f"hermes_collector.flush timed out: {hermes_collector.stats()}")

    return (lambda hook: ctx.hooks.get(hook)), drain, hermes_collector.stats


def make_noop() -> tuple:
    def f(**kw: Any) -> None:
        pass

    return (lambda hook: f), (lambda: None), None


def make_queue() -> tuple:
    q: "queue.SimpleQueue[Any]" = queue.SimpleQueue()

    def factory(hook: str) -> Callable[..., None]:
        def put(**kwargs: Any) -> None:
            q.put(kwargs)

        return put

    def drain() -> None:
        try:
            while True:
                q.get_nowait()
        except queue.Empty:
            pass

    return factory, drain, None


def make_otel(endpoint: str, with_attrs: bool) -> tuple:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # noqa: PLC0415
        OTLPSpanExporter,
    )
    from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
    from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
    from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415

    provider = TracerProvider(resource=Resource.create({"service.name": "hermes-bench"}))
    exporter = OTLPSpanExporter(endpoint=endpoint, insecure=True)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    tracer = provider.get_tracer("hermes-bench")
    scalar = (str, bool, int, float)

    def factory(hook: str) -> Callable[..., None]:
        if with_attrs:

            def cb(**kw: Any) -> None:
                span = tracer.start_span(
                    hook, attributes={k: v for k, v in kw.items() if isinstance(v, scalar)}
                )
                span.end()

        else:

            def cb(**kw: Any) -> None:
                tracer.start_span(hook).end()

        return cb

    def drain() -> None:
        provider.force_flush(30000)

    return factory, drain, None


# What a flush of ours sleeps at least (SenderShared::wait_settled looks every 2 ms).
SPARSE_SLEEP_S = 0.002


def sleep_after(drain: Callable[[], None], seconds: float) -> Callable[[], None]:
    def drain_and_sleep() -> None:
        drain()
        time.sleep(seconds)

    return drain_and_sleep


def measure(
    cb: Callable[..., Any],
    kwargs_list: List[Dict[str, Any]],
    iterations: int,
    chunk: int,
    drain: Callable[[], None],
) -> Dict[str, float]:
    pc = time.perf_counter_ns
    samples: List[int] = []
    block_ns = 0
    block_calls = 0
    n = len(kwargs_list)
    done = 0
    # Warm-up: one chunk, untimed.
    for i in range(min(chunk, iterations)):
        cb(**kwargs_list[i % n])
    drain()
    while done < iterations:
        todo = min(chunk, iterations - done)
        # Per-call timing.
        for i in range(todo):
            kw = kwargs_list[(done + i) % n]
            t0 = pc()
            cb(**kw)
            t1 = pc()
            samples.append(t1 - t0)
        drain()
        # The same chunk timed as one block.
        t0 = pc()
        for i in range(todo):
            cb(**kwargs_list[(done + i) % n])
        block_ns += pc() - t0
        block_calls += todo
        drain()
        done += todo
    return {**summarize(samples), "block_mean_ns": block_ns / block_calls}


def summarize(samples: List[int]) -> Dict[str, float]:
    samples = sorted(samples)
    return {
        "n": len(samples),
        "median_ns": percentile(samples, 0.5),
        "p99_ns": percentile(samples, 0.99),
        "p999_ns": percentile(samples, 0.999),
        "max_ns": float(samples[-1]),
        "mean_ns": sum(samples) / len(samples),
    }


def measure_cold(
    cb: Callable[..., Any],
    kwargs_list: List[Dict[str, Any]],
    bursts: int,
    gap_s: float,
    burst: int = 4,
) -> Dict[str, Any]:
    """Bursts of `burst` calls, each after sleeping `gap_s` (the agent waits
    for the model or a tool between hooks): the first call of a burst meets
    cold caches and, for the shim, a parked sender thread to wake."""
    pc = time.perf_counter_ns
    first: List[int] = []
    rest: List[int] = []
    n = len(kwargs_list)
    for b in range(bursts):
        time.sleep(gap_s)
        for i in range(burst):
            kw = kwargs_list[(b * burst + i) % n]
            t0 = pc()
            cb(**kw)
            t1 = pc()
            (first if i == 0 else rest).append(t1 - t0)
    return {"first": summarize(first), "rest": summarize(rest)}


def measure_timer(iterations: int) -> Dict[str, float]:
    pc = time.perf_counter_ns
    samples = []
    for _ in range(iterations):
        t0 = pc()
        t1 = pc()
        samples.append(t1 - t0)
    return {**summarize(samples), "block_mean_ns": 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default="ours,noop,queue,timer")
    parser.add_argument("--iterations", type=int, default=50000, help="timed calls per hook and variant")
    parser.add_argument("--chunk", type=int, default=2000, help="calls between drains")
    parser.add_argument(
        "--sparse-iterations",
        type=int,
        default=10000,
        help="timed calls per hook of a variant given as NAME@CHUNK",
    )
    parser.add_argument("--cold-variants", default="", help="variants also measured in cold bursts")
    parser.add_argument("--cold-hooks", default="pre_llm_call,pre_api_request,post_tool_call")
    parser.add_argument("--cold-bursts", type=int, default=200)
    parser.add_argument("--cold-gap-ms", type=float, default=20.0)
    parser.add_argument("--otlp-endpoint", default="http://127.0.0.1:4317")
    parser.add_argument("--fixtures", default=FIXTURES)
    parser.add_argument("--hooks", default="", help="comma-separated subset of hooks")
    args = parser.parse_args()

    calls = load_calls(args.fixtures)
    hooks = [h for h in METADATA_HOOKS if h in calls]
    if args.hooks:
        hooks = [h for h in hooks if h in args.hooks.split(",")]
    unregistered = sorted(h for h in calls if h not in METADATA_HOOKS)

    result: Dict[str, Any] = {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "machine": platform.machine(),
        "iterations": args.iterations,
        "chunk": args.chunk,
        "gc_enabled": gc.isenabled(),
        "hooks": hooks,
        "recorded_calls": {h: len(calls[h]) for h in hooks},
        "not_registered_by_shim": unregistered,
        "variants": {},
    }
    for spec in args.variants.split(","):
        spec = spec.strip()
        variant, _, chunk_s = spec.partition("@")
        chunk = int(chunk_s) if chunk_s else args.chunk
        iterations = args.sparse_iterations if chunk_s else args.iterations
        if variant == "timer":
            result["variants"]["timer"] = {"*": measure_timer(args.iterations)}
            continue
        stats_fn = None
        if variant == "ours":
            factory, drain, stats_fn = make_ours()
        elif variant == "noop":
            factory, drain, _ = make_noop()
        elif variant == "queue":
            factory, drain, _ = make_queue()
        elif variant in ("otel", "otel_attrs"):
            factory, drain, _ = make_otel(args.otlp_endpoint, variant == "otel_attrs")
        else:
            raise SystemExit(f"unknown variant {variant}")
        if chunk_s and variant != "ours":
            # The sleep ours' flush makes between bursts.
            drain = sleep_after(drain, SPARSE_SLEEP_S)
        per_hook: Dict[str, Any] = {}
        for hook in hooks:
            cb = factory(hook)
            if cb is None:
                continue
            per_hook[hook] = measure(cb, calls[hook], iterations, chunk, drain)
        result["variants"][spec] = per_hook
        if spec in args.cold_variants.split(","):
            cold: Dict[str, Any] = {}
            for hook in args.cold_hooks.split(","):
                cb = factory(hook)
                if cb is None or hook not in calls:
                    continue
                drain()
                cold[hook] = measure_cold(cb, calls[hook], args.cold_bursts, args.cold_gap_ms / 1000.0)
            result.setdefault("cold", {})[spec] = cold
            result["cold_gap_ms"] = args.cold_gap_ms
        if stats_fn is not None:
            result["shim_module"] = sys.modules["hermes_collector"].__file__
            stats = dict(stats_fn())
            result["ours_stats"] = {k: v for k, v in stats.items() if isinstance(v, (int, float, bool))}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
