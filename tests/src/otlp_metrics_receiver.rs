//! In-test OTLP **metrics** receivers that record every export request.
//!
//! - [`MetricsReceiver::start_grpc`]: OTLP/gRPC, the generated
//!   `MetricsServiceServer` of `opentelemetry-proto`, accepting gzip.
//! - [`MetricsReceiver::start_http`]: OTLP/HTTP, `POST /v1/metrics` with an
//!   `application/x-protobuf` body, optionally `Content-Encoding: gzip`.
//!
//! Both listen on 127.0.0.1 (an OS-chosen port), run on their own thread with
//! their own single-threaded tokio runtime, stop on drop, and record into a
//! [`MetricStore`]. [`MetricStore::histogram`] reads a histogram's data points
//! from the latest request that has it (with cumulative temporality, the
//! totals so far).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::{HistogramDataPoint, Metric};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;
use tonic::codec::CompressionEncoding;

pub use crate::server::ServerTls;
use crate::server::{Listening, header_text, http_error, http_response, read_post};

/// Largest request either receiver accepts (decompressed).
pub const MAX_REQUEST_BYTES: usize = 16 * 1024 * 1024;

/// One export request as received.
#[derive(Clone, Debug)]
pub struct ReceivedMetrics {
    /// `"grpc"` or `"http"`.
    pub transport: &'static str,
    /// `grpc-encoding` (gRPC) or `Content-Encoding` (HTTP), if any.
    pub encoding: Option<String>,
    /// When it was received.
    pub received_at: Instant,
    /// The decoded request.
    pub request: ExportMetricsServiceRequest,
}

/// One histogram data point, flattened.
#[derive(Clone, Debug, PartialEq)]
pub struct HistogramPoint {
    /// The point's attributes, string values (others as their debug form).
    pub attributes: BTreeMap<String, String>,
    pub count: u64,
    pub sum: f64,
    pub explicit_bounds: Vec<f64>,
    pub bucket_counts: Vec<u64>,
}

/// A histogram as exported: its metadata and points.
#[derive(Clone, Debug)]
pub struct ReceivedHistogram {
    pub unit: String,
    pub description: String,
    /// `AggregationTemporality` (1 delta, 2 cumulative).
    pub temporality: i32,
    /// The resource of its `ResourceMetrics`.
    pub resource: Resource,
    pub points: Vec<HistogramPoint>,
}

impl ReceivedHistogram {
    /// Sum of the points' counts.
    pub fn count(&self) -> u64 {
        self.points.iter().map(|p| p.count).sum()
    }

    /// Sum of the points' sums.
    pub fn sum(&self) -> f64 {
        self.points.iter().map(|p| p.sum).sum()
    }

    /// The points whose attribute `key` is `value`.
    pub fn with(&self, key: &str, value: &str) -> Vec<&HistogramPoint> {
        self.points
            .iter()
            .filter(|p| p.attributes.get(key).map(String::as_str) == Some(value))
            .collect()
    }
}

#[derive(Default)]
struct StoreState {
    exports: Vec<ReceivedMetrics>,
}

/// What a receiver recorded; shared between the server thread and the test.
#[derive(Clone, Default)]
pub struct MetricStore {
    inner: Arc<(Mutex<StoreState>, Condvar)>,
}

