//! Test support for the end-to-end tests of the Hermes collector.
//!
//! The pieces, each in its own module:
//! - [`venv`]: the Python venv with `hermes-agent==0.19.0` and our shim
//!   ([`ensure_venv`], created once per process by `tests/setup_venv.sh`).
//! - [`fake_openai`]: a scripted OpenAI-compatible server ([`FakeOpenAi`],
//!   driving `tests/fake_openai.py`) that Hermes talks to instead of a model.
//! - [`hermes`]: an isolated `HOME`/`HERMES_HOME` configured for that server
//!   ([`HermesHome`]), running `hermes chat -q …` or Python snippets with a
//!   bounded timeout and a hermetic environment.
//! - [`otlp_receiver`]: in-test OTLP trace receivers, gRPC ([`OtlpReceiver`])
//!   and HTTP/protobuf ([`OtlpHttpReceiver`]), plain or TLS, recording every
//!   span and header, with scripted rejections.
//! - [`otlp_metrics_receiver`]: in-test OTLP metrics receivers, gRPC and
//!   HTTP/protobuf ([`MetricsReceiver`]), recording every export.
//! - [`otlp_logs_receiver`]: in-test OTLP logs receivers, gRPC and
//!   HTTP/protobuf ([`LogsReceiver`]), recording every
//!   log record with its resource.
//! - [`server`]: what those servers share (their thread and runtime, TLS
//!   with [`ServerTls`], request bodies).
//! - [`pki`]: a CA and the certificates it signs, made at test time.
//! - [`access`]: what the access-control and hostile-input tests share (a
//!   collector from a configuration file exporting to a receiver of its
//!   own, the basic turn arriving whole, the installed shim replaying the
//!   basic fixture).
//! - [`ingest`]: agents' events over the wire protocol without the real
//!   agent (fixture turns converted as the shim does, one stream exchange).
//! - [`events`]: hand-built wire events (ids, bodies, API calls) for the
//!   correlator's and the processor's tests; [`span_attrs`]: the attributes
//!   of `hermes_span` spans, read by type; [`json`]: arbitrary JSON
//!   documents for property tests.
//! - [`fleet`]: collector replicas of one replicated fleet on 127.0.0.2..
//!   under one name in a test hosts file, and the checks on what they
//!   exported (one root per trace, repeats identical).
//! - [`fault`]: the collector on a chosen port or config file, its admin
//!   metrics, the load generator and its `--expect-spans` sets, for the
//!   fault tests.
//! - [`phoenix`]: a real Arize Phoenix server ([`PhoenixServer`], from the
//!   venv `tests/setup_phoenix.sh` makes) and a client of its REST API.
//! - [`rig`]: a real-agent test's scaffolding ([`rig::AgentRig`]: fake
//!   server, receiver, collector, Hermes home) and the printed session id;
//!   [`basic_turn`]: the basic turn's script, run and expected tree.
//! - [`span_tree`]: [`SpanTree`] to check parent/child structure and
//!   attributes of the received spans.
//! - [`trajectory`]: the `exporters.atif` section, waiting for a
//!   trajectory file, validating it with the pinned ATIF models, and
//!   checking its steps against the spans.
//! - [`process`]: [`ChildGuard`] (kill on drop, captured output, bounded
//!   waits), [`run_with_timeout`], [`free_port`] and [`cargo_bin`] (builds
//!   and locates the `hermes-collector` binary).
//!
//! Everything listens on and connects to loopback addresses only (the
//! fleet's replicas use 127.0.0.2 and up), and every wait is
//! bounded by a timeout. Setup failures panic with context: this crate is
//! only used from tests, where a failed step must fail the test loudly.

pub mod access;
pub mod basic_turn;
pub mod collector;
pub mod events;
pub mod fake_openai;
pub mod fault;
pub mod fleet;
pub mod hermes;
pub mod ingest;
pub mod json;
pub mod otlp_logs_receiver;
pub mod otlp_metrics_receiver;
pub mod otlp_receiver;
pub mod phoenix;
pub mod pki;
pub mod process;
pub mod rig;
pub mod server;
pub mod span_attrs;
pub mod span_tree;
pub mod trajectory;
pub mod venv;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use fake_openai::FakeOpenAi;
pub use hermes::HermesHome;
pub use otlp_logs_receiver::{LogStore, LogsReceiver, ReceivedLog};
pub use otlp_metrics_receiver::{HistogramPoint, MetricStore, MetricsReceiver, ReceivedHistogram};
pub use otlp_receiver::{OtlpHttpReceiver, OtlpReceiver, ReceivedExport, SpanStore};
pub use phoenix::{PhoenixServer, PhoenixSpan};
pub use process::{ChildGuard, RunOutput, cargo_bin, free_port, run_with_timeout};
pub use server::ServerTls;
pub use span_tree::{AttrsExt, SpanExt, SpanTree};
pub use venv::{DEFAULT_HERMES_VERSION, ensure_venv, ensure_venv_for, venv_bin};

/// Writes `contents` to the file `name` in `dir`; returns its path.
pub fn write_file(dir: &Path, name: &str, contents: impl AsRef<[u8]>) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    path
}

/// The repository root (the workspace directory holding `Cargo.toml`).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// The directory of this crate (`<repo>/tests`), where the scripts live.
pub fn tests_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A fresh temporary directory named `PREFIX…`, removed on drop.
pub fn temp_dir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .unwrap_or_else(|e| panic!("create temp dir {prefix}…: {e}"))
}

/// Polls `condition` every `interval` until it returns true or `timeout`
/// has passed; returns whether it became true. Always checks at least once,
/// and once more at the deadline.
pub fn wait_until(
    timeout: Duration,
    interval: Duration,
    mut condition: impl FnMut() -> bool,
) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if condition() {
            return true;
        }
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        std::thread::sleep(interval.min(deadline - now));
    }
}

/// Reads a duration in seconds from the environment variable `name`,
/// falling back to `default` when it is unset or not a positive number.
pub fn env_secs(name: &str, default: Duration) -> Duration {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|v| v.is_finite() && *v > 0.0)
        .map(Duration::from_secs_f64)
        .unwrap_or(default)
}
