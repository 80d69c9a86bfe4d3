#!/usr/bin/env python3
"""Collector throughput, CPU, memory and delivery delay (stdlib only).

Every scenario starts a fresh collector as released (the `dist` profile:
target/dist/hermes-collector) that exports over OTLP/gRPC to a fresh
`hermes-bench-sink` (a minimal OTLP receiver that records, per span, the
delay from the span's end time to its arrival), all on 127.0.0.1 with
OS-chosen ports, and stops both afterwards.

Scenarios (each repeated --repeats times; medians reported):
  idle        RSS of a started collector with no traffic, and its CPU time
              and wake-ups per second over 10 s (its timers)
  throughput  `hermes-loadgen` (dist profile; recorded turns, metadata
              capture, i.e. content off) as fast as it goes; events/s from
              loadgen's start to the last span arriving at the sink,
              collector CPU seconds (utime+stime from /proc/PID/stat) ->
              events per CPU-second; bytes the collector wrote
              (/proc/PID/io wchar: its export requests and acknowledgements)
  open_turns  `hermes-bench-driver open-turns`: N distinct turns opened
              (pre_llm_call + pre_tool_call each) and held; collector RSS
  throughput_warm
              the same load three times over on one collector; reported:
              the third round (a collector that has already taken two), and
              every round's CPU (user, system), minor faults and RSS in
              `rounds`
  throughput_workers
              the same with the collector's pipeline spread over its worker
              threads (`runtime.pipeline: workers`) instead of on one thread
              of its own
  floor_full  `hermes-bench-floor --decode full`: the collector's ingest alone
              (gRPC receive, decode, acknowledge, drop) under the throughput
              load: its events per CPU-second, the collector's ceiling
  floor_views the same, reading every field as floor_full does but into
              borrowed views of the received bytes (no allocation per field)
  floor_seqs  the same, decoding only the events' seqs (what any receiver
              must decode to acknowledge)
  delay       `hermes-bench-driver paced`: agents replaying the recorded turns
              in real time (speed 1), 5x and 20x faster (--delay-runs), each
              event stamped when it is "captured" and handed to the agent's
              own instance of the shim's sender (its thread, timers and
              wakes; --idle-poll-max-ms and --idle-sleep-after-ms override
              its idle look interval and when it stops it),
              or at 20x batched on the driver's runtime (<= 512 events or
              50 ms: 200 sender threads at that rate take more of this
              2-vCPU machine than the collector); sink delays (arrival -
              span end) p50/p99/max
  idle_sender `hermes-bench-driver idle-sender`: four shim senders connected
              to the collector and given nothing to send for 20 s; CPU time
              and wake-ups per sender thread per second (what an idle agent
              process pays for the sender's timer), measured once the
              senders are past --idle-sleep-after-ms (unless it is longer
              than the 20 s: then while they poll; --idle-poll-max-ms)

  throughput_gzip
              the throughput scenario with the collector's OTLP exporter
              compressing (gzip), as the relay scenario's relay does, at
              the collector's default level or --gzip-level
  relay       the field's anchor: rotel (the Rust OpenTelemetry collector,
              from PyPI's `rotel` wheel, --rotel) relaying OTLP/gRPC to the
              sink, given the spans our collector exports for the throughput
              load (`hermes-bench-driver otlp`: the same fixture turns with
              fresh ids, correlated in the driver, 256 spans per request);
              its CPU per span against ours. Its OTLP exporter always
              compresses (gzip: `--otlp-exporter-compression none` is not
              honored by the wheel's build), hence throughput_gzip

Prints a JSON object with every run and the medians, and a table.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, ".."))
CLK_TCK = os.sysconf("SC_CLK_TCK")
# Environment of the collector (and of the floor server) only: --worker-threads.
COLLECTOR_ENV: Dict[str, str] = {}
PAGE = os.sysconf("SC_PAGE_SIZE")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stat(pid: int) -> Dict[str, float]:
    """User and system CPU seconds and minor faults of a process (all its
    threads), from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # minflt, utime and stime are fields 10, 14 and 15 of stat; [0] here is
    # field 3.
    return {
        "user": int(fields[11]) / CLK_TCK,
        "system": int(fields[12]) / CLK_TCK,
        "minflt": int(fields[7]),
    }


