//! Which wire protocols and shim versions this collector reads.
//!
//! The wire protocol is the gRPC package [`WIRE_PACKAGE`]
//! (`hermes.collector.v1`; docs/PROTOCOL.md): within it fields are only ever
//! added, so this collector reads every v1 shim, older or newer. A call to
//! another package of the protocol (`/hermes.collector.v2.…`, a shim of a
//! later major protocol) is the one thing it cannot read: [`WireGate`]
//! answers it `UNIMPLEMENTED` with a message naming both protocols and what
//! to do, counted in [`ReceiverStats::unreadable_wire_calls`] and logged at
//! the 1st, 2nd, 4th, … call.
//!
//! Shim versions: every batch names its shim's release
//! (`ShimInfo.shim_version`). This collector knows the releases from
//! [`FIRST_SHIM_VERSION`] up to its own version (README.md, "Compatibility").
//! A stream from any other version (a newer shim, or a version that does not
//! parse) is accepted all the same, counted per version in
//! [`UnknownShimVersions`] (on `/metrics` with a bounded label) and logged
//! at the 1st, 2nd, 4th, … such stream of that label.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use hermes_proto::server::event_ingest_server::EventIngestServer;
use tonic::body::Body;
use tonic::codegen::{BoxFuture, Service, http};

use crate::{Ingest, ReceiverStats};

pub use hermes_proto::WIRE_PACKAGE;

/// The prefix every release of the wire protocol shares.
const WIRE_FAMILY: &str = "/hermes.collector.";

/// This collector's release (the workspace version).
pub const COLLECTOR_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The oldest shim release this collector knows: the first release.
pub const FIRST_SHIM_VERSION: (u64, u64, u64) = (0, 1, 0);

/// `MAJOR.MINOR.PATCH` of a version, a pre-release or build suffix aside;
/// None if it does not parse.
fn release(version: &str) -> Option<(u64, u64, u64)> {
    let core = version.split(['-', '+']).next().unwrap_or_default();
    let mut parts = core.split('.').map(|p| p.parse::<u64>().ok());
    let parsed = (parts.next()??, parts.next()??, parts.next()??);
    parts.next().is_none().then_some(parsed)
}

/// Whether this collector knows the shim release `version`: one from
/// [`FIRST_SHIM_VERSION`] to [`COLLECTOR_VERSION`].
pub fn is_known_shim(version: &str) -> bool {
    match (release(version), release(COLLECTOR_VERSION)) {
        (Some(v), Some(own)) => FIRST_SHIM_VERSION <= v && v <= own,
        _ => false,
    }
}

/// Streams from shim versions this collector does not know, per version
/// label. The labels are bounded: a version is kept to its characters
/// `[0-9A-Za-z.+_-]` and cut at [`Self::MAX_LABEL_BYTES`] (empty: `none`);
/// past [`Self::MAX_LABELS`] distinct labels, further ones count as `other`.
#[derive(Debug, Default)]
pub struct UnknownShimVersions {
    counts: Mutex<Vec<(String, u64)>>,
}

impl UnknownShimVersions {
    /// Most distinct version labels, `other` aside.
    pub const MAX_LABELS: usize = 16;
    /// Longest version label, in bytes.
    pub const MAX_LABEL_BYTES: usize = 32;

    /// Counts one stream from `version`; returns its label and that label's
    /// count.
    pub fn count(&self, version: &str) -> (String, u64) {
        let mut label: String = version
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '_' | '-'))
            .take(Self::MAX_LABEL_BYTES)
            .collect();
        if label.is_empty() {
            label = "none".to_owned();
        }
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        if !counts.iter().any(|(l, _)| *l == label) && counts.len() >= Self::MAX_LABELS {
            label = "other".to_owned();
        }
        let n = match counts.iter_mut().find(|(l, _)| *l == label) {
            Some((_, n)) => {
                *n += 1;
                *n
            }
            None => {
                counts.push((label.clone(), 1));
                1
            }
        };
        (label, n)
    }

    /// Every label with its count, in the order first seen.
    pub fn snapshot(&self) -> Vec<(String, u64)> {
        self.counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// The ingest service behind a check of the wire protocol: calls under
/// [`WIRE_PACKAGE`] (and calls outside the protocol's family, which the
/// service answers itself) go through; a call to another release of the
/// protocol is answered `UNIMPLEMENTED` with a clear message.
#[derive(Clone)]
pub struct WireGate {
    inner: EventIngestServer<Ingest>,
    stats: Arc<ReceiverStats>,
}

impl WireGate {
    pub fn new(inner: EventIngestServer<Ingest>, stats: Arc<ReceiverStats>) -> Self {
        Self { inner, stats }
    }

    /// The refusal of a call to `path`, when it is not this collector's
    /// protocol.
    fn refusal(&self, path: &str) -> Option<tonic::Status> {
        let package_and_method = path.strip_prefix(WIRE_FAMILY)?;
        let version = package_and_method
            .split(['.', '/'])
            .next()
            .unwrap_or_default();
        let ours = WIRE_PACKAGE.rsplit('.').next().unwrap_or_default();
        if version == ours {
            return None;
        }
        let (n, log) = ReceiverStats::count(&self.stats.unreadable_wire_calls);
        let called: String = path.chars().take(128).collect();
        if log {
            tracing::warn!(
                path = %called,
                reads = WIRE_PACKAGE,
                unreadable_wire_calls = n,
                "refused a shim of a wire protocol this collector cannot read; upgrade the collector (logged at the 1st, 2nd, 4th, ... call)"
            );
        }
        Some(tonic::Status::unimplemented(format!(
            "hermes-collector {COLLECTOR_VERSION} reads the wire protocol {WIRE_PACKAGE} only, \
             not the one of {called}: use a collector release that reads the shim's protocol \
             (README.md, Compatibility)"
        )))
    }
}

impl Service<http::Request<Body>> for WireGate {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Service::<http::Request<Body>>::poll_ready(&mut self.inner, cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        match self.refusal(request.uri().path()) {
            Some(status) => Box::pin(async move { Ok(status.into_http()) }),
            None => Box::pin(self.inner.call(request)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knows_the_releases_up_to_its_own() {
        assert!(is_known_shim("0.1.0"));
        assert!(is_known_shim(COLLECTOR_VERSION));
        assert!(is_known_shim(&format!("{COLLECTOR_VERSION}-rc.1")));
        for unknown in [
            "", "0.0.9", "99.0.0", "1", "0.1", "0.1.0.1", "x.y.z", "0.1.0x",
        ] {
            assert!(!is_known_shim(unknown), "{unknown:?}");
        }
    }

    #[test]
    fn version_labels_are_bounded() {
        let versions = UnknownShimVersions::default();
        assert_eq!(versions.count("9.0.0"), ("9.0.0".to_owned(), 1));
        assert_eq!(versions.count("9.0.0"), ("9.0.0".to_owned(), 2));
        assert_eq!(versions.count(""), ("none".to_owned(), 1));
        let (label, _) = versions.count(&format!("{}\"}}\n{}", "1".repeat(40), "z"));
        assert_eq!(label, "1".repeat(UnknownShimVersions::MAX_LABEL_BYTES));
        for i in 0..40 {
            versions.count(&format!("10.0.{i}"));
        }
        let snapshot = versions.snapshot();
        assert_eq!(snapshot.len(), UnknownShimVersions::MAX_LABELS + 1);
        assert_eq!(
            snapshot.last(),
            Some(&("other".to_owned(), 40 - 13)),
            "{snapshot:?}"
        );
    }
}
