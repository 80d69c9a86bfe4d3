//! Core of the Hermes observer plugin `hermes_collector`.
//!
//! The plugin captures every observer hook call of a Hermes agent on the
//! agent's own thread in a few microseconds and hands it to a background
//! sender thread that converts, batches and streams the events to the
//! collector (`hermes.collector.v1.EventIngest/Stream`).
//!
//! Layout (each module states what it owns and its invariants):
//! - [`config`]: the `HERMES_COLLECTOR_*` knobs and the hooks per capture level.
//! - [`queue`]: the bounded, never-blocking hand-off from hook threads to the
//!   sender, with sequence numbers and drop counting.
//! - [`convert`]: kwargs of one hook call to a typed `hermes_proto::v1::Event`,
//!   over any [`convert::Kwargs`] source (Python dict or JSON in tests).
//! - [`attempts`]: numbering of API call attempts per `api_request_id`.
//! - [`sender`]: the sender thread: batching, unacknowledged-batch buffer,
//!   gRPC stream with reconnect and resend, flush.
//! - [`clock`]: capture timestamps.
//! - `fake_collector` (feature `test-support`, and in unit tests): an
//!   in-process collector that records and acknowledges batches.
//! - `python` (feature `python`): the PyO3 extension module
//!   `hermes_collector._core` (hook callables, process-wide core, fork and
//!   exit handling).
//!
//! Everything except `python` is free of Python so it can be unit tested with
//! plain `cargo test`.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod attempts;
pub mod clock;
pub mod config;
pub mod convert;
pub mod queue;
pub mod sender;

#[cfg(any(test, feature = "test-support"))]
pub mod fake_collector;

#[cfg(feature = "python")]
mod python;

/// Version of this shim, reported in `ShimInfo.shim_version`.
pub const SHIM_VERSION: &str = env!("CARGO_PKG_VERSION");
