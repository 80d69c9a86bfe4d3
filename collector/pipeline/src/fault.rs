//! Fault injection into the pipeline's stages, for the tests of the
//! supervisor: `HERMES_COLLECTOR_TEST_FAULT=<stage>:<panic|return>:<ms>`
//! makes the stage named (`correlator` or `exporter`) panic, or return as if
//! it had finished, that many milliseconds after the start.
//!
//! Compiled into debug builds only (the binaries the tests run): a release
//! build ignores the variable, and [`stage`] is the stage itself.

use std::future::Future;

/// Runs `work`, the task of the stage `name`; in a debug build with a fault
/// injected for `name`, panics or returns `early()` at the fault's time.
#[cfg(debug_assertions)]
pub async fn stage<T>(
    name: &'static str,
    work: impl Future<Output = T>,
    early: impl FnOnce() -> T,
) -> T {
    let Some((panics, after)) = injected(name) else {
        return work.await;
    };
    tokio::select! {
        out = work => out,
        () = tokio::time::sleep(after) => {
            if panics {
                panic!("injected fault: the {name} stage panics");
            }
            tracing::warn!(stage = name, "injected fault: the stage returns");
            early()
        }
    }
}

/// Runs `work`, the task of the stage `name` (release build: no faults).
#[cfg(not(debug_assertions))]
pub async fn stage<T>(
    _name: &'static str,
    work: impl Future<Output = T>,
    _early: impl FnOnce() -> T,
) -> T {
    work.await
}

/// The fault injected for `name`: whether it panics (else it returns), and
/// when.
#[cfg(debug_assertions)]
fn injected(name: &str) -> Option<(bool, std::time::Duration)> {
    let spec = std::env::var("HERMES_COLLECTOR_TEST_FAULT").ok()?;
    let mut parts = spec.split(':');
    let (stage, kind, ms) = (parts.next()?, parts.next()?, parts.next()?);
    if stage != name {
        return None;
    }
    let after = std::time::Duration::from_millis(ms.parse().ok()?);
    match kind {
        "panic" => Some((true, after)),
        "return" => Some((false, after)),
        _ => None,
    }
}
