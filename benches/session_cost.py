#!/usr/bin/env python3
"""Cost per real Hermes session: agent-thread time inside Hermes' hook
dispatch and the hook payload building that plugin registration triggers.

Runs a real three-turn ``AIAgent`` session (Python API, as the e2e scenario
``three_turns_on_one_agent_are_three_traces_of_one_session``: "Say one",
"Run echo turn-two" (one ``terminal`` tool call, two model calls), "Say
three"; 4 model calls, 1 tool call) against the scripted OpenAI-compatible
server ``tests/fake_openai.py``, for each variant:

  none         no plugin enabled
  lean         our plugin, HERMES_COLLECTOR_CAPTURE=lean, sending to a running
               release collector (which exports to hermes-bench-sink)
  metadata     our plugin, the default level
  content      our plugin, HERMES_COLLECTOR_CAPTURE=content
  otel         the PyPI plugin hermes-plugin-otel-tracing 0.1.1 as documented
               for OTLP (HERMES_OTEL_EXPORTER=otlp: OTLP/HTTP, BatchSpanProcessor,
               metrics every 10 s) with its other defaults (content capture on,
               DEBUG log file), exporting to an OTLP/HTTP receiver in this script
  otel_quiet   the same plugin with its cheapest settings
               (HERMES_OTEL_CAPTURE_CONTENT=false, HERMES_OTEL_LOG_FILE="")

The peer is configured with OTEL_EXPORTER_OTLP_TRACES_ENDPOINT and
OTEL_EXPORTER_OTLP_METRICS_ENDPOINT, never OTEL_EXPORTER_OTLP_ENDPOINT
(docs/HERMES_HOOKS.md: that variable makes other Hermes parts export content).

Every session runs in a child process (``--child``, started with the Python
of the session venv, which has hermes-agent 0.19.0 and
hermes-plugin-otel-tracing installed; our plugin comes from ``--shim-path``
on PYTHONPATH, with its dist-info, so Hermes finds its entry point). The child
instruments, in-process and before Hermes loads plugins:

  dispatch   hermes_cli.plugins.PluginManager.invoke_hook, the function that
             calls every plugin hook callback (the module-level invoke_hook
             and every call site go through it). The timed region is one
             ``**kwargs`` pack of the hook's kwargs (the wrapper passes them
             on, as Hermes' own call does once) plus the original body:
             setdefault of the schema version, the callbacks, the try/except.
  payload    the hook payload builders that run only when a plugin registered
             the hook: AIAgent._api_request_payload_for_hook (pre_api_request,
             api_request_error: the sanitized request),
             AIAgent._api_response_payload_for_hook and
             AIAgent._usage_summary_for_api_request_hook (post_api_request),
             model_tools._tool_result_observer_fields (post_tool_call).
             Nested regions count once (the outermost).

Each region is timed with time.perf_counter_ns (wall) and
time.thread_time_ns (CPU time of the calling thread). Not timed: the call
sites' own argument evaluation (e.g. the list() copies of the message lists
for pre_api_request, a few hundred ns) and the has_hook() checks.

Each child process runs --sessions-per-process sessions one after another
(a new AIAgent each); the first session of a process is reported as "cold"
(first hook calls of the process: lazy imports, first span, sender thread
start), the others as "warm". Processes of all variants are interleaved in
a shuffled order per round, --rounds rounds.

Prints one JSON object (raw per-session data and per-variant summaries);
benches/report.py turns it into tables.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, ".."))
FAKE_OPENAI = os.path.join(ROOT, "tests", "fake_openai.py")
MODEL = "fake-model"
API_KEY = "sk-hermes-bench"
PLACEHOLDER_URL = "http://127.0.0.1:9/v1"  # replaced per process in config.yaml
PREFIX = "SESSION_COST "
DONE_PREFIX = "SESSION_COST_DONE "

QUERIES = ["Say one", "Run echo turn-two", "Say three"]
FINALS = ["First answer.", "Second answer.", "Third answer."]
SESSION_SCRIPT = [
    {"content": "First answer.", "usage": {"prompt_tokens": 101, "completion_tokens": 1}},
    {
        "tool_calls": [{"name": "terminal", "arguments": {"command": "echo turn-two"}}],
        "usage": {"prompt_tokens": 102, "completion_tokens": 2},
    },
    {"content": "Second answer.", "usage": {"prompt_tokens": 103, "completion_tokens": 3}},
    {"content": "Third answer.", "usage": {"prompt_tokens": 104, "completion_tokens": 4}},
]

# Variant -> (plugin to enable or None, extra environment). "{tmp}" and
# "{otlp}" are filled in by the driver.
VARIANTS: Dict[str, Tuple[Optional[str], Dict[str, str]]] = {
    "none": (None, {}),
    "lean": ("hermes_collector", {"HERMES_COLLECTOR_CAPTURE": "lean"}),
    "metadata": ("hermes_collector", {"HERMES_COLLECTOR_CAPTURE": "metadata"}),
    "content": ("hermes_collector", {"HERMES_COLLECTOR_CAPTURE": "content"}),
    "noop": ("bench_noop", {}),
    "otel": (
        "otel_tracing",
        {
            "HERMES_OTEL_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "{otlp}/v1/traces",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "{otlp}/v1/metrics",
            "HERMES_OTEL_LOG_FILE": "{tmp}/otel-plugin.log",
        },
    ),
    "otel_quiet": (
        "otel_tracing",
        {
            "HERMES_OTEL_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "{otlp}/v1/traces",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "{otlp}/v1/metrics",
            "HERMES_OTEL_LOG_FILE": "",
            "HERMES_OTEL_CAPTURE_CONTENT": "false",
        },
    ),
}
DEFAULT_VARIANTS = "none,noop,lean,metadata,content,otel,otel_quiet"

# The `noop` variant registers the hooks our plugin registers at `metadata`
# (shim_hooks.py) with a no-op Python callback, so that (metadata - noop) is
# what our callbacks themselves cost and (noop - none) what Hermes does
# because the hooks are registered.
sys.path.insert(0, HERE)
from shim_hooks import METADATA_HOOKS  # noqa: E402
NOOP_PLUGIN_YAML = "name: bench_noop\nversion: \"0.0.1\"\ndescription: benchmark anchor, no-op callbacks\nprovides_hooks: []\n"
NOOP_PLUGIN_INIT = (
    "HOOKS = %r\n\n"
    "def _noop(**kwargs):\n"
    "    return None\n\n"
    "def register(ctx):\n"
    "    for name in HOOKS:\n"
    "        ctx.register_hook(name, _noop)\n"
) % (METADATA_HOOKS,)


# =====================================================================
# Child: runs inside the session venv, next to Hermes.
# =====================================================================


def child_main(argv: List[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--child", action="store_true")
    p.add_argument("--base-url", required=True)
    p.add_argument("--sessions", type=int, default=2)
    p.add_argument("--no-instrument", action="store_true")
    args = p.parse_args(argv)

    import threading as _threading
    import time as _time

    pc = _time.perf_counter_ns
    tt = _time.thread_time_ns
    t_process = _time.time()
    main_ident = _threading.get_ident()
    tls = _threading.local()
    # (category, name, wall_ns, cpu_ns, on_agent_thread)
    records: List[Tuple[str, str, int, int, bool]] = []
    load: Dict[str, Any] = {}

    import hermes_cli.plugins as hp

    def timed(category: str, name: str, fn, *a, **kw):
        if getattr(tls, "depth", 0):
            return fn(*a, **kw)
        tls.depth = 1
        c0 = tt()
        t0 = pc()
        try:
            return fn(*a, **kw)
        finally:
            t1 = pc()
            c1 = tt()
            tls.depth = 0
            records.append((category, name, t1 - t0, c1 - c0, _threading.get_ident() == main_ident))

    if not args.no_instrument:
        orig_invoke = hp.PluginManager.invoke_hook

        def invoke_hook(self, hook_name, **kwargs):
            if getattr(tls, "depth", 0):
                return orig_invoke(self, hook_name, **kwargs)
            tls.depth = 1
            c0 = tt()
            t0 = pc()
            try:
                return orig_invoke(self, hook_name, **kwargs)
            finally:
                t1 = pc()
                c1 = tt()
                tls.depth = 0
                records.append(("dispatch", hook_name, t1 - t0, c1 - c0, _threading.get_ident() == main_ident))

        hp.PluginManager.invoke_hook = invoke_hook

    orig_discover = hp.PluginManager.discover_and_load

    def discover_and_load(self, *a, **kw):
        c0 = tt()
        t0 = pc()
        try:
            return orig_discover(self, *a, **kw)
        finally:
            load.setdefault("discover_wall_ns", 0)
            load.setdefault("discover_cpu_ns", 0)
            load["discover_wall_ns"] += pc() - t0
            load["discover_cpu_ns"] += tt() - c0

    hp.PluginManager.discover_and_load = discover_and_load

    t0 = pc()
    import model_tools  # noqa: F401  (discovers and loads the plugins)
    from run_agent import AIAgent

    load["import_wall_ns"] = pc() - t0

    if not args.no_instrument:
        def wrap_method(cls, attr: str) -> None:
            orig = getattr(cls, attr)

            def method(self, *a, **kw):
                return timed("payload", attr, orig, self, *a, **kw)

            setattr(cls, attr, method)

        for attr in (
            "_api_request_payload_for_hook",
            "_api_response_payload_for_hook",
            "_usage_summary_for_api_request_hook",
        ):
            wrap_method(AIAgent, attr)
        orig_fields = model_tools._tool_result_observer_fields

        def _tool_result_observer_fields(*a, **kw):
            return timed("payload", "_tool_result_observer_fields", orig_fields, *a, **kw)

        model_tools._tool_result_observer_fields = _tool_result_observer_fields

    manager = hp.get_plugin_manager()
    hooks_registered = {h: len(cbs) for h, cbs in sorted(manager._hooks.items()) if cbs}

    # Cost of an empty timed region (the instrumentation's own floor).
    calib = []
    for _ in range(2000):
        c0 = tt()
        t0 = pc()
        t1 = pc()
        c1 = tt()
        calib.append((t1 - t0, c1 - c0))
    calib_wall = statistics.median(c[0] for c in calib)
    calib_cpu = statistics.median(c[1] for c in calib)

    main_tid = _threading.get_native_id()

    def task_times() -> Dict[str, Tuple[str, int]]:
        """tid -> (comm, ns on CPU) of every thread of this process."""
        out = {}
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/comm", encoding="utf-8") as f:
                    comm = f.read().strip()
                with open(f"/proc/self/task/{tid}/schedstat", encoding="ascii") as f:
                    out[tid] = (comm, int(f.read().split()[0]))
            except (OSError, ValueError, IndexError):
                pass
        return out

    def emit(prefix: str, obj: Dict[str, Any]) -> None:
        sys.stdout.write(prefix + json.dumps(obj) + "\n")
        sys.stdout.flush()

    for s in range(args.sessions):
        del records[:]
        agent = AIAgent(
            base_url=args.base_url,
            api_key=os.environ.get("HERMES_BENCH_API_KEY", API_KEY),
            provider="custom",
            model=os.environ.get("HERMES_BENCH_MODEL", MODEL),
            enabled_toolsets=["terminal"],
            quiet_mode=True,
        )
        history = None
        finals = []
        turns = []
        tasks_before = task_times()
        c_session = tt()
        t_session = pc()
        for query in QUERIES:
            t0 = pc()
            c0 = tt()
            r = agent.run_conversation(query, conversation_history=history)
            turns.append({"wall_ns": pc() - t0, "cpu_ns": tt() - c0})
            history = r.get("messages")
            finals.append(r.get("final_response"))
        session_wall = pc() - t_session
        session_cpu = tt() - c_session
        tasks_after = task_times()
        other_threads: Dict[str, int] = {}
        for tid, (comm, ns) in tasks_after.items():
            if int(tid) == main_tid:
                continue
            delta = ns - tasks_before.get(tid, (comm, 0))[1]
            if delta > 0:
                other_threads[comm] = other_threads.get(comm, 0) + delta
        emit(
            PREFIX,
            {
                "session_index": s,
                "session_id": agent.session_id,
                "ok": finals == FINALS,
                "finals": finals,
                "turns": turns,
                "session_wall_ns": session_wall,
                "session_cpu_ns": session_cpu,
                "other_threads_cpu_ns": other_threads,
                "records": records[:],
            },
        )
    stats = None
    if "hermes_collector" in sys.modules:
        try:
            stats = {
                k: v
                for k, v in sys.modules["hermes_collector"].stats().items()
                if isinstance(v, (int, float, bool, str))
            }
        except Exception as exc:  # noqa: BLE001
            stats = {"error": str(exc)}
    emit(
        DONE_PREFIX,
        {
            "hooks_registered": hooks_registered,
            "plugins_loaded": sorted(
                k for k, v in getattr(manager, "_plugins", {}).items() if getattr(v, "enabled", False)
                and getattr(getattr(v, "manifest", None), "source", "") != "bundled"
            ),
            "load": load,
            "calib_wall_ns": calib_wall,
            "calib_cpu_ns": calib_cpu,
            "shim_stats": stats,
            "process_start_unix": t_process,
            "done_unix": _time.time(),
        },
    )


# =====================================================================
# Driver helpers (also used by benches/agent_stall.py)
# =====================================================================


def log(msg: str) -> None:
    sys.stderr.write(f"session_cost: {msg}\n")
    sys.stderr.flush()


def loadavg() -> str:
    with open("/proc/loadavg", encoding="ascii") as f:
        return " ".join(f.read().split()[:3])


def free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env() -> Dict[str, str]:
    """The driver's environment without OTEL_* variables."""
    return {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}


