//! The admin server: the collector's own health and metrics over HTTP/1.
//!
//! | path | answer |
//! |---|---|
//! | `GET /metrics` | Prometheus text exposition (0.0.4; OpenMetrics when the `Accept` header asks for it); with `admin.metrics_auth`, `401` without `Authorization: Bearer <token>` |
//! | `GET /livez` | `200` while the process runs; `503` (`not live: the <stage> stage stopped`) once a stage ended on its own, until the process exits |
//! | `GET /readyz` | `200` (`ready`) once the ingest listener is bound and the exporter stage runs with its queue open; `503` (`not ready: <why>`) before that, when the ingest stopped or the exporter queue closed, and from the start of the drain |
//! | any other path | `404`; a known path with a method other than `GET`/`HEAD`: `405` |
//!
//! Invariants:
//! - No double bookkeeping, and no stage's counters known here: each stage's
//!   stats describe and read themselves at scrape time
//!   ([`hermes_metrics::StageMetrics`]: the receiver's, the correlation
//!   stage's, the exporters', the persistent queue's, the channels' fill
//!   levels); this module registers them and serves.
//! - Bounded labels: only the exporter (sink) name and the queue name, both
//!   fixed by the configuration; never a session, shim, connection or trace.
//!   The metrics derived from the spans carry agents' values (tool names,
//!   models), redacted and bounded in length and number (`series.rs`).
//! - Bounded request handling: request bodies are never read, request heads
//!   are capped in size and in time, at most [`MAX_CONNECTIONS`] connections
//!   are served at once (more are closed at once) and each lives at most
//!   [`CONNECTION_LIFETIME`].
//! - Probing a queue never keeps it open: the probes hold weak senders, so the
//!   channel still closes when its stage drops the last real sender.

mod probes;
mod readiness;

use std::convert::Infallible;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hermes_metrics::METRIC_PREFIX;
use hermes_receiver::BearerToken;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::collector::Collector;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

pub use probes::{QueueLevel, QueueProbe, Queues};
pub use readiness::Readiness;

use crate::derived::DerivedMetrics;

/// Most connections served at once; further ones are closed on accept.
pub const MAX_CONNECTIONS: usize = 32;
/// Longest wait for a request head.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest life of one (keep-alive) connection; it is then closed gracefully.
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);
/// Largest request head buffered.
const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Longest wait, at shutdown, for connections to finish their response.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(1);

const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What the admin server reports. Cheap to clone (all `Arc`s).
#[derive(Clone, Debug)]
pub struct AdminState {
    readiness: Arc<Readiness>,
    registry: Arc<Registry>,
    /// The bearer token `/metrics` requires, if any.
    metrics_token: Option<BearerToken>,
    /// Scrapes of `/metrics` refused for a missing or wrong token.
    auth_failures: Counter,
}

