//! The PyO3 extension module `hermes_collector._core`.
//!
//! Owns: the Python-facing API of the core — [`hook::hook_callback`] (makes the
//! hook callables Hermes calls), `configure`, `flush`, `shutdown`, `stats` and
//! `after_fork_in_child` — and everything that touches Python objects:
//! the process-wide core ([`core`]), the hook-time snapshot of `args`
//! ([`pyjson`]) and reading kwargs dicts on the sender thread ([`kwargs`]).
//!
//! Invariants: no function here raises into Hermes from a hook call; waits
//! (`flush`, `shutdown`) release the GIL; the sender thread attaches to the
//! interpreter only through the exit gate in [`core`], so it never touches a
//! finalizing interpreter; hooks that fire while the interpreter exits, and
//! the process-exit marker, are delivered or spooled by [`exit`].

mod core;
mod exit;
mod hook;
mod kwargs;
mod pyjson;

use pyo3::prelude::*;

/// `hermes_collector._core`.
#[pymodule]
#[pyo3(name = "_core")]
fn core_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", crate::SHIM_VERSION)?;
    m.add("SENDER_THREAD_NAME", crate::sender::THREAD_NAME)?;
    m.add_function(wrap_pyfunction!(hook::hook_callback, m)?)?;
    m.add_function(wrap_pyfunction!(core::configure, m)?)?;
    m.add_function(wrap_pyfunction!(core::flush, m)?)?;
    m.add_function(wrap_pyfunction!(exit::shutdown, m)?)?;
    m.add_function(wrap_pyfunction!(core::stats, m)?)?;
    m.add_function(wrap_pyfunction!(core::after_fork_in_child, m)?)?;
    Ok(())
}