fn attribute_text(value: Option<&Value>) -> String {
    match value {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

fn flatten(point: &HistogramDataPoint) -> HistogramPoint {
    HistogramPoint {
        attributes: point
            .attributes
            .iter()
            .map(|kv| {
                let value = kv.value.as_ref().and_then(|v| v.value.as_ref());
                (kv.key.clone(), attribute_text(value))
            })
            .collect(),
        count: point.count,
        sum: point.sum.unwrap_or_default(),
        explicit_bounds: point.explicit_bounds.clone(),
        bucket_counts: point.bucket_counts.clone(),
    }
}

/// The histogram `name` of one request, if it has it.
fn histogram_in(request: &ExportMetricsServiceRequest, name: &str) -> Option<ReceivedHistogram> {
    request.resource_metrics.iter().find_map(|rm| {
        rm.scope_metrics
            .iter()
            .flat_map(|sm| &sm.metrics)
            .find(|m| m.name == name)
            .and_then(|metric: &Metric| match &metric.data {
                Some(Data::Histogram(h)) => Some(ReceivedHistogram {
                    unit: metric.unit.clone(),
                    description: metric.description.clone(),
                    temporality: h.aggregation_temporality,
                    resource: rm.resource.clone().unwrap_or_default(),
                    points: h.data_points.iter().map(flatten).collect(),
                }),
                _ => None,
            })
    })
}

impl MetricStore {
    fn lock(&self) -> MutexGuard<'_, StoreState> {
        self.inner.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn record(&self, export: ReceivedMetrics) {
        self.lock().exports.push(export);
        self.inner.1.notify_all();
    }

    /// Every export request so far, in arrival order.
    pub fn exports(&self) -> Vec<ReceivedMetrics> {
        self.lock().exports.clone()
    }

    /// The histogram `name` of the latest request that has it.
    pub fn histogram(&self, name: &str) -> Option<ReceivedHistogram> {
        let state = self.lock();
        state
            .exports
            .iter()
            .rev()
            .find_map(|export| histogram_in(&export.request, name))
    }

    /// The histogram `name` of every request that has it, in arrival order
    /// (with delta temporality, each carries what was new).
    pub fn histograms(&self, name: &str) -> Vec<ReceivedHistogram> {
        let state = self.lock();
        state
            .exports
            .iter()
            .filter_map(|export| histogram_in(&export.request, name))
            .collect()
    }

    /// Every metric name received so far.
    pub fn metric_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .lock()
            .exports
            .iter()
            .flat_map(|e| &e.request.resource_metrics)
            .flat_map(|rm| &rm.scope_metrics)
            .flat_map(|sm| &sm.metrics)
            .map(|m| m.name.clone())
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// Waits at most `timeout` until `pred` holds for the store; returns
    /// whether it did. Wakes on every export (and at least every 100 ms).
    pub fn wait_for(&self, mut pred: impl FnMut(&MetricStore) -> bool, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if pred(self) {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            let state = self.lock();
            let wait = (deadline - now).min(Duration::from_millis(100));
            drop(self.inner.1.wait_timeout(state, wait));
        }
    }
}

struct GrpcMetricsService {
    store: MetricStore,
}

#[tonic::async_trait]
impl MetricsService for GrpcMetricsService {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        let encoding = request
            .metadata()
            .get("grpc-encoding")
            .and_then(|v| v.to_str().ok())
            .map(String::from);
        self.store.record(ReceivedMetrics {
            transport: "grpc",
            encoding,
            received_at: Instant::now(),
            request: request.into_inner(),
        });
        Ok(tonic::Response::new(ExportMetricsServiceResponse {
            partial_success: None,
        }))
    }
}

/// An OTLP metrics receiver on 127.0.0.1; stops on drop.
pub struct MetricsReceiver {
    server: Listening,
    transport: &'static str,
    store: MetricStore,
}

impl MetricsReceiver {
    /// OTLP/gRPC (`MetricsService/Export`) on an OS-chosen port.
    pub fn start_grpc() -> MetricsReceiver {
        Self::start_grpc_with(None)
    }

    /// OTLP/gRPC over TLS with `tls`.
    pub fn start_grpc_tls(tls: &ServerTls) -> MetricsReceiver {
        Self::start_grpc_with(Some(tls))
    }

    /// OTLP/HTTP (`POST /v1/metrics`, protobuf) on an OS-chosen port.
    pub fn start_http() -> MetricsReceiver {
        Self::start_http_with(None)
    }

    /// OTLP/HTTP over TLS with `tls`.
    pub fn start_http_tls(tls: &ServerTls) -> MetricsReceiver {
        Self::start_http_with(Some(tls))
    }

    fn start_grpc_with(tls: Option<&ServerTls>) -> MetricsReceiver {
        let store = MetricStore::default();
        let service = MetricsServiceServer::new(GrpcMetricsService {
            store: store.clone(),
        })
        .accept_compressed(CompressionEncoding::Gzip)
        .max_decoding_message_size(MAX_REQUEST_BYTES);
        let server = Listening::grpc(
            "otlp-metrics-grpc-receiver",
            0,
            tls,
            move |builder, incoming| builder.serve_with_incoming(service, incoming),
        );
        MetricsReceiver {
            server,
            transport: "grpc",
            store,
        }
    }

    fn start_http_with(tls: Option<&ServerTls>) -> MetricsReceiver {
        let store = MetricStore::default();
        let server_store = store.clone();
        let server = Listening::http("otlp-metrics-http-receiver", 0, tls, move |req| {
            handle_http(server_store.clone(), req)
        });
        MetricsReceiver {
            server,
            transport: "http",
            store,
        }
    }

    /// `http://127.0.0.1:PORT`, `https://` over TLS (for HTTP, the base:
    /// `/v1/metrics` is where requests go).
    pub fn endpoint(&self) -> String {
        self.server.endpoint()
    }

    /// `"grpc"` or `"http"`.
    pub fn transport(&self) -> &'static str {
        self.transport
    }

    /// The store the receiver records into.
    pub fn store(&self) -> &MetricStore {
        &self.store
    }
}

async fn handle_http(
    store: MetricStore,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (headers, body) = match read_post(req, "/v1/metrics", MAX_REQUEST_BYTES).await {
        Ok(read) => read,
        Err(refused) => return Ok(refused),
    };
    let request = match ExportMetricsServiceRequest::decode(&body[..]) {
        Ok(r) => r,
        Err(e) => return Ok(http_error(StatusCode::BAD_REQUEST, &format!("decode: {e}"))),
    };
    store.record(ReceivedMetrics {
        transport: "http",
        encoding: header_text(&headers, hyper::header::CONTENT_ENCODING),
        received_at: Instant::now(),
        request,
    });
    let response = ExportMetricsServiceResponse {
        partial_success: None,
    };
    Ok(http_response(
        StatusCode::OK,
        "application/x-protobuf",
        response.encode_to_vec(),
    ))
}