impl AdminState {
    /// Builds the state: the readiness flags, the metrics derived from the
    /// spans (unprefixed: they keep their semantic-convention names) and
    /// each stage's own metrics (prefixed `hermes_collector_`), read at
    /// scrape time.
    pub fn new(
        readiness: Arc<Readiness>,
        derived: &DerivedMetrics,
        stages: impl IntoIterator<Item = Box<dyn Collector>>,
    ) -> Self {
        let mut root = Registry::default();
        derived.register(&mut root);
        let registry = root.sub_registry_with_prefix(METRIC_PREFIX);
        registry.register(
            "build",
            "Build information of the collector",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        let auth_failures = Counter::default();
        registry.register(
            "admin_auth_failures",
            "Scrapes of /metrics refused for a missing or wrong bearer token (admin.metrics_auth)",
            auth_failures.clone(),
        );
        for stage in stages {
            registry.register_collector(stage);
        }
        Self {
            readiness,
            registry: Arc::new(root),
            metrics_token: None,
            auth_failures,
        }
    }

    /// Requires `token` (`Authorization: Bearer <token>`) on `/metrics`;
    /// `/livez` and `/readyz` stay open for the probes.
    pub fn with_metrics_token(mut self, token: Option<BearerToken>) -> Self {
        self.metrics_token = token;
        self
    }

    /// The metrics in the Prometheus text format (0.0.4).
    pub fn render_prometheus(&self) -> Result<String, fmt::Error> {
        let mut text = String::with_capacity(4096);
        prometheus_client::encoding::prometheus_text::encode(&mut text, &self.registry)?;
        Ok(text)
    }

    /// The metrics in the OpenMetrics text format (ends with `# EOF`).
    pub fn render_openmetrics(&self) -> Result<String, fmt::Error> {
        let mut text = String::with_capacity(4096);
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

/// Serves the admin endpoints on `listener` until `shutdown` is cancelled,
/// then lets the open connections finish their response (briefly) and
/// returns. Give it a token cancelled after the drain, so `/livez` and
/// `/readyz` (503) answer while the collector drains.
pub async fn serve(
    listener: TcpListener,
    state: AdminState,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                // Out of file descriptors and the like: back off, keep serving.
                tracing::warn!(error = %e, "admin server cannot accept");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            tracing::debug!("admin server busy; connection closed");
            continue;
        };
        let state = state.clone();
        let shutdown = shutdown.clone();
        connections.spawn(async move {
            let _permit = permit;
            serve_connection(stream, state, shutdown).await;
        });
    }
    drop(listener);
    let _ = tokio::time::timeout(SHUTDOWN_WAIT, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    connections.shutdown().await;
    Ok(())
}

fn is_connection_error(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}

async fn serve_connection(
    stream: tokio::net::TcpStream,
    state: AdminState,
    shutdown: CancellationToken,
) {
    let service = hyper::service::service_fn(move |request| {
        let state = state.clone();
        async move { Ok::<_, Infallible>(respond(&state, &request)) }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(MAX_HEAD_BYTES);
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    let lifetime = tokio::time::sleep(CONNECTION_LIFETIME);
    tokio::pin!(lifetime);
    let result = tokio::select! {
        result = connection.as_mut() => result,
        () = shutdown.cancelled() => {
            connection.as_mut().graceful_shutdown();
            connection.as_mut().await
        }
        () = &mut lifetime => {
            connection.as_mut().graceful_shutdown();
            connection.as_mut().await
        }
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "admin connection ended with an error");
    }
}

fn respond(state: &AdminState, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    let path = request.uri().path();
    if !matches!(path, "/metrics" | "/livez" | "/readyz") {
        return text(StatusCode::NOT_FOUND, "not found\n");
    }
    if request.method() != Method::GET && request.method() != Method::HEAD {
        let mut response = text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
        response
            .headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    let response = match path {
        "/livez" => match state.readiness.live() {
            Ok(()) => text(StatusCode::OK, "ok\n"),
            Err(stage) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not live: the {stage} stage stopped\n"),
            ),
        },
        "/readyz" => match state.readiness.check() {
            Ok(()) => text(StatusCode::OK, "ready\n"),
            Err(why) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {why}\n"),
            ),
        },
        _ => refusal(state, request).unwrap_or_else(|| metrics(state, request)),
    };
    // hyper sends the head only for HEAD, with the body's length.
    response
}

/// The answer to a `/metrics` request without the bearer token it requires,
/// checked as the ingest's (constant-time comparison, scheme
/// case-insensitive): a 401 with `WWW-Authenticate: Bearer`, counted and
/// logged at the 1st, 2nd, 4th, … one. None when the request may scrape.
fn refusal<B>(state: &AdminState, request: &Request<B>) -> Option<Response<Full<Bytes>>> {
    let token = state.metrics_token.as_ref()?;
    let mut headers = http::HeaderMap::new();
    if let Some(value) = request.headers().get(header::AUTHORIZATION) {
        headers.insert(header::AUTHORIZATION, value.clone());
    }
    let failure = token
        .check(&tonic::metadata::MetadataMap::from_headers(headers))
        .err()?;
    let failures = state.auth_failures.inc() + 1;
    if failures.is_power_of_two() {
        tracing::warn!(
            auth_failures = failures,
            reason = failure.message(),
            "/metrics scrape refused (admin.metrics_auth)"
        );
    }
    let mut response = text(StatusCode::UNAUTHORIZED, format!("{}\n", failure.message()));
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer"),
    );
    Some(response)
}

fn metrics(state: &AdminState, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    let openmetrics = request
        .headers()
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"));
    let (rendered, content_type) = if openmetrics {
        (state.render_openmetrics(), OPENMETRICS_CONTENT_TYPE)
    } else {
        (
            state.render_prometheus(),
            prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
        )
    };
    match rendered {
        Ok(body) => {
            let mut response = Response::new(Full::new(Bytes::from(body)));
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static(content_type),
            );
            response
        }
        Err(_) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "cannot encode the metrics\n",
        ),
    }
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

#[cfg(test)]
mod tests;