def written_bytes(pid: int) -> int:
    """Bytes the process handed to write system calls (`wchar` of
    /proc/PID/io): for the collector under load, its OTLP export requests
    (compressed or not) and its acknowledgements to the load generator."""
    with open(f"/proc/{pid}/io", encoding="ascii") as f:
        for line in f:
            if line.startswith("wchar:"):
                return int(line.split()[1])
    return 0


def cpu_seconds(pid: int) -> float:
    s = stat(pid)
    return s["user"] + s["system"]


def context_switches(pid: int) -> int:
    """Voluntary context switches of all of the process's threads (each one a
    thread that parked and was woken)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status", encoding="ascii") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches:"):
                        total += int(line.split()[1])
        except FileNotFoundError:
            pass
    return total


def memory(pid: int) -> Dict[str, float]:
    out = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon"):
                out[key] = int(value.split()[0]) / 1024.0  # MiB
    return out


def load() -> str:
    with open("/proc/loadavg", encoding="ascii") as f:
        return " ".join(f.read().split()[:3])


def http_get(url: str, timeout: float = 2.0) -> Optional[str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (loopback)
            return r.read().decode()
    except Exception:
        return None


def metric(text: Optional[str], name: str) -> Optional[float]:
    """Sum of all samples of a Prometheus metric family `name` (any labels)."""
    if not text:
        return None
    total = None
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            rest = line[len(name):]
            if rest[:1] in ("{", " "):
                try:
                    total = (total or 0.0) + float(line.rsplit(" ", 1)[1])
                except ValueError:
                    pass
    return total


class Proc:
    def __init__(self, argv: List[str], name: str, logdir: str, stdout_pipe: bool = False,
                 env: Optional[Dict[str, str]] = None):
        self.name = name
        self.log = open(os.path.join(logdir, f"{name}.log"), "ab")
        self.p = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE if stdout_pipe else self.log,
            stderr=self.log,
            cwd=ROOT,
            env={**{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}, **(env or {})},
        )

    @property
    def pid(self) -> int:
        return self.p.pid

    def stop(self, timeout: float = 30.0) -> str:
        """SIGTERM, wait; returns what it printed on stdout (if piped)."""
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        try:
            out, _ = self.p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            out, _ = self.p.communicate()
        self.log.close()
        return (out or b"").decode()


class Rig:
    """A sink and a collector exporting to it."""

    def __init__(self, bins: str, logdir: str, tag: str, env: Optional[Dict[str, str]] = None,
                 config: str = ""):
        self.sink_port = free_port()
        self.listen = free_port()
        self.admin = free_port()
        self.sink = Proc(
            [os.path.join(bins, "hermes-bench-sink"), "--listen", f"127.0.0.1:{self.sink_port}"],
            f"{tag}-sink",
            logdir,
            stdout_pipe=True,
        )
        config_args: List[str] = []
        if config:
            path = os.path.join(logdir, f"{tag}-collector.yaml")
            with open(path, "w", encoding="utf-8") as f:
                f.write(config)
            config_args = ["--config", path]
        self.collector = Proc(
            [
                os.path.join(bins, "hermes-collector"),
                *config_args,
                "--listen", f"127.0.0.1:{self.listen}",
                "--admin-listen", f"127.0.0.1:{self.admin}",
                "--otlp-endpoint", f"http://127.0.0.1:{self.sink_port}",
            ],
            f"{tag}-collector",
            logdir,
            env={**COLLECTOR_ENV, **(env or {})},
        )
        deadline = time.time() + 30
        while http_get(f"http://127.0.0.1:{self.admin}/readyz") is None:
            if self.collector.p.poll() is not None or time.time() > deadline:
                raise SystemExit(f"collector did not become ready (see {logdir}/{tag}-collector.log)")
            time.sleep(0.05)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.listen}"

    def metrics(self) -> Optional[str]:
        return http_get(f"http://127.0.0.1:{self.admin}/metrics")

    def wait_quiet(self, quiet_s: float = 1.0, timeout: float = 120.0) -> None:
        """Until the collector's exported-span counter stops moving."""
        last = None
        since = time.time()
        deadline = time.time() + timeout
        while time.time() < deadline:
            text = self.metrics()
            now = (metric(text, "hermes_collector_exporter_sent_spans_total"), metric(text, "hermes_collector_correlator_events_total"))
            if now != last:
                last = now
                since = time.time()
            elif time.time() - since >= quiet_s:
                return
            time.sleep(0.1)

    def stop(self) -> Dict[str, Any]:
        self.collector.stop()
        return last_json(self.sink.stop()) or {}