def pct(values: List[float], q: float) -> Optional[float]:
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return None
    i = min(len(vals) - 1, max(0, round((len(vals) - 1) * q)))
    return float(vals[i])


class FakeServer:
    """tests/fake_openai.py with a script of `sessions` three-turn sessions."""

    def __init__(self, workdir: str, sessions: int, python: str = sys.executable,
                 model_delay_ms: int = 0):
        os.makedirs(workdir, exist_ok=True)
        script = os.path.join(workdir, "script.json")
        responses = [dict(r, delay_ms=model_delay_ms) if model_delay_ms else r for r in SESSION_SCRIPT]
        with open(script, "w", encoding="utf-8") as f:
            json.dump({"model": MODEL, "responses": responses * sessions}, f)
        self.p = subprocess.Popen(
            [python, FAKE_OPENAI, script, "--model", MODEL, "--max-seconds", "900"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=clean_env(),
        )
        line = self.p.stdout.readline().decode()
        if not line.startswith("PORT "):
            self.stop()
            raise SystemExit(f"fake_openai.py did not start: {line!r}")
        self.port = int(line.split()[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def stop(self) -> None:
        try:
            self.p.stdin.close()
        except Exception:  # noqa: BLE001
            pass
        try:
            self.p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


class OtlpHttpReceiver:
    """A tiny OTLP/HTTP receiver on 127.0.0.1 (a thread of this process).

    mode "ok": answers 200 with an empty protobuf response; "503": answers
    503; "slow": answers 200 after `delay_s`. Counts requests and bytes per
    path."""

    def __init__(self, mode: str = "ok", delay_s: float = 0.0):
        self.mode = mode
        self.delay_s = delay_s
        self.counts: Dict[str, List[int]] = {}
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                with receiver.lock:
                    c = receiver.counts.setdefault(self.path, [0, 0])
                    c[0] += 1
                    c[1] += len(body)
                if receiver.mode == "slow":
                    time.sleep(receiver.delay_s)
                status = 503 if receiver.mode == "503" else 200
                self.send_response(status)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> Dict[str, List[int]]:
        self.server.shutdown()
        self.server.server_close()
        return dict(self.counts)


class Blackhole:
    """Accepts TCP connections on 127.0.0.1 and never answers (a hung peer)."""

    def __init__(self) -> None:
        import socket

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.conns: List[Any] = []
        self.stopped = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopped:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)  # kept open, never read from or written to

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> int:
        self.stopped = True
        try:
            self.sock.close()
        except OSError:
            pass
        for c in self.conns:
            try:
                c.close()
            except OSError:
                pass
        return len(self.conns)


def http_get(url: str, timeout: float = 2.0) -> Optional[str]:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (loopback)
            return r.read().decode()
    except Exception:  # noqa: BLE001
        return None


class Collector:
    """A release hermes-collector (and, for `sink`, a hermes-bench-sink it
    exports to). `otlp_endpoint`/`otlp_protocol` override the backend."""

    def __init__(
        self,
        bins: str,
        logdir: str,
        tag: str,
        otlp_endpoint: Optional[str] = None,
        otlp_protocol: Optional[str] = None,
        sink: bool = False,
    ):
        self.tag = tag
        self.sink = None
        self.sink_out = b""
        env = clean_env()
        env.setdefault("RUST_LOG", "info")
        if sink:
            sink_port = free_port()
            self.sink_log = open(os.path.join(logdir, f"{tag}-sink.log"), "ab")
            self.sink = subprocess.Popen(
                [os.path.join(bins, "hermes-bench-sink"), "--listen", f"127.0.0.1:{sink_port}"],
                stdout=subprocess.PIPE,
                stderr=self.sink_log,
                env=env,
            )
            otlp_endpoint = f"http://127.0.0.1:{sink_port}"
        self.listen = free_port()
        self.admin = free_port()
        argv = [
            os.path.join(bins, "hermes-collector"),
            "--listen", f"127.0.0.1:{self.listen}",
            "--admin-listen", f"127.0.0.1:{self.admin}",
        ]
        if otlp_endpoint:
            argv += ["--otlp-endpoint", otlp_endpoint]
        if otlp_protocol:
            argv += ["--otlp-protocol", otlp_protocol]
        self.log = open(os.path.join(logdir, f"{tag}-collector.log"), "ab")
        try:
            self.p = subprocess.Popen(argv, stdout=self.log, stderr=self.log, env=env, cwd=logdir)
            deadline = time.time() + 30
            while http_get(f"http://127.0.0.1:{self.admin}/readyz") is None:
                if self.p.poll() is not None or time.time() > deadline:
                    self.p.kill()
                    raise SystemExit(f"collector {tag} did not become ready (see {logdir}/{tag}-collector.log)")
                time.sleep(0.05)
        except BaseException:
            if self.sink is not None:
                self.sink.kill()
                self.sink.wait()
            raise

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.listen}"

    def metrics(self) -> Optional[str]:
        return http_get(f"http://127.0.0.1:{self.admin}/metrics")

    def stop(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        text = self.metrics() or ""
        for line in text.splitlines():
            if line.startswith("hermes_collector_") and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                if any(k in name for k in ("events_total", "sent_spans", "spans_total", "dropped", "failed", "export")):
                    try:
                        out[name] = float(value)
                    except ValueError:
                        pass
        for proc in (self.p, self.sink):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        try:
            self.p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        if self.sink is not None:
            try:
                sink_out, _ = self.sink.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                self.sink.kill()
                sink_out, _ = self.sink.communicate()
            lines = [l for l in (sink_out or b"").decode().splitlines() if l.startswith("{")]
            if lines:
                sink_json = json.loads(lines[-1])
                out["sink_spans"] = sink_json.get("spans")
                out["sink_exports"] = sink_json.get("exports")
            self.sink_log.close()
        self.log.close()
        return out


class Homes:
    """Template HERMES_HOMEs (configured through Hermes' own CLI, like the
    e2e harness), copied fresh for every child process."""

    CONFIG = [
        ("model.provider", "custom"),
        ("model.base_url", PLACEHOLDER_URL),
        ("model.default", MODEL),
        ("model.api_key", API_KEY),
        ("model.context_length", "128000"),
        ("security.tirith_enabled", "false"),
        ("curator.enabled", "false"),
        ("--force memory.nudge_interval", "0"),
        ("--force skills.creation_nudge_interval", "0"),
    ]

    def __init__(self, venv: str, shim_path: str, workdir: str, plugins: List[Optional[str]]):
        self.venv = venv
        self.shim_path = shim_path
        self.workdir = workdir
        self.templates: Dict[Optional[str], str] = {}
        for plugin in plugins:
            if plugin in self.templates:
                continue
            home = os.path.join(workdir, "template-" + (plugin or "none"))
            os.makedirs(os.path.join(home, ".hermes"), exist_ok=True)
            if plugin == "bench_noop":
                pdir = os.path.join(home, ".hermes", "plugins", "bench_noop")
                os.makedirs(pdir, exist_ok=True)
                with open(os.path.join(pdir, "plugin.yaml"), "w", encoding="utf-8") as f:
                    f.write(NOOP_PLUGIN_YAML)
                with open(os.path.join(pdir, "__init__.py"), "w", encoding="utf-8") as f:
                    f.write(NOOP_PLUGIN_INIT)
            argv = [["hermes", "config", "set"] + k.split() + [v] for k, v in self.CONFIG]
            if plugin:
                argv.append(["hermes", "plugins", "enable", plugin])
            code = (
                "import json, os, sys\n"
                "from hermes_cli.main import main\n"
                "for argv in json.loads(os.environ['BENCH_ARGV']):\n"
                "    sys.argv = argv\n"
                "    try:\n"
                "        rc = main()\n"
                "    except SystemExit as e:\n"
                "        rc = e.code\n"
                "    if rc not in (None, 0):\n"
                "        sys.exit(' '.join(argv) + ' exited with ' + repr(rc))\n"
            )
            env = self.env(home, {"BENCH_ARGV": json.dumps(argv)})
            r = subprocess.run(
                [os.path.join(venv, "bin", "python"), "-c", code],
                env=env, cwd=workdir, capture_output=True, timeout=300, check=False,
            )
            if r.returncode != 0:
                raise SystemExit(f"configuring {home} failed: {r.stdout.decode()[-2000:]} {r.stderr.decode()[-2000:]}")
            with open(os.path.join(home, ".hermes", "config.yaml"), encoding="utf-8") as f:
                cfg = f.read()
            if PLACEHOLDER_URL not in cfg or (plugin and plugin not in cfg):
                raise SystemExit(f"unexpected config.yaml in {home}:\n{cfg}")
            self.templates[plugin] = home

    def env(self, home: str, extra: Dict[str, str]) -> Dict[str, str]:
        """Hermetic environment for Hermes (as tests/src/hermes.rs builds it)."""
        env = {
            "PATH": os.path.join(self.venv, "bin") + ":" + os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": home,
            "HERMES_HOME": os.path.join(home, ".hermes"),
            "VIRTUAL_ENV": self.venv,
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            "NO_COLOR": "1",
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": self.shim_path,
            "HERMES_BENCH_MODEL": MODEL,
            "HERMES_BENCH_API_KEY": API_KEY,
        }
        for key in ("TMPDIR", "USER", "LOGNAME", "SHELL"):
            if key in os.environ:
                env[key] = os.environ[key]
        for k, v in extra.items():
            if k == "OTEL_EXPORTER_OTLP_ENDPOINT":
                raise SystemExit("OTEL_EXPORTER_OTLP_ENDPOINT must never be set for the agent")
            env[k] = v
        return env

    def fresh(self, plugin: Optional[str], base_url: str, dest: str) -> str:
        home = os.path.join(dest, "home")
        shutil.copytree(self.templates[plugin], home)
        path = os.path.join(home, ".hermes", "config.yaml")
        with open(path, encoding="utf-8") as f:
            cfg = f.read()
        with open(path, "w", encoding="utf-8") as f:
            f.write(cfg.replace(PLACEHOLDER_URL, base_url))
        return home


def run_child(
    homes: Homes,
    plugin: Optional[str],
    extra_env: Dict[str, str],
    sessions: int,
    workdir: str,
    timeout: float = 300.0,
    instrument: bool = True,
    model_delay_ms: int = 0,
) -> Dict[str, Any]:
    """One child process: a fresh home, a fresh fake server (answering
    each model call after `model_delay_ms`), `sessions` sessions. Returns
    its sessions, its DONE record, and the exit delay."""
    os.makedirs(workdir, exist_ok=True)
    server = FakeServer(os.path.join(workdir, "server"), sessions, model_delay_ms=model_delay_ms)
    try:
        home = homes.fresh(plugin, server.base_url, workdir)
        cwd = os.path.join(workdir, "work")
        os.makedirs(cwd, exist_ok=True)
        env = homes.env(home, {k: v.replace("{tmp}", workdir) for k, v in extra_env.items()})
        argv = [os.path.join(homes.venv, "bin", "python"), os.path.abspath(__file__), "--child",
                "--base-url", server.base_url, "--sessions", str(sessions)]
        if not instrument:
            argv.append("--no-instrument")
        t_start = time.time()
        p = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            raise SystemExit(f"child timed out after {timeout}s: {err.decode()[-3000:]}")
        t_exit = time.time()
    finally:
        server.stop()
    sess = []
    done = None
    for line in out.decode(errors="replace").splitlines():
        if line.startswith(PREFIX):
            sess.append(json.loads(line[len(PREFIX):]))
        elif line.startswith(DONE_PREFIX):
            done = json.loads(line[len(DONE_PREFIX):])
    if p.returncode != 0 or done is None or len(sess) != sessions:
        raise SystemExit(
            f"child failed (rc {p.returncode}, {len(sess)} sessions):\n"
            f"--- stdout ---\n{out.decode(errors='replace')[-3000:]}\n--- stderr ---\n{err.decode(errors='replace')[-5000:]}"
        )
    bad = [s for s in sess if not s["ok"]]
    if bad:
        raise SystemExit(f"session answers differ from the script: {bad[0]['finals']}\n{err.decode(errors='replace')[-3000:]}")
    return {
        "sessions": sess,
        "done": done,
        "process_wall_s": t_exit - t_start,
        "exit_delay_s": t_exit - done["done_unix"],
    }


# =====================================================================
# Summaries
# =====================================================================


def session_totals(sess: Dict[str, Any]) -> Dict[str, float]:
    """Per session: agent-thread (and other-thread) totals per category."""
    tot = {
        "dispatch_wall_ns": 0, "dispatch_cpu_ns": 0, "dispatch_calls": 0,
        "payload_wall_ns": 0, "payload_cpu_ns": 0, "payload_calls": 0,
        "other_thread_wall_ns": 0, "other_thread_cpu_ns": 0, "other_thread_calls": 0,
    }
    for cat, _name, wall, cpu, on_main in sess["records"]:
        if on_main:
            tot[f"{cat}_wall_ns"] += wall
            tot[f"{cat}_cpu_ns"] += cpu
            tot[f"{cat}_calls"] += 1
        else:
            tot["other_thread_wall_ns"] += wall
            tot["other_thread_cpu_ns"] += cpu
            tot["other_thread_calls"] += 1
    tot["total_wall_ns"] = tot["dispatch_wall_ns"] + tot["payload_wall_ns"]
    tot["total_cpu_ns"] = tot["dispatch_cpu_ns"] + tot["payload_cpu_ns"]
    tot["other_threads_session_cpu_ns"] = sum(sess.get("other_threads_cpu_ns", {}).values())
    tot["session_wall_ns"] = sess["session_wall_ns"]
    tot["session_cpu_ns"] = sess["session_cpu_ns"]
    return tot


def summarize_variant(procs: List[Dict[str, Any]]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for phase, pick in (("cold", lambda i: i == 0), ("warm", lambda i: i > 0), ("all", lambda i: True)):
        sessions = [s for pr in procs for s in pr["sessions"] if pick(s["session_index"])]
        if not sessions:
            continue
        totals = [session_totals(s) for s in sessions]
        per_session = {}
        for key in totals[0]:
            vals = [t[key] for t in totals]
            per_session[key] = {"median": statistics.median(vals), "p90": pct(vals, 0.9), "min": min(vals), "max": max(vals)}
        per_hook: Dict[str, Dict[str, List[int]]] = {}
        for s in sessions:
            for cat, name, wall, cpu, on_main in s["records"]:
                if not on_main:
                    continue
                d = per_hook.setdefault(f"{cat}:{name}", {"wall": [], "cpu": [], "n": 0})
                d["wall"].append(wall)
                d["cpu"].append(cpu)
        hooks = {}
        for key, d in per_hook.items():
            hooks[key] = {
                "calls_per_session": len(d["wall"]) / len(sessions),
                "wall_median_ns": statistics.median(d["wall"]),
                "wall_p90_ns": pct(d["wall"], 0.9),
                "cpu_median_ns": statistics.median(d["cpu"]),
                "cpu_p90_ns": pct(d["cpu"], 0.9),
            }
        comms = sorted({c for s in sessions for c in s.get("other_threads_cpu_ns", {})})
        by_comm = {
            c: statistics.median(s.get("other_threads_cpu_ns", {}).get(c, 0) for s in sessions) for c in comms
        }
        out[phase] = {"sessions": len(sessions), "per_session": per_session, "per_call": hooks,
                      "other_threads_cpu_ns_by_name": by_comm}
    dones = [pr["done"] for pr in procs]
    out["hooks_registered"] = dones[0]["hooks_registered"]
    out["plugins_loaded"] = dones[0]["plugins_loaded"]
    out["calib_wall_ns"] = statistics.median(d["calib_wall_ns"] for d in dones)
    out["calib_cpu_ns"] = statistics.median(d["calib_cpu_ns"] for d in dones)
    out["discover_wall_ms"] = statistics.median(d["load"].get("discover_wall_ns", 0) for d in dones) / 1e6
    out["import_wall_ms"] = statistics.median(d["load"].get("import_wall_ns", 0) for d in dones) / 1e6
    out["exit_delay_ms"] = {
        "median": statistics.median(pr["exit_delay_s"] for pr in procs) * 1e3,
        "p90": pct([pr["exit_delay_s"] for pr in procs], 0.9) * 1e3,
    }
    out["shim_stats"] = [d.get("shim_stats") for d in dones if d.get("shim_stats")][:3]
    return out


# =====================================================================
# Driver
# =====================================================================


def add_common_args(ap: argparse.ArgumentParser, rounds: int, seed: int) -> None:
    """The flags session_cost.py and agent_stall.py share."""
    ap.add_argument("--venv", default=os.path.join(ROOT, "target", "session-venv"),
                    help="venv with hermes-agent==0.19.0 and hermes-plugin-otel-tracing")
    ap.add_argument("--shim-path", required=True,
                    help="directory holding hermes_collector/ and its dist-info (put on PYTHONPATH)")
    ap.add_argument("--bins", required=True, help="directory with hermes-collector and hermes-bench-sink")
    ap.add_argument("--rounds", type=int, default=rounds, help="child processes per variant or condition")
    ap.add_argument("--sessions-per-process", type=int, default=3)
    ap.add_argument("--seed", type=int, default=seed)
    ap.add_argument("--logdir", default=None)


def parse_common_args(ap: argparse.ArgumentParser) -> argparse.Namespace:
    """Parses the arguments, with the shared paths made absolute (the
    children run in other directories)."""
    args = ap.parse_args()
    args.bins = os.path.abspath(args.bins)
    args.shim_path = os.path.abspath(args.shim_path)
    args.venv = os.path.abspath(args.venv)
    return args


def result_header(benchmark: str, args: argparse.Namespace) -> Dict[str, Any]:
    """The first fields of session_cost.py's and agent_stall.py's result:
    which benchmark, when, and the shared run shape."""
    return {
        "benchmark": benchmark,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rounds": args.rounds,
        "sessions_per_process": args.sessions_per_process,
    }


def work_dirs(prefix: str, logdir: Optional[str]) -> Tuple[str, str]:
    """A fresh work directory, and the log directory (--logdir or one in it)."""
    work = tempfile.mkdtemp(prefix=prefix)
    logdir = logdir or os.path.join(work, "logs")
    os.makedirs(logdir, exist_ok=True)
    return work, logdir


def driver_main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(ap, rounds=20, seed=1)
    ap.add_argument("--variants", default=DEFAULT_VARIANTS)
    ap.add_argument("--model-delay-ms", type=int, default=0,
                    help="the scripted server answers each model call after this long (default: at once)")
    args = parse_common_args(ap)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in variants:
        if v not in VARIANTS:
            raise SystemExit(f"unknown variant {v}")
    work, logdir = work_dirs("session-cost-", args.logdir)
    log(f"work dir {work}; load {loadavg()}")
    homes = Homes(args.venv, args.shim_path, work, [VARIANTS[v][0] for v in variants])
    collector = Collector(args.bins, logdir, "session-cost", sink=True)
    otlp = OtlpHttpReceiver("ok")
    rng = random.Random(args.seed)
    procs: Dict[str, List[Dict[str, Any]]] = {v: [] for v in variants}
    loads = [loadavg()]
    t0 = time.time()
    try:
        for r in range(args.rounds):
            order = variants[:]
            rng.shuffle(order)
            for v in order:
                plugin, env = VARIANTS[v]
                extra = {k: val.replace("{otlp}", otlp.endpoint) for k, val in env.items()}
                if plugin == "hermes_collector":
                    extra["HERMES_COLLECTOR_ENDPOINT"] = collector.endpoint
                    extra["HERMES_COLLECTOR_SERVICE_NAME"] = "hermes-bench"
                pdir = os.path.join(work, f"r{r}-{v}")
                res = run_child(homes, plugin, extra, args.sessions_per_process, pdir,
                                model_delay_ms=args.model_delay_ms)
                res["round"] = r
                procs[v].append(res)
                shutil.rmtree(pdir, ignore_errors=True)
            loads.append(loadavg())
            log(f"round {r + 1}/{args.rounds} done ({time.time() - t0:.0f} s, load {loads[-1]})")
    finally:
        coll = collector.stop()
        otlp_counts = otlp.stop()
    result = {
        **result_header("session_cost", args),
        "variants": variants,
        "queries": QUERIES,
        "script": SESSION_SCRIPT,
        "model_delay_ms": args.model_delay_ms,
        "loads": loads,
        "seconds": time.time() - t0,
        "collector": coll,
        "otlp_http_receiver": otlp_counts,
        "venv": args.venv,
        "python": subprocess.run([os.path.join(args.venv, "bin", "python"), "-c", "import sys; print(sys.version.split()[0])"],
                                 capture_output=True, check=False).stdout.decode().strip(),
        "summary": {v: summarize_variant(procs[v]) for v in variants},
        "raw": procs,
    }
    print(json.dumps(result))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if "--child" in sys.argv[1:]:
        child_main(sys.argv[1:])
    else:
        driver_main()
