//! The Hermes collector's pipeline: its stages wired by bounded channels,
//! under one supervisor.
//!
//! ```text
//! shims ─gRPC─▶ receiver ─[ingest]─▶ (queue writer ─[logged]─▶) correlation ─[export]─▶ exporter stage ─▶ sinks
//! ```
//!
//! - [`Topology::build`] (`topology.rs`): the composition root, from a
//!   validated configuration to bound, not yet running stages.
//! - [`Topology::run`] (`supervise.rs`): the supervisor and the drain;
//!   `lane.rs`: the thread the pipeline's stages run on.
//! - [`driver`]: the correlation stage on an injected [`clock`] (its last
//!   step before the export channel: `hermes_sampling`'s tail sampler), with the
//!   [`ledger`] that owns the persistent queue's sequence numbers,
//!   watermark and export markers; [`settle`]: which events of fleet
//!   shims are settled; [`writer`]: the persistent queue's writer.
//! - [`admin`]: `/livez`, `/readyz`, `/metrics`; each stage's stats encode
//!   themselves ([`hermes_metrics::StageMetrics`]); [`derived`]: the
//!   metrics derived from the spans (Prometheus and OTLP).

#![forbid(unsafe_code)]

pub mod admin;
pub mod clock;
pub mod derived;
pub mod driver;
mod fault;
mod lane;
pub mod ledger;
mod series;
pub mod settle;
mod sinks;
pub mod stats;
mod supervise;
mod topology;
pub mod writer;

pub use supervise::Outcome;
pub use topology::Topology;