def last_json(out: str) -> Optional[Dict[str, Any]]:
    """The last JSON object line a helper printed (its summary), if any."""
    lines = [l for l in out.splitlines() if l.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def run_json(argv: List[str], timeout: float) -> Dict[str, Any]:
    p = subprocess.run(argv, capture_output=True, timeout=timeout, cwd=ROOT, check=False)
    summary = last_json(p.stdout.decode())
    if p.returncode != 0 or summary is None:
        raise SystemExit(f"{argv[0]} failed ({p.returncode}): {p.stderr.decode()[-2000:]}")
    return summary


def schedstat(pid: int) -> Tuple[int, int]:
    """CPU time (ns) and times scheduled of all of the process's threads
    (`/proc/PID/task/*/schedstat`: finer than the 10 ms ticks of `stat`)."""
    cpu_ns = slices = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", encoding="ascii") as f:
                run_ns, _wait_ns, timeslices = (int(v) for v in f.read().split())
        except FileNotFoundError:
            continue
        cpu_ns += run_ns
        slices += timeslices
    return cpu_ns, slices


def scenario_idle(bins: str, logdir: str, settle: float, window: float = 10.0) -> Dict[str, Any]:
    """RSS of a started collector, and what it costs while nothing comes
    (its timers) over `window` seconds."""
    rig = Rig(bins, logdir, "idle")
    time.sleep(settle)
    mem = memory(rig.collector.pid)
    cpu0, slices0 = schedstat(rig.collector.pid)
    time.sleep(window)
    cpu1, slices1 = schedstat(rig.collector.pid)
    rig.stop()
    return {
        "rss_mib": mem["VmRSS"],
        "hwm_mib": mem["VmHWM"],
        "cpu_us_per_second": (cpu1 - cpu0) / 1e3 / window,
        "wakeups_per_second": (slices1 - slices0) / window,
        "load": load(),
    }


def scenario_throughput(bins: str, logdir: str, instances: int, turns: int, batch: int,
                        tag: str = "throughput", env: Optional[Dict[str, str]] = None,
                        rounds: int = 1, config: str = "") -> Dict[str, Any]:
    """The loadgen load `rounds` times over on one collector. The result's
    fields are the last round's; `rounds` lists every round's CPU, faults
    and RSS (the first round of a young process pays for fresh memory)."""
    rig = Rig(bins, logdir, tag, env, config)
    time.sleep(0.5)
    pid = rig.collector.pid
    per_round: List[Dict[str, Any]] = []
    for _ in range(rounds):
        load_before = load()
        s0 = stat(pid)
        w0 = written_bytes(pid)
        t0 = time.time_ns()
        summary = run_json(
            [
                os.path.join(bins, "hermes-loadgen"),
                "--endpoint", rig.endpoint,
                "--instances", str(instances),
                "--turns", str(turns),
                "--batch", str(batch),
            ],
            timeout=600,
        )
        rig.wait_quiet()
        s1 = stat(pid)
        w1 = written_bytes(pid)
        events = summary["events_acked"]
        cpu = (s1["user"] + s1["system"]) - (s0["user"] + s0["system"])
        per_round.append({
            "t0": t0,
            "events": events,
            "loadgen_events_per_second": summary["events_per_second"],
            "collector_cpu_seconds": cpu,
            "collector_user_seconds": s1["user"] - s0["user"],
            "collector_system_seconds": s1["system"] - s0["system"],
            "collector_minor_faults": s1["minflt"] - s0["minflt"],
            "collector_written_mib": (w1 - w0) / (1 << 20),
            "events_per_cpu_second": events / cpu if cpu > 0 else None,
            "rss_after_mib": memory(pid)["VmRSS"],
            "load_before": load_before,
        })
    last = per_round[-1]
    mem = memory(pid)
    text = rig.metrics()
    sink = rig.stop()
    span_secs = (sink.get("last_arrival_unix_nano", last["t0"]) - last["t0"]) / 1e9
    return {
        "events": last["events"],
        "spans": sink.get("spans"),
        "collector_events": metric(text, "hermes_collector_correlator_events_total"),
        "loadgen_events_per_second": last["loadgen_events_per_second"],
        "seconds_to_last_span": span_secs,
        "events_per_second": last["events"] / span_secs if span_secs > 0 else None,
        "collector_cpu_seconds": last["collector_cpu_seconds"],
        "collector_user_seconds": last["collector_user_seconds"],
        "collector_system_seconds": last["collector_system_seconds"],
        "collector_minor_faults": last["collector_minor_faults"],
        "collector_written_mib": last["collector_written_mib"],
        "events_per_cpu_second": last["events_per_cpu_second"],
        "spans_per_cpu_second": (sink.get("spans") or 0) / rounds / last["collector_cpu_seconds"]
        if last["collector_cpu_seconds"] > 0 else None,
        "first_round_events_per_cpu_second": per_round[0]["events_per_cpu_second"],
        "rss_after_mib": mem["VmRSS"],
        "hwm_mib": mem["VmHWM"],
        "load_before": last["load_before"],
        "load_after": load(),
        "rounds": [{k: v for k, v in r.items() if k != "t0"} for r in per_round],
    }


# The collector's OTLP exporter compressing, as rotel does (relay scenario);
# --otlp-endpoint overrides the endpoint.
GZIP_CONFIG = """exporters:
  otlp:
    endpoint: http://127.0.0.1:4317
    compression: gzip
"""

# The pipeline on the runtime's worker threads (throughput_workers).
WORKERS_CONFIG = """runtime:
  pipeline: workers
"""

# The redaction rules that were the defaults before they were widened to
# what secret scanners catch (docs/BENCHMARKS.md, "Wider redaction"):
# the same load with these, against the defaults, is what the wider rules
# cost. --otlp-endpoint overrides the endpoint.
NARROW_REDACTION_CONFIG = r"""exporters:
  otlp:
    endpoint: http://127.0.0.1:4317
processing:
  redaction:
    key_names: [api_key, authorization, proxy_authorization, cookie, set_cookie,
                password, secret, token, access_token, refresh_token,
                "*_api_key", "*_token", "*_secret"]
    value_patterns:
      - '(?i)(?-u:\b)bearer\s+[a-z0-9._~+/-]+=*'
      - '(?-u:\b)sk-ant-[A-Za-z0-9_-]{16,}'
      - '(?-u:\b)sk-[A-Za-z0-9_-]{16,}'
      - '(?-u:\b)AKIA[0-9A-Z]{16}'
      - '(?-u:\b)gh[pousr]_[A-Za-z0-9]{30,}'
      - '(?-u:\b)xox[abpr]-[A-Za-z0-9-]{10,}'
      - '[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}'
"""


def wait_port(port: int, proc: Proc, what: str, timeout: float = 30.0) -> None:
    """Until `proc` accepts connections on `port`."""
    deadline = time.time() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            if proc.p.poll() is not None or time.time() > deadline:
                raise SystemExit(f"{what} did not start listening on {port}")
            time.sleep(0.05)


def wait_cpu_quiet(pid: int, quiet_s: float = 1.0, timeout: float = 120.0) -> None:
    """Until the process's CPU time stops moving (it has sent what it held)."""
    last = cpu_seconds(pid)
    since = time.time()
    deadline = time.time() + timeout
    while time.time() < deadline:
        time.sleep(0.1)
        now = cpu_seconds(pid)
        if now != last:
            last, since = now, time.time()
        elif time.time() - since >= quiet_s:
            return


def scenario_relay(bins: str, logdir: str, rotel: str, instances: int, turns: int) -> Dict[str, Any]:
    """rotel relaying to the sink the spans our collector exports for the
    throughput load: its CPU per span."""
    sink_port, grpc, http = free_port(), free_port(), free_port()
    sink = Proc(
        [os.path.join(bins, "hermes-bench-sink"), "--listen", f"127.0.0.1:{sink_port}"],
        "relay-sink", logdir, stdout_pipe=True,
    )
    relay = Proc(
        [
            rotel, "start",
            "--otlp-grpc-endpoint", f"127.0.0.1:{grpc}",
            "--otlp-http-endpoint", f"127.0.0.1:{http}",
            "--exporter", "otlp",
            "--otlp-exporter-endpoint", f"http://127.0.0.1:{sink_port}",
            "--pid-file", os.path.join(logdir, "rotel.pid"),
            "--log-file", os.path.join(logdir, "rotel-agent.log"),
        ],
        "relay-rotel", logdir,
    )
    wait_port(grpc, relay, f"rotel (see {logdir}/relay-rotel.log)")
    time.sleep(0.5)
    load_before = load()
    s0 = stat(relay.pid)
    t0 = time.time_ns()
    summary = run_json(
        [
            os.path.join(bins, "hermes-bench-driver"),
            "--endpoint", f"http://127.0.0.1:{grpc}",
            "--instances", str(instances),
            "otlp", "--turns", str(turns),
        ],
        timeout=600,
    )
    wait_cpu_quiet(relay.pid)
    s1 = stat(relay.pid)
    mem = memory(relay.pid)
    relay.stop()
    received = last_json(sink.stop()) or {}
    cpu = (s1["user"] + s1["system"]) - (s0["user"] + s0["system"])
    spans = summary["spans"]
    span_secs = (received.get("last_arrival_unix_nano", t0) - t0) / 1e9
    return {
        "spans": spans,
        "spans_at_sink": received.get("spans"),
        "requests": summary["requests"],
        "seconds_to_last_span": span_secs,
        "relay_cpu_seconds": cpu,
        "relay_user_seconds": s1["user"] - s0["user"],
        "relay_system_seconds": s1["system"] - s0["system"],
        "spans_per_cpu_second": spans / cpu if cpu > 0 else None,
        "rss_after_mib": mem["VmRSS"],
        "hwm_mib": mem["VmHWM"],
        "load_before": load_before,
        "load_after": load(),
    }


def find_rotel() -> str:
    """rotel's binary inside the bench venv's `rotel` wheel (run.sh installs it)."""
    import glob
    found = glob.glob(os.path.join(ROOT, "target", "bench-venv", "lib", "python*", "site-packages", "rotel", "rotel-agent"))
    return found[0] if found else ""


def scenario_floor(bins: str, logdir: str, decode: str, instances: int, turns: int, batch: int) -> Dict[str, Any]:
    """`hermes-bench-floor --decode DECODE` (the collector's ingest alone)
    under the throughput scenario's load: its CPU per event."""
    port = free_port()
    floor = Proc(
        [os.path.join(bins, "hermes-bench-floor"), "--listen", f"127.0.0.1:{port}", "--decode", decode],
        f"floor-{decode}",
        logdir,
        stdout_pipe=True,
        env=COLLECTOR_ENV,
    )
    wait_port(port, floor, f"hermes-bench-floor (see {logdir}/floor-{decode}.log)")
    time.sleep(0.5)
    cpu0 = cpu_seconds(floor.pid)
    summary = run_json(
        [
            os.path.join(bins, "hermes-loadgen"),
            "--endpoint", f"http://127.0.0.1:{port}",
            "--instances", str(instances),
            "--turns", str(turns),
            "--batch", str(batch),
        ],
        timeout=600,
    )
    cpu = cpu_seconds(floor.pid) - cpu0
    mem = memory(floor.pid)
    received = last_json(floor.stop()) or {}
    events = summary["events_acked"]
    return {
        "decode": decode,
        "events": events,
        "events_received": received.get("events"),
        "loadgen_events_per_second": summary["events_per_second"],
        "cpu_seconds": cpu,
        "events_per_cpu_second": events / cpu if cpu > 0 else None,
        "cpu_us_per_event": cpu * 1e6 / events if events else None,
        "hwm_mib": mem["VmHWM"],
        "load": load(),
    }


def scenario_open_turns(bins: str, logdir: str, turns: int, capture: str, settle: float) -> Dict[str, Any]:
    rig = Rig(bins, logdir, f"open{turns}")
    time.sleep(0.5)
    idle = memory(rig.collector.pid)["VmRSS"]
    driver = Proc(
        [
            os.path.join(bins, "hermes-bench-driver"),
            "--endpoint", rig.endpoint,
            # 20 agents: 500 open turns each at 10 000, below the default
            # correlator.max_open_turns_per_agent (1 000).
            "--instances", "20",
            "--capture", capture,
            "open-turns", "--turns", str(turns),
        ],
        f"open{turns}-driver",
        logdir,
        stdout_pipe=True,
    )
    assert driver.p.stdout is not None
    line = driver.p.stdout.readline().decode()
    if not line.startswith("{"):
        driver.stop()
        rig.stop()
        raise SystemExit(f"open-turns driver failed: {line!r}")
    ready = json.loads(line)
    rig.wait_quiet(quiet_s=0.5)
    time.sleep(settle)
    mem = memory(rig.collector.pid)
    open_now = metric(rig.metrics(), "hermes_collector_correlator_open_turns")
    driver.stop()
    rig.stop()
    return {
        "turns": turns,
        "capture": capture,
        "events": ready["events"],
        "open_turns_metric": open_now,
        "idle_rss_mib": idle,
        "rss_mib": mem["VmRSS"],
        "hwm_mib": mem["VmHWM"],
        "bytes_per_turn": (mem["VmRSS"] - idle) * 1024 * 1024 / turns,
        "load": load(),
    }


def scenario_delay(bins: str, logdir: str, instances: int, turns: int, speed: float,
                   sender: str, timer_args: List[str]) -> Dict[str, Any]:
    rig = Rig(bins, logdir, f"delay{speed:g}")
    time.sleep(0.5)
    pid = rig.collector.pid
    s0 = stat(pid)
    switches0 = context_switches(pid)
    extra = ["--sender", sender, *(timer_args if sender == "shim" else [])]
    summary = run_json(
        [
            os.path.join(bins, "hermes-bench-driver"),
            "--endpoint", rig.endpoint,
            "--instances", str(instances),
            "paced", "--turns", str(turns), "--speed", str(speed), *extra,
        ],
        timeout=900,
    )
    rig.wait_quiet()
    s1 = stat(pid)
    cpu = s1["user"] + s1["system"] - s0["user"] - s0["system"]
    switches = context_switches(pid) - switches0
    batches = metric(rig.metrics(), "hermes_collector_receiver_accepted_batches_total")
    sink = rig.stop()
    return {
        "instances": instances,
        "speed": speed,
        "sender": sender,
        "events": summary["events"],
        "events_per_second": summary["events_per_second"],
        "batches": batches,
        "spans": sink.get("spans"),
        "collector_cpu_seconds": cpu,
        # Collector CPU per second of the run: its share of one core.
        "collector_cpu_share": cpu / max(summary["seconds"], 1e-9),
        "collector_system_cpu_seconds": s1["system"] - s0["system"],
        "collector_minor_faults": s1["minflt"] - s0["minflt"],
        "collector_context_switches": switches,
        "delay": sink.get("delay"),
        "root_delay": sink.get("root_delay"),
        "load": load(),
    }


def scenario_idle_sender(bins: str, logdir: str, timer_args: List[str]) -> Dict[str, Any]:
    rig = Rig(bins, logdir, "idle-sender")
    try:
        summary = run_json(
            [
                os.path.join(bins, "hermes-bench-driver"),
                "--endpoint", rig.endpoint,
                "--instances", "4",
                "idle-sender", "--secs", "20", *timer_args,
            ],
            timeout=120,
        )
    finally:
        rig.stop()
    return {**summary, "load": load()}


def med(values: List[Optional[float]]) -> Optional[float]:
    vals = [v for v in values if isinstance(v, (int, float))]
    return statistics.median(vals) if vals else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bins", default=os.path.join(ROOT, "target", "dist"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--instances", type=int, default=4, help="loadgen agents")
    ap.add_argument("--turns", type=int, default=20000, help="loadgen turns per agent")
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--delay-instances", type=int, default=200)
    ap.add_argument("--delay-turns", type=int, default=8,
                    help="turns per agent in real time (3x at 5x speed, 10x at 20x)")
    ap.add_argument("--delay-runs", default="1:shim,5:shim,20:batched",
                    help="speed:sender pairs of the delay scenario (sender: shim or batched)")
    ap.add_argument("--idle-poll-max-ms", type=int, default=None,
                    help="the shim sender's idle_poll_max in the delay and idle_sender scenarios (default: the shim's)")
    ap.add_argument("--idle-sleep-after-ms", type=int, default=None,
                    help="the shim sender's idle_sleep_after in the delay and idle_sender scenarios "
                         "(default: the shim's; a large value: it never stops its timer)")
    ap.add_argument("--rotel", default="",
                    help="rotel's binary for the relay scenario (default: the bench venv's rotel wheel)")
    ap.add_argument("--scenarios", default="idle,throughput,open_turns,delay")
    ap.add_argument("--gzip-level", type=int, default=None,
                    help="exporters.otlp.compression_level of throughput_gzip (default: the collector's)")
    ap.add_argument("--logdir", default="")
    ap.add_argument("--worker-threads", type=int, default=0,
                    help="the collector's runtime.worker_threads (via TOKIO_WORKER_THREADS); 0: its default")
    args = ap.parse_args()
    if args.worker_threads > 0:
        COLLECTOR_ENV["TOKIO_WORKER_THREADS"] = str(args.worker_threads)
    logdir = args.logdir or tempfile.mkdtemp(prefix="hermes-bench-")
    os.makedirs(logdir, exist_ok=True)
    scenarios = args.scenarios.split(",")
    gzip_config = GZIP_CONFIG
    if args.gzip_level is not None:
        gzip_config += f"    compression_level: {args.gzip_level}\n"
    timer_args: List[str] = []
    if args.idle_poll_max_ms is not None:
        timer_args += ["--idle-poll-max-ms", str(args.idle_poll_max_ms)]
    if args.idle_sleep_after_ms is not None:
        timer_args += ["--idle-sleep-after-ms", str(args.idle_sleep_after_ms)]
    runs: Dict[str, List[Dict[str, Any]]] = {}

    def record(key: str, value: Dict[str, Any]) -> None:
        runs.setdefault(key, []).append(value)
        print(f"# {key}: {json.dumps(value)}", file=sys.stderr, flush=True)

    for _ in range(args.repeats):
        if "idle" in scenarios:
            record("idle", scenario_idle(args.bins, logdir, settle=2.0))
        if "throughput" in scenarios:
            record("throughput", scenario_throughput(args.bins, logdir, args.instances, args.turns, args.batch))
        if "throughput_warm" in scenarios:
            record("throughput_warm", scenario_throughput(
                args.bins, logdir, args.instances, args.turns, args.batch,
                tag="throughput-warm", rounds=3))
        if "throughput_gzip" in scenarios:
            record("throughput_gzip", scenario_throughput(
                args.bins, logdir, args.instances, args.turns, args.batch,
                tag="throughput-gzip", config=gzip_config))
        if "throughput_narrow_redaction" in scenarios:
            record("throughput_narrow_redaction", scenario_throughput(
                args.bins, logdir, args.instances, args.turns, args.batch,
                tag="throughput-narrow-redaction", config=NARROW_REDACTION_CONFIG))
        if "relay" in scenarios:
            rotel = args.rotel or find_rotel()
            if not rotel or not os.path.exists(rotel):
                raise SystemExit("relay: no rotel binary (pip install rotel==0.0.1a15 into target/bench-venv, or --rotel PATH)")
            record("relay", scenario_relay(args.bins, logdir, rotel, args.instances, args.turns))
        if "throughput_workers" in scenarios:
            record("throughput_workers", scenario_throughput(
                args.bins, logdir, args.instances, args.turns, args.batch,
                tag="throughput-workers", config=WORKERS_CONFIG))
        for decode in ("full", "views", "seqs"):
            if f"floor_{decode}" in scenarios:
                record(f"floor_{decode}", scenario_floor(args.bins, logdir, decode, args.instances, args.turns, args.batch))
        if "idle_sender" in scenarios:
            record("idle_sender", scenario_idle_sender(args.bins, logdir, timer_args))
        if "open_turns" in scenarios:
            for n in (1000, 10000):
                record(f"open_turns_{n}", scenario_open_turns(args.bins, logdir, n, "metadata", settle=1.0))
            record("open_turns_10000_content", scenario_open_turns(args.bins, logdir, 10000, "content", settle=1.0))
        if "delay" in scenarios:
            # Real time (--delay-turns turns per agent); faster runs take
            # more turns (5x: 3x the turns, 20x: 10x), a few seconds each.
            for run in args.delay_runs.split(","):
                speed_text, _, sender = run.partition(":")
                speed = float(speed_text)
                turns = args.delay_turns * {1.0: 1, 5.0: 3, 20.0: 10}.get(speed, max(1, round(speed / 2)))
                record(
                    f"delay_x{speed:g}",
                    scenario_delay(args.bins, logdir, args.delay_instances, turns, speed,
                                   sender or "shim", timer_args),
                )

    medians: Dict[str, Any] = {}
    for key, values in runs.items():
        m: Dict[str, Any] = {}
        for field in values[0]:
            if isinstance(values[0][field], dict):
                m[field] = {
                    sub: med([v[field].get(sub) if isinstance(v.get(field), dict) else None for v in values])
                    for sub in values[0][field]
                }
            elif isinstance(values[0][field], (int, float)):
                m[field] = med([v.get(field) for v in values])
        m["loads"] = [v.get("load") or v.get("load_before") for v in values]
        medians[key] = m
    print(json.dumps({"logdir": logdir, "repeats": args.repeats, "runs": runs, "medians": medians}))


if __name__ == "__main__":
    main()
