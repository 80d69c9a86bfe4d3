//! Export errors and their retry classification.
//!
//! This module owns [`ExportError`], the one error type every sink returns, and
//! [`RetryClass`], the verdict the exporter stage acts on. Classification
//! follows the OTLP specification:
//!
//! * gRPC: `CANCELLED`, `DEADLINE_EXCEEDED`, `ABORTED`, `OUT_OF_RANGE`,
//!   `UNAVAILABLE`, `DATA_LOSS` are retryable; `RESOURCE_EXHAUSTED` is retryable
//!   only when the server sent a `google.rpc.RetryInfo` (then it is
//!   [`RetryClass::Throttled`]); every other code is not retryable. A status
//!   whose `source()` chain holds an I/O or transport error (connection reset,
//!   refused, …) is retryable whatever its code.
//! * HTTP: 429, 502, 503, 504 are retryable, throttled when `Retry-After`
//!   carries a number of seconds; other 5xx are retryable; other 4xx are not.
//! * Transport failures and timeouts are retryable; bad configuration is not.
//! * A local file write that fails for want of room (a full disk or quota,
//!   `/dev/full`, a file at its size limit), for permissions, or because the
//!   file's directory is gone is not retryable: retrying for `max_elapsed`
//!   would hold the sink's queue (and the shutdown drain) on a disk that
//!   rarely frees itself that soon, so the batch is dropped, counted in
//!   `spans_failed` and logged at once.
//! * A failed TLS handshake ([`ExportError::TlsHandshake`]: the backend's
//!   certificate is not trusted or does not name the host, or the backend
//!   refused our client certificate) is not retryable: it is a configuration
//!   problem that retrying for `max_elapsed` would not fix, so the batch is
//!   dropped and counted at once, with an ERROR line that says what to check.
//!
//! Invariant: the error stays small (no `tonic::Status` or response body kept
//! whole), so `Result<_, ExportError>` is cheap to move around.

use std::error::Error as StdError;
use std::path::PathBuf;
use std::time::Duration;

/// What the exporter stage may do after a failed export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryClass {
    /// Retrying cannot help (bad request, bad config, permission denied).
    NonRetryable,
    /// Retry after the stage's own jittered exponential backoff.
    Retryable,
    /// Retry, but not before the server-provided delay.
    Throttled(Duration),
}

