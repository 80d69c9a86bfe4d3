//! The hook callables: the hot path.
//!
//! Owns: [`HookCallback`], one instance per hook name, which Hermes calls
//! synchronously on the agent's (or a tool worker's) thread.
//!
//! Invariants of `__call__`:
//! - Always returns `None` and never raises: every error is swallowed and a
//!   Rust panic is caught (PyO3 would turn it into `PanicException`, a
//!   `BaseException` that Hermes' `except Exception` does not catch).
//! - Never blocks and never does I/O: it takes the cached thread name, stamps
//!   the wall and monotonic clocks, takes a sequence number and `try_send`s a
//!   reference to the kwargs dict onto the bounded queue; a full queue drops
//!   the event and counts it. It makes no system call, except for the hooks
//!   that end a turn or session, which wake the sender (see [`is_urgent`]).
//! - Reads Python state only on the calling thread and only at hook time:
//!   the thread name (fetched once per OS thread, then cached in a
//!   `thread_local!`), and at capture level `content` a deep JSON copy of
//!   `args` when it is a dict or list (the agent mutates it after the hook
//!   returns). Everything else in the kwargs dict is fresh per call or
//!   immutable, so the sender may read it later.
//! - The clock stamps, the sequence number and the push happen with no Python
//!   code in between, so the GIL orders them across threads: queue order is
//!   seq order and seq order is capture order.

use std::cell::OnceCell;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use hermes_proto::hooks;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use super::core::{CORE, HookItem};
use super::pyjson::to_json;

thread_local! {
    static THREAD_NAME: OnceCell<Arc<str>> = const { OnceCell::new() };
}

/// The Python name of the calling thread, fetched once per OS thread.
fn thread_name(py: Python<'_>) -> Arc<str> {
    if let Some(name) = THREAD_NAME.try_with(|c| c.get().cloned()).ok().flatten() {
        return name;
    }
    let fetched = py
        .import("threading")
        .and_then(|t| t.call_method0("current_thread"))
        .and_then(|t| t.getattr("name"))
        .and_then(|n| n.extract::<String>());
    match fetched {
        Ok(name) => {
            let name: Arc<str> = Arc::from(name);
            let _ = THREAD_NAME.try_with(|c| c.set(Arc::clone(&name)));
            name
        }
        Err(_) => Arc::from("unknown"),
    }
}

/// A hook callable for one hook name: `callback(**kwargs) -> None`.
#[pyclass(frozen, module = "hermes_collector._core")]
pub struct HookCallback {
    hook: Arc<str>,
    /// Whether the sender is woken to send this event at once.
    urgent: bool,
}

/// Hooks that end a turn or a session: the process may exit right after them
/// (e.g. through `os._exit`, which skips the exit flush), so their events go
/// out at once instead of on the sender's next look at the queue. Waking the
/// sender costs the hook a system call when the sender is parked.
fn is_urgent(hook: &str) -> bool {
    matches!(
        hook,
        hooks::POST_LLM_CALL
            | hooks::ON_SESSION_END
            | hooks::ON_SESSION_FINALIZE
            | hooks::SUBAGENT_STOP
    )
}

#[pymethods]
impl HookCallback {
    #[new]
    fn new(hook: &str) -> Self {
        HookCallback {
            hook: Arc::from(hook),
            urgent: is_urgent(hook),
        }
    }

    /// The hook name.
    #[getter]
    fn hook(&self) -> &str {
        &self.hook
    }

    /// Name shown in Hermes' hook warnings.
    #[getter(__name__)]
    fn name(&self) -> String {
        format!("hermes_collector.{}", self.hook)
    }

    fn __repr__(&self) -> String {
        format!("<hermes_collector hook {}>", self.hook)
    }

    #[pyo3(signature = (*_args, **kwargs))]
    fn __call__(
        &self,
        py: Python<'_>,
        _args: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) {
        let _ = std::panic::catch_unwind(AssertUnwindSafe(|| self.capture(py, kwargs)));
    }
}

impl HookCallback {
    fn capture(&self, py: Python<'_>, kwargs: Option<&Bound<'_, PyDict>>) {
        let snapshot_args = match CORE.load().as_ref() {
            Some(core) => core.config.capture.captures_content(),
            None => return,
        };
        // Python code may run (and the GIL switch threads) only up to here.
        let thread = thread_name(py);
        let args_json = if snapshot_args {
            kwargs.and_then(snapshot_mutable_args)
        } else {
            None
        };
        let guard = CORE.load();
        let Some(core) = guard.as_ref() else {
            return;
        };
        core.enqueue(
            HookItem {
                seq: 0,
                time_unix_nano: 0,
                mono_nano: 0,
                hook: Arc::clone(&self.hook),
                thread,
                kwargs: kwargs.map(|k| k.clone().unbind()),
                args_json,
            },
            self.urgent,
        );
    }
}

/// JSON text of `args` when it is a dict or list (mutable: the agent may
/// change it after the hook returns). Immutable values are read later.
fn snapshot_mutable_args(kwargs: &Bound<'_, PyDict>) -> Option<String> {
    let args = kwargs.get_item("args").ok().flatten()?;
    if args.is_instance_of::<PyDict>() || args.is_instance_of::<PyList>() {
        Some(to_json(&args))
    } else {
        None
    }
}
