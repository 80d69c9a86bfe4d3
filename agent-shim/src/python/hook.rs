//! The hook callables: the hot path.
//!
//! Owns: [`hook_callback`], which makes the callable registered for one hook
//! name; Hermes calls it synchronously on the agent's (or a tool worker's)
//! thread.
//!
//! Invariants of a call:
//! - Always returns `None` and never raises: every error is swallowed and a
//!   Rust panic is caught (PyO3 would turn it into `PanicException`, a
//!   `BaseException` that Hermes' `except Exception` does not catch).
//! - Never blocks and never does I/O: it takes the cached thread name, stamps
//!   the wall and monotonic clocks, takes a sequence number and `try_send`s a
//!   reference to the kwargs dict onto the bounded queue; a full queue drops
//!   the event and counts it. It makes no system call, except for the hooks
//!   that end a session or a subagent, which wake the sender (see
//!   [`wakes_sender`]).
//! - Reads Python state only on the calling thread and only at hook time:
//!   the thread name (fetched once per OS thread, then cached in a
//!   `thread_local!`), and at capture level `content` a deep JSON copy of
//!   `args` when it is a dict or list (the agent mutates it after the hook
//!   returns). The kwargs dict is the call's own (see [`owned_kwargs`]) and
//!   everything else in it is fresh per call or immutable, so the sender may
//!   read it later.
//! - The clock stamps, the sequence number and the push happen with no Python
//!   code in between, so the GIL orders them across threads: queue order is
//!   seq order and seq order is capture order.
//! - Once the interpreter exits (`shutdown` ran) the call converts its
//!   kwargs to the event itself, on its thread, before stamping: the only
//!   extra work of the normal path is one atomic load.

use std::cell::OnceCell;
use std::ffi::{CStr, CString};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use pyo3::types::{PyCFunction, PyDict, PyList, PyTuple};

use super::core::{CORE, HookItem};
use super::pyjson::to_json;
use crate::config::wakes_sender;

thread_local! {
    static THREAD_NAME: OnceCell<Arc<str>> = const { OnceCell::new() };
}

/// Fetches and caches the calling thread's name before its first hook.
pub(super) fn cache_thread_name(py: Python<'_>) {
    let _ = thread_name(py);
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

/// `hermes_collector._core.hook_callback(hook)`: the callable registered for
/// one hook, `callback(**kwargs) -> None`.
///
/// A built-in function (`METH_VARARGS | METH_KEYWORDS`) rather than an object
/// with `__call__`: CPython hands it the kwargs dict as it is, where a
/// `#[pymethods] __call__(**kwargs)` would copy it key by key into a new
/// dict, several times slower for a hook with ~20 keywords
/// (`benches/hook_cost.py`, `docs/BENCHMARKS.md`).
#[pyfunction]
pub(super) fn hook_callback<'py>(py: Python<'py>, hook: &str) -> PyResult<Bound<'py, PyCFunction>> {
    let name: Arc<str> = Arc::from(hook);
    let urgent = wakes_sender(hook);
    PyCFunction::new_closure(
        py,
        Some(callable_name(hook)),
        Some(c"Hermes hook callback of hermes_collector: queues the call and returns None."),
        move |args: &Bound<'_, PyTuple>, kwargs: Option<&Bound<'_, PyDict>>| {
            let py = args.py();
            let _ =
                std::panic::catch_unwind(AssertUnwindSafe(|| capture(py, &name, urgent, kwargs)));
            py.None()
        },
    )
}

/// `hermes_collector.<hook>` as a C string for the function's `__name__`,
/// made once per distinct hook name and kept for the life of the process
/// (CPython keeps a pointer to it; hook names are a small fixed set).
fn callable_name(hook: &str) -> &'static CStr {
    static NAMES: Mutex<Vec<&'static CStr>> = Mutex::new(Vec::new());
    let wanted = format!("hermes_collector.{hook}");
    let Ok(mut names) = NAMES.lock() else {
        return c"hermes_collector.hook";
    };
    if let Some(&known) = names.iter().find(|n| n.to_bytes() == wanted.as_bytes()) {
        return known;
    }
    let Ok(name) = CString::new(wanted) else {
        return c"hermes_collector.hook";
    };
    let name: &'static CStr = Box::leak(name.into_boxed_c_str());
    names.push(name);
    name
}

fn capture(py: Python<'_>, hook: &Arc<str>, urgent: bool, kwargs: Option<&Bound<'_, PyDict>>) {
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
    let kwargs = kwargs.and_then(owned_kwargs);
    let guard = CORE.load();
    let Some(core) = guard.as_ref() else {
        return;
    };
    let item = HookItem {
        seq: 0,
        time_unix_nano: 0,
        mono_nano: 0,
        hook: Arc::clone(hook),
        thread,
        kwargs,
        args_json,
        event: None,
    };
    if core.is_exiting() {
        // The interpreter is exiting: the sender may no longer read the
        // kwargs, so this thread converts them (see `super::exit`).
        core.enqueue_converted(py, item);
    } else {
        core.enqueue(item, urgent);
    }
}

/// A reference to a kwargs dict that no one else can change: the dict itself
/// when the call holds its only reference (CPython builds a fresh dict for
/// every `cb(**kwargs)` and `cb(key=value)` call, so this is the case for
/// every call from Python code), else a shallow copy (a C caller passing a
/// dict it keeps).
fn owned_kwargs(kwargs: &Bound<'_, PyDict>) -> Option<Py<PyDict>> {
    if kwargs.get_refcnt() <= 1 {
        Some(kwargs.clone().unbind())
    } else {
        // None only if the copy fails (out of memory): the event is still
        // queued, without its kwargs.
        kwargs.copy().ok().map(Bound::unbind)
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