/// Why one export call of one sink failed.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The configured endpoint cannot be used.
    #[error("invalid endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint {
        /// The endpoint as configured.
        endpoint: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A configured extra header (or gRPC metadata entry) is not valid.
    #[error("invalid header {name:?}: {reason}")]
    InvalidHeader {
        /// The header name as configured.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The TLS settings cannot be used (a PEM file that does not parse, a key
    /// that does not fit its certificate, no root certificate).
    #[error("invalid TLS settings: {0}")]
    TlsConfig(String),
    /// The TLS handshake with the backend failed (see [`crate::tls`]).
    #[error("TLS handshake with the backend failed: {0}")]
    TlsHandshake(String),
    /// The gRPC server answered with a non-OK status (or the channel failed).
    #[error("gRPC export failed with {code:?}: {message}")]
    Grpc {
        /// The gRPC status code.
        code: tonic::Code,
        /// The status message, cut to a few hundred bytes.
        message: String,
        /// Delay from a `google.rpc.RetryInfo` status detail, if any.
        retry_after: Option<Duration>,
        /// True when the status was caused by a transport/I/O error.
        transport: bool,
    },
    /// The HTTP request could not be sent or its response not read.
    #[error("HTTP export failed: {}", error_chain(.0.as_ref()))]
    HttpTransport(#[source] Box<dyn StdError + Send + Sync + 'static>),
    /// The HTTP server answered with a non-2xx status.
    #[error("HTTP export failed with status {status}: {message}")]
    HttpStatus {
        /// The HTTP status code.
        status: u16,
        /// `Retry-After` in seconds, when the server sent one.
        retry_after: Option<Duration>,
        /// The `google.rpc.Status` message or the start of the body.
        message: String,
    },
    /// The export did not complete within the configured timeout.
    #[error("export timed out after {0:?}")]
    Timeout(Duration),
    /// The batch could not be encoded.
    #[error("encoding the batch failed: {0}")]
    Encode(#[source] serde_json::Error),
    /// A local file or writer operation failed.
    #[error("I/O error on {path}: {source}", path = .path.display())]
    Io {
        /// The file (or `<console>`) the operation was on.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Writing to the console failed. Not retryable: the spans were already
    /// consumed by the console's turn buffer, a retry would print them twice.
    #[error("console write failed: {0}")]
    Console(#[source] std::io::Error),
    /// A blocking write task died (panicked or was cancelled).
    #[error("blocking write task failed: {0}")]
    Task(#[source] tokio::task::JoinError),
}

impl ExportError {
    /// Classifies the error for the retry loop (see the module docs).
    pub fn retry_class(&self) -> RetryClass {
        match self {
            Self::InvalidEndpoint { .. }
            | Self::InvalidHeader { .. }
            | Self::TlsConfig(_)
            | Self::TlsHandshake(_)
            | Self::Encode(_)
            | Self::Console(_) => RetryClass::NonRetryable,
            Self::Grpc {
                code,
                retry_after,
                transport,
                ..
            } => grpc_retry_class(*code, *retry_after, *transport),
            Self::HttpTransport(_) | Self::Timeout(_) | Self::Task(_) => RetryClass::Retryable,
            Self::HttpStatus {
                status,
                retry_after,
                ..
            } => http_retry_class(*status, *retry_after),
            Self::Io { source, .. } => io_retry_class(source),
        }
    }

    /// Builds a [`ExportError::Grpc`] from a tonic status, reading any
    /// `RetryInfo` detail and walking the `source()` chain for transport
    /// causes; a failed TLS handshake in that chain gives
    /// [`ExportError::TlsHandshake`].
    pub(crate) fn from_status(status: &tonic::Status) -> Self {
        if let Some(failure) = crate::tls::handshake_failure(status) {
            return Self::TlsHandshake(failure);
        }
        let transport = source_chain_has_transport_error(status);
        let retry_after = rpc_status::retry_delay(status.details());
        Self::Grpc {
            code: status.code(),
            message: truncate(status.message(), 512),
            retry_after,
            transport,
        }
    }

    /// Wraps a failed HTTP request: [`ExportError::TlsHandshake`] when a TLS
    /// error is in its `source()` chain, else [`ExportError::HttpTransport`].
    pub(crate) fn from_http_transport(error: Box<dyn StdError + Send + Sync + 'static>) -> Self {
        match crate::tls::handshake_failure(error.as_ref()) {
            Some(failure) => Self::TlsHandshake(failure),
            None => Self::HttpTransport(error),
        }
    }
}

/// OTLP/gRPC retry classification.
fn grpc_retry_class(
    code: tonic::Code,
    retry_after: Option<Duration>,
    transport: bool,
) -> RetryClass {
    use tonic::Code;
    let retryable = matches!(
        code,
        Code::Cancelled
            | Code::DeadlineExceeded
            | Code::Aborted
            | Code::OutOfRange
            | Code::Unavailable
            | Code::DataLoss
    );
    match (code, retry_after) {
        (Code::ResourceExhausted, Some(delay)) => RetryClass::Throttled(delay),
        (_, Some(delay)) if retryable => RetryClass::Throttled(delay),
        _ if retryable || transport => RetryClass::Retryable,
        _ => RetryClass::NonRetryable,
    }
}

/// OTLP/HTTP retry classification.
pub(crate) fn http_retry_class(status: u16, retry_after: Option<Duration>) -> RetryClass {
    match status {
        429 | 502 | 503 | 504 => match retry_after {
            Some(delay) => RetryClass::Throttled(delay),
            None => RetryClass::Retryable,
        },
        500..=599 => RetryClass::Retryable,
        // 1xx/3xx are unexpected here (redirects are not followed): treat as
        // a configuration problem, like any 4xx.
        _ => RetryClass::NonRetryable,
    }
}

fn io_retry_class(err: &std::io::Error) -> RetryClass {
    use std::io::ErrorKind;
    match err.kind() {
        ErrorKind::PermissionDenied
        | ErrorKind::InvalidInput
        | ErrorKind::ReadOnlyFilesystem
        | ErrorKind::IsADirectory
        | ErrorKind::NotADirectory
        | ErrorKind::NotFound
        | ErrorKind::StorageFull
        | ErrorKind::QuotaExceeded
        | ErrorKind::FileTooLarge
        | ErrorKind::WriteZero => RetryClass::NonRetryable,
        _ => RetryClass::Retryable,
    }
}

/// True when any error in `err`'s `source()` chain is an I/O error or a tonic
/// transport error: the request may not have reached the server at all.
fn source_chain_has_transport_error(err: &(dyn StdError + 'static)) -> bool {
    let mut current = err.source();
    while let Some(cause) = current {
        if cause.is::<std::io::Error>()
            || cause.is::<tonic::transport::Error>()
            || cause.is::<hyper::Error>()
        {
            return true;
        }
        current = cause.source();
    }
    false
}

/// `error` and its causes, `: `-separated, each cause once (hyper's
/// "client error (Connect)" says little without them).
pub(crate) fn error_chain(error: &(dyn StdError + 'static)) -> String {
    let mut text = error.to_string();
    let mut current = error.source();
    while let Some(cause) = current {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        current = cause.source();
    }
    truncate(&text, 512)
}

/// Cuts `s` to at most `max` bytes on a char boundary.
pub(crate) fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    format!("{}…", &s[..s.floor_char_boundary(max)])
}

/// The few `google.rpc` messages needed to read a server's retry hint.
pub(crate) mod rpc_status {
    use prost::Message;
    use std::time::Duration;

    const RETRY_INFO_TYPE: &str = "type.googleapis.com/google.rpc.RetryInfo";

    /// `google.rpc.Status`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct Status {
        #[prost(int32, tag = "1")]
        pub code: i32,
        #[prost(string, tag = "2")]
        pub message: String,
        #[prost(message, repeated, tag = "3")]
        pub details: Vec<Any>,
    }

    /// `google.protobuf.Any`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct Any {
        #[prost(string, tag = "1")]
        pub type_url: String,
        #[prost(bytes = "vec", tag = "2")]
        pub value: Vec<u8>,
    }

    /// `google.rpc.RetryInfo`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct RetryInfo {
        #[prost(message, optional, tag = "1")]
        pub retry_delay: Option<ProtoDuration>,
    }

    /// `google.protobuf.Duration`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct ProtoDuration {
        #[prost(int64, tag = "1")]
        pub seconds: i64,
        #[prost(int32, tag = "2")]
        pub nanos: i32,
    }

    /// Reads the `RetryInfo` delay out of encoded `google.rpc.Status` bytes
    /// (the `grpc-status-details-bin` trailer). `None` when absent, malformed
    /// or negative.
    pub(crate) fn retry_delay(details: &[u8]) -> Option<Duration> {
        if details.is_empty() {
            return None;
        }
        let status = Status::decode(details).ok()?;
        status
            .details
            .iter()
            .filter(|any| any.type_url == RETRY_INFO_TYPE)
            .find_map(|any| {
                let info = RetryInfo::decode(any.value.as_slice()).ok()?;
                let delay = info.retry_delay?;
                let secs = u64::try_from(delay.seconds).ok()?;
                let nanos = u32::try_from(delay.nanos).ok()?;
                Some(Duration::new(secs, nanos))
            })
    }

    /// The message of an encoded `google.rpc.Status` (OTLP/HTTP error body).
    pub(crate) fn message(body: &[u8]) -> Option<String> {
        let status = Status::decode(body).ok()?;
        (!status.message.is_empty()).then_some(status.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn http_status_classes() {
        assert_eq!(http_retry_class(400, None), RetryClass::NonRetryable);
        assert_eq!(http_retry_class(404, None), RetryClass::NonRetryable);
        assert_eq!(http_retry_class(429, None), RetryClass::Retryable);
        assert_eq!(
            http_retry_class(429, Some(Duration::from_secs(3))),
            RetryClass::Throttled(Duration::from_secs(3))
        );
        for s in [502, 503, 504] {
            assert_eq!(http_retry_class(s, None), RetryClass::Retryable);
        }
        assert_eq!(http_retry_class(500, None), RetryClass::Retryable);
        assert_eq!(http_retry_class(501, None), RetryClass::Retryable);
        // Retry-After is only honoured on the throttling statuses.
        assert_eq!(
            http_retry_class(500, Some(Duration::from_secs(1))),
            RetryClass::Retryable
        );
    }

    #[test]
    fn grpc_status_classes() {
        let class = |s: tonic::Status| ExportError::from_status(&s).retry_class();
        assert_eq!(
            class(tonic::Status::unavailable("down")),
            RetryClass::Retryable
        );
        assert_eq!(
            class(tonic::Status::invalid_argument("bad")),
            RetryClass::NonRetryable
        );
        assert_eq!(
            class(tonic::Status::resource_exhausted("full")),
            RetryClass::NonRetryable
        );

        let details = rpc_status::Status {
            code: tonic::Code::ResourceExhausted as i32,
            message: "slow down".into(),
            details: vec![rpc_status::Any {
                type_url: "type.googleapis.com/google.rpc.RetryInfo".into(),
                value: rpc_status::RetryInfo {
                    retry_delay: Some(rpc_status::ProtoDuration {
                        seconds: 2,
                        nanos: 500_000_000,
                    }),
                }
                .encode_to_vec(),
            }],
        }
        .encode_to_vec();
        let status = tonic::Status::with_details(
            tonic::Code::ResourceExhausted,
            "slow down",
            details.into(),
        );
        assert_eq!(
            class(status),
            RetryClass::Throttled(Duration::from_millis(2500))
        );
    }

    #[test]
    fn io_classes() {
        let err = |kind| ExportError::Io {
            path: "x".into(),
            source: std::io::Error::from(kind),
        };
        assert_eq!(
            err(std::io::ErrorKind::PermissionDenied).retry_class(),
            RetryClass::NonRetryable
        );
        // A full disk (`/dev/full`'s ENOSPC) or quota is dropped and counted
        // at once, never held past the drain's deadline.
        for kind in [
            std::io::ErrorKind::StorageFull,
            std::io::ErrorKind::QuotaExceeded,
            std::io::ErrorKind::NotFound,
        ] {
            assert_eq!(err(kind).retry_class(), RetryClass::NonRetryable, "{kind}");
        }
        assert_eq!(
            err(std::io::ErrorKind::Interrupted).retry_class(),
            RetryClass::Retryable
        );
    }

    #[test]
    fn truncate_respects_char_boundaries() {
        assert_eq!(truncate("abc", 5), "abc");
        assert_eq!(truncate("ééé", 3), "é…");
    }
}
