"""Hermes observer plugin that forwards hook calls to the hermes collector.

Hermes loads this module through the ``hermes_agent.plugins`` entry point and
calls :func:`register`. Each registered hook callable is implemented in Rust
(made by ``hermes_collector._core.hook_callback``): it stamps the call, queues a
reference to its kwargs on a bounded queue and returns ``None`` at once. A
background thread (``hermes-collector-sender``) converts, batches and streams
the events to the collector over gRPC.

Configuration comes from ``HERMES_COLLECTOR_*`` environment variables (see
README.md). Nothing here raises into Hermes: bad settings are logged as
warnings and replaced by defaults. The ``hermes_collector`` logger also says,
once, when the collector cannot be reached (endpoint, for how long, what
happens to the events), when it is reachable again, and at exit what was not
delivered; Hermes writes these records to ``agent.log`` (warnings to
``errors.log`` too), never to the terminal. With ``HERMES_COLLECTOR_SPOOL_DIR`` set,
what the bounded exit flush cannot deliver is written to a spool file there
and sent by the next process that starts the plugin with the same directory.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import sys
import threading
from typing import Any, Dict, Optional

from . import _core

__all__ = ["register", "flush", "stats"]
__version__: str = _core.__version__

_log = logging.getLogger("hermes_collector")

_ENV_PREFIX = "HERMES_COLLECTOR_"
_DEFAULT_EXIT_FLUSH_MS = 2000

_lock = threading.Lock()
_process_hooks_installed = False
_exit_flush_ms = _DEFAULT_EXIT_FLUSH_MS
_exited = False


class _ExitHandler(logging.NullHandler):
    """The ``hermes_collector`` logger's own handler. Records reach Hermes'
    handlers (agent.log, errors.log) by propagation; without any handler
    configured (logging not set up yet), this one keeps Python's last-resort
    handler from printing them on the user's terminal.

    It also runs the plugin's exit step when ``logging.shutdown()`` closes
    it: ``hermes -z`` (Hermes 0.19) calls that just before ``os._exit``,
    which skips ``atexit``, so the last turn's events still leave without
    their hooks waking the sender. ``logging.config.dictConfig`` closes
    every handler too, without exiting: skipped (it also forgets them, so a
    host that reconfigures logging that way and then leaves through
    ``os._exit`` loses what the sender had not sent; Hermes 0.19 does not).
    """

    def close(self) -> None:
        try:
            caller = sys._getframe(1).f_back  # the caller of logging.shutdown
            if caller is None or caller.f_code.co_name != "_clearExistingHandlers":
                _at_exit()
        except Exception:
            pass
        super().close()


_log.addHandler(_ExitHandler())


def _environment() -> Dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith(_ENV_PREFIX)}


def _host_name() -> str:
    try:
        return socket.gethostname()
    except Exception:
        return ""


def register(ctx: Any) -> None:
    """Hermes plugin entry point: registers one callable per captured hook."""
    try:
        settings = _core.configure(_environment(), _host_name())
        for warning in settings["warnings"]:
            _log.warning("hermes_collector: %s", warning)
        if settings["disabled"]:
            _log.info("hermes_collector: disabled by HERMES_COLLECTOR_DISABLED")
            return
        _install_process_hooks(settings["exit_flush_ms"])
        for name in settings["hooks"]:
            ctx.register_hook(name, _core.hook_callback(name))
    except Exception as exc:  # never raise into Hermes
        _log.warning("hermes_collector: not registered: %s", exc)


def flush(timeout_ms: Optional[int] = None) -> bool:
    """Waits up to ``timeout_ms`` (default: HERMES_COLLECTOR_EXIT_FLUSH_MS)
    until every event captured so far is acknowledged by the collector.

    Releases the GIL while waiting. Returns True if everything was
    acknowledged (or accounted as lost), False on timeout.
    """
    try:
        ms = _exit_flush_ms if timeout_ms is None else max(0, int(timeout_ms))
        return bool(_core.flush(ms))
    except Exception as exc:
        _log.warning("hermes_collector: flush failed: %s", exc)
        return False


def stats() -> Dict[str, Any]:
    """The shim's release (``version``, as ``__version__``) and its
    counters: enqueued, dropped, sent_batches, acked_events,
    unacked_batches, connected, the disk spool's spooled_events,
    spool_dropped_events, replayed_events, replayed_files (and a few
    diagnostics)."""
    return dict(_core.stats())


def _at_exit() -> None:
    # From here on hooks (background daemon threads keep firing them until
    # the interpreter finalizes) convert their own events; a callback after
    # finalization delivers or spools them with the exit marker. Once per
    # process: from atexit, or from logging.shutdown (_ExitHandler).
    global _exited
    with _lock:
        if _exited or not _process_hooks_installed:
            return
        _exited = True
    try:
        _core.shutdown(_exit_flush_ms)
    except Exception:
        pass


def _after_fork_in_child() -> None:
    try:
        _core.after_fork_in_child()
    except Exception:
        pass


def _install_process_hooks(exit_flush_ms: int) -> None:
    global _process_hooks_installed, _exit_flush_ms
    with _lock:
        _exit_flush_ms = exit_flush_ms
        if _process_hooks_installed:
            return
        atexit.register(_at_exit)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_after_fork_in_child)
        _process_hooks_installed = True
