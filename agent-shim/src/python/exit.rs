//! The exit path: the interpreter's `atexit` step (`shutdown`) and the
//! process-exit callback that runs after the interpreter is gone.
//!
//! Owns: [`shutdown`] (the Python function the `atexit` handler calls),
//! [`register_process_exit`] and the C-level callback it registers with
//! `Py_AtExit`.
//!
//! Why two steps: Hermes runs background work (0.18's `delegate_task`
//! under `hermes -z`) on daemon threads, which keep running, and firing
//! hooks, through every `atexit` handler until the interpreter's
//! finalization stops them. `shutdown` runs among those handlers, so hooks
//! fire after it too. It switches the hook path to converting each event on
//! its own thread (no interpreter needed later), flushes, and seals the
//! sender's gate. `Py_AtExit` callbacks run after finalization, when no hook
//! can fire any more: the callback queues the [`hooks::PROCESS_EXIT`] marker
//! behind the last hook and delivers what is left within what remains of
//! `HERMES_COLLECTOR_EXIT_FLUSH_MS` (at least [`FINAL_MIN_WAIT`]), then
//! spools the rest (with a spool). What neither can deliver or spool is lost
//! with the process.
//!
//! Invariants:
//! - The callback calls no Python API: it only reads the core (an
//!   `ArcSwapOption` load), queues ready events and waits on atomics.
//! - Every wait is bounded; with no stream open and a spool, nothing waits
//!   for a collector that is down.
//! - The callback never unwinds into the interpreter (panics are caught).

use std::sync::Arc;
use std::sync::Once;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use hermes_proto::hooks;
use hermes_proto::v1::Event;
use pyo3::prelude::*;

use super::core::{CORE, Core};

/// How long `shutdown` waits for the sender to leave the interpreter at least.
const MIN_SEAL_WAIT: Duration = Duration::from_millis(200);
/// Longest exit flush while no stream to the collector is open: waiting the
/// whole `HERMES_COLLECTOR_EXIT_FLUSH_MS` for a collector that is down would
/// only delay the agent's exit.
const DISCONNECTED_EXIT_WAIT: Duration = Duration::from_millis(250);
/// Longest wait at exit for the sender to write the spool file.
const SPOOL_EXIT_WAIT: Duration = Duration::from_secs(1);
/// Longest wait at exit for the sender's exit notices.
const REPORT_EXIT_WAIT: Duration = Duration::from_millis(500);
/// The process-exit callback waits at least this long for its events (the
/// late hooks and the marker) while a stream is open, even when `shutdown`
/// used the whole exit budget.
pub(super) const FINAL_MIN_WAIT: Duration = Duration::from_millis(100);

/// Interpreter exit (`atexit`): from now on hooks convert their own events;
/// flush up to `timeout_ms` (with a spool: then write what is left to the
/// spool), have the sender log its exit notices (an outage not reported
/// yet, events not delivered), then stop the sender from attaching to the
/// interpreter again.
/// Returns whether every event was delivered or spooled.
#[pyfunction]
pub(super) fn shutdown(py: Python<'_>, timeout_ms: u64) -> bool {
    let Some(core) = CORE.load_full() else {
        return true;
    };
    // GIL held: no hook is between its check and its push.
    core.begin_exit();
    let started = Instant::now();
    let spool = core.config.spool_dir.is_some() && core.started.load(Ordering::Acquire);
    let timeout = exit_wait(&core, Duration::from_millis(timeout_ms), spool);
    let mut flushed = core.flush(py, timeout);
    // A move's handoff still on its way gets what is left of the wait.
    let shared = Arc::clone(&core.shared);
    let left = timeout.saturating_sub(started.elapsed());
    py.detach(move || shared.wait_handoffs(left));
    if !flushed && spool {
        let shared = Arc::clone(&core.shared);
        let target = core.tx.counters().enqueued();
        flushed = py.detach(move || {
            shared.spool_and_wait(SPOOL_EXIT_WAIT) && shared.settled_events() >= target
        });
    }
    if core.started.load(Ordering::Acquire) {
        let shared = Arc::clone(&core.shared);
        let target = core.tx.counters().enqueued();
        py.detach(move || shared.report_exit_and_wait(target, REPORT_EXIT_WAIT));
    }
    let seal_wait = timeout.saturating_sub(started.elapsed()).max(MIN_SEAL_WAIT);
    let gate = Arc::clone(&core.gate);
    py.detach(move || gate.seal_and_wait(seal_wait));
    flushed
}

/// How long to wait for acknowledgements, at most `budget`: not at all
/// with a spool while no stream is open (nothing is lost by spooling at
/// once), [`DISCONNECTED_EXIT_WAIT`] without one.
fn exit_wait(core: &Core, budget: Duration, spool: bool) -> Duration {
    if core.shared.is_connected() {
        budget
    } else if spool {
        Duration::ZERO
    } else {
        budget.min(DISCONNECTED_EXIT_WAIT)
    }
}

/// Registers the process-exit callback with the interpreter, once per
/// process (a forked child inherits the registration).
///
/// The one `unsafe` call of the shim: CPython offers no safe way to run
/// code after finalization, the only point where no hook can fire any more.
#[allow(unsafe_code)]
pub(super) fn register_process_exit() {
    static REGISTERED: Once = Once::new();
    REGISTERED.call_once(|| {
        // SAFETY: `Py_AtExit` only records the function pointer; it is
        // called with the GIL held (configure is a Python function), and
        // the callback is a plain `extern "C" fn()` that never unwinds.
        unsafe {
            pyo3::ffi::Py_AtExit(Some(at_process_exit));
        }
    });
}

extern "C" fn at_process_exit() {
    let _ = std::panic::catch_unwind(final_flush);
}

/// After finalization: queue the exit marker behind every hook, deliver
/// within the budget, spool the rest.
fn final_flush() {
    let Some(core) = CORE.load_full() else {
        return;
    };
    if !core.started.load(Ordering::Acquire) {
        // Nothing was ever captured (or the plugin registered no hook).
        return;
    }
    // Normally sealed by `shutdown` already; never attach from here on.
    core.gate.seal_and_wait(MIN_SEAL_WAIT);
    let marker = Event {
        hook: hooks::PROCESS_EXIT.to_owned(),
        thread: "MainThread".to_owned(),
        ..Default::default()
    };
    core.enqueue_event(
        marker,
        Arc::from(hooks::PROCESS_EXIT),
        Arc::from("MainThread"),
    );
    let budget = Duration::from_millis(core.config.exit_flush_ms);
    let used = core
        .exit_started
        .lock()
        .ok()
        .and_then(|s| s.map(|t| t.elapsed()))
        .unwrap_or_default();
    let spool = core.config.spool_dir.is_some();
    let wait = exit_wait(
        &core,
        budget.saturating_sub(used).max(FINAL_MIN_WAIT),
        spool,
    );
    let target = core.tx.counters().enqueued();
    if !core.shared.wait_settled(target, wait) && spool {
        core.shared.spool_and_wait(SPOOL_EXIT_WAIT);
    }
}
