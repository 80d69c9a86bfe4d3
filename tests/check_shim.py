"""Checks the installed `hermes_collector` wheel against a collector.

Run by `tests/python_e2e.rs` (`HERMES_SHIM_PYTHON=/path/to/python cargo test
-p hermes-collector-shim --test python_e2e`), which hosts an in-process
collector and passes its address in HERMES_COLLECTOR_ENDPOINT. The script
replays the recorded hook calls of a fixture through the registered
callables, mutates tool `args` after the calls return, calls hooks from a
named worker thread and from a forked child, flushes, and prints one JSON
line per process (`{"role": ..., "stats": ...}`) for the Rust side to compare
with what the collector received. Also checks, in subprocesses, the lean and
disabled levels, that the sender thread runs as soon as the plugin registers
(no hook call starts it), and that flush and interpreter exit stay bounded
when the collector is down.

Usage: check_shim.py FIXTURE.jsonl
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import hermes_collector


class FakeCtx:
    def __init__(self) -> None:
        self.hooks: dict = {}

    def register_hook(self, name, callback) -> None:
        self.hooks[name] = callback


def emit(role: str, **extra) -> None:
    print(json.dumps({"role": role, "stats": hermes_collector.stats(), **extra}), flush=True)


def subprocess_checks() -> None:
    python = sys.executable
    # lean: no pre_api_request; disabled: nothing.
    code = (
        "import hermes_collector as h\n"
        "class C:\n"
        "    def __init__(s): s.h = []\n"
        "    def register_hook(s, n, c): s.h.append(n)\n"
        "c = C(); h.register(c); print(len(c.h), 'pre_api_request' in c.h)\n"
    )
    env = dict(os.environ, HERMES_COLLECTOR_CAPTURE="lean")
    out = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["14", "False"], out.stdout
    env = dict(os.environ, HERMES_COLLECTOR_DISABLED="1")
    out = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0", "False"], out.stdout
    # Bad value: a warning where the host's logging sends it (Hermes: its
    # log files; here stderr), default used, no exception.
    env = dict(os.environ, HERMES_COLLECTOR_QUEUE_EVENTS="lots")
    logged = "import logging; logging.basicConfig()\n" + code
    out = subprocess.run([python, "-c", logged], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["15", "True"], out.stdout
    assert "HERMES_COLLECTOR_QUEUE_EVENTS" in out.stderr, out.stderr

    # The plugin sets up when it registers, never on a hook call: its sender
    # thread runs before the first hook fires (a thread's name is in
    # /proc, cut to 15 bytes, and set by the thread itself as it starts).
    code = (
        "import os, time, hermes_collector as h\n"
        "def senders():\n"
        "    names = []\n"
        "    for t in os.listdir('/proc/self/task'):\n"
        "        with open(f'/proc/self/task/{t}/comm') as f: names.append(f.read().strip())\n"
        "    return names.count('hermes-collecto')\n"
        "before = senders()\n"
        "class C:\n"
        "    def register_hook(s, n, c): pass\n"
        "h.register(C())\n"
        "deadline = time.monotonic() + 5\n"
        "while senders() == 0 and time.monotonic() < deadline: time.sleep(0.01)\n"
        "print(before, senders(), h.stats()['enqueued'])\n"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0", "1", "0"], out.stdout

    # Collector down: flush and exit are bounded.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = (
        "import time, hermes_collector as h\n"
        "class C:\n"
        "    def __init__(s): s.h = {}\n"
        "    def register_hook(s, n, c): s.h[n] = c\n"
        "c = C(); h.register(c)\n"
        "for i in range(100): c.h['pre_tool_call'](tool_name='t', args={'i': i})\n"
        "t = time.monotonic(); ok = h.flush(300); dt = time.monotonic() - t\n"
        "assert not ok and 0.25 < dt < 1.5, (ok, dt)\n"
    )
    env = dict(
        os.environ,
        HERMES_COLLECTOR_ENDPOINT=f"http://127.0.0.1:{port}",
        HERMES_COLLECTOR_EXIT_FLUSH_MS="500",
    )
    started = time.monotonic()
    subprocess.run([python, "-c", code], env=env, check=True, timeout=30)
    elapsed = time.monotonic() - started
    assert elapsed < 10, f"exit took {elapsed:.1f}s"


def wait_until(done, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"{what}: {hermes_collector.stats()}"
        time.sleep(0.01)


def sender_policies() -> list:
    """The scheduling policy of each of this process's sender threads (comm
    "hermes-collecto", the thread name cut to 15 bytes)."""
    policies = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        if name == "hermes-collecto":
            policies.append(os.sched_getscheduler(int(tid)))
    return policies


def main() -> None:
    fixture = sys.argv[1]
    ctx = FakeCtx()
    hermes_collector.register(ctx)
    assert len(ctx.hooks) == 15, sorted(ctx.hooks)
    assert not any(h.startswith("transform_") for h in ctx.hooks)

    calls = [json.loads(line) for line in open(fixture) if line.strip()]
    replayed = []
    for call in calls:
        callback = ctx.hooks.get(call["hook"])
        if callback is None:
            continue
        kwargs = call["kwargs"]
        assert callback(**kwargs) is None
        replayed.append(call["hook"])
        # The agent mutates tool args after the hook returned.
        if isinstance(kwargs.get("args"), dict):
            kwargs["args"]["command"] = "MUTATED"
            kwargs["args"]["extra"] = [1, 2, 3]

    def worker() -> None:
        ctx.hooks["post_tool_call"](tool_name="w", args={"k": "v"}, status="ok", duration_ms=3)

    t = threading.Thread(target=worker, name="worker-7")
    t.start()
    t.join()
    replayed.append("post_tool_call")

    # Hooks must never raise, whatever they are given.
    assert ctx.hooks["post_api_request"](1, 2, usage="weird", api_duration=object()) is None
    replayed.append("post_api_request")

    assert hermes_collector.flush(10_000), hermes_collector.stats()
    # Waking the sender must never preempt the agent's thread.
    if sys.platform.startswith("linux"):
        assert sender_policies() == [os.SCHED_BATCH], sender_policies()
    # Idle, the sender stops its timer; a hook that does not wake it
    # otherwise (no flush) then gets its event out.
    wait_until(lambda: hermes_collector.stats()["asleep"], "the sender never fell asleep", 30.0)
    acked = hermes_collector.stats()["acked_events"]
    ctx.hooks["post_tool_call"](tool_name="after-sleep", args={}, status="ok", duration_ms=1)
    wait_until(lambda: hermes_collector.stats()["acked_events"] > acked,
               "a hook did not wake the asleep sender")
    replayed.append("post_tool_call")
    emit("parent", hooks=replayed)

    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        ctx.hooks["on_session_start"](session_id="child-session", model="m", platform="cli")
        ok = hermes_collector.flush(10_000)
        if sys.platform.startswith("linux"):
            ok = ok and sender_policies() == [os.SCHED_BATCH]
        os.write(write_fd, json.dumps({"ok": ok, "stats": hermes_collector.stats()}).encode())
        os._exit(0 if ok else 1)
    os.close(write_fd)
    _, status = os.waitpid(pid, 0)
    child = json.loads(os.read(read_fd, 65536).decode())
    assert status == 0, child
    emit("child", child=child["stats"])

    subprocess_checks()
    emit("done")


if __name__ == "__main__":
    main()
