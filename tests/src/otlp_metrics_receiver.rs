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
use std::io::Read;
use std::net::{SocketAddr, TcpListener as StdTcpListener};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
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
use tokio::sync::oneshot;
use tonic::codec::CompressionEncoding;
use tonic::transport::server::TcpIncoming;

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

/// The server thread: stops (dropping open connections) and is joined on
/// drop.
struct ServerThread {
    shutdown: Option<oneshot::Sender<()>>,
    handle: Option<JoinHandle<()>>,
}

impl ServerThread {
    fn spawn<F, Fut>(name: &str, listener: StdTcpListener, serve: F) -> ServerThread
    where
        F: FnOnce(tokio::net::TcpListener) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()>,
    {
        let (tx, rx) = oneshot::channel::<()>();
        let thread_name = name.to_string();
        let handle = std::thread::Builder::new()
            .name(thread_name.clone())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        eprintln!("{thread_name}: cannot build tokio runtime: {e}");
                        return;
                    }
                };
                rt.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(l) => l,
                        Err(e) => {
                            eprintln!("{thread_name}: cannot register listener: {e}");
                            return;
                        }
                    };
                    tokio::select! {
                        _ = serve(listener) => {}
                        _ = rx => {}
                    }
                });
            })
            .unwrap_or_else(|e| panic!("spawn {name} thread: {e}"));
        ServerThread {
            shutdown: Some(tx),
            handle: Some(handle),
        }
    }
}

impl Drop for ServerThread {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
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
    addr: SocketAddr,
    transport: &'static str,
    store: MetricStore,
    _server: ServerThread,
}

fn bind() -> StdTcpListener {
    let listener =
        StdTcpListener::bind(("127.0.0.1", 0)).unwrap_or_else(|e| panic!("bind 127.0.0.1:0: {e}"));
    listener
        .set_nonblocking(true)
        .unwrap_or_else(|e| panic!("set_nonblocking: {e}"));
    listener
}

impl MetricsReceiver {
    /// OTLP/gRPC (`MetricsService/Export`) on an OS-chosen port.
    pub fn start_grpc() -> MetricsReceiver {
        let listener = bind();
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("local_addr: {e}"));
        let store = MetricStore::default();
        let service = MetricsServiceServer::new(GrpcMetricsService {
            store: store.clone(),
        })
        .accept_compressed(CompressionEncoding::Gzip)
        .max_decoding_message_size(MAX_REQUEST_BYTES);
        let server = ServerThread::spawn(
            "otlp-metrics-grpc-receiver",
            listener,
            move |listener| async move {
                let incoming = TcpIncoming::from(listener);
                if let Err(e) = tonic::transport::Server::builder()
                    .serve_with_incoming(service, incoming)
                    .await
                {
                    eprintln!("otlp-metrics-grpc-receiver: {e}");
                }
            },
        );
        MetricsReceiver {
            addr,
            transport: "grpc",
            store,
            _server: server,
        }
    }

    /// OTLP/HTTP (`POST /v1/metrics`, protobuf) on an OS-chosen port.
    pub fn start_http() -> MetricsReceiver {
        let listener = bind();
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("local_addr: {e}"));
        let store = MetricStore::default();
        let server_store = store.clone();
        let server = ServerThread::spawn(
            "otlp-metrics-http-receiver",
            listener,
            move |listener| async move {
                loop {
                    let stream = match listener.accept().await {
                        Ok((stream, _)) => stream,
                        Err(e) => {
                            eprintln!("otlp-metrics-http-receiver: accept: {e}");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    };
                    let store = server_store.clone();
                    tokio::spawn(async move {
                        let service = service_fn(move |req| handle_http(store.clone(), req));
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    });
                }
            },
        );
        MetricsReceiver {
            addr,
            transport: "http",
            store,
            _server: server,
        }
    }

    /// `http://127.0.0.1:PORT` (for HTTP, the base: `/v1/metrics` is where
    /// requests go).
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
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

fn reply(status: StatusCode, content_type: &str, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, value);
    }
    response
}

async fn handle_http(
    store: MetricStore,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let error = |status, message: String| reply(status, "text/plain", message.into_bytes());
    if req.uri().path() != "/v1/metrics" {
        return Ok(error(StatusCode::NOT_FOUND, "only /v1/metrics".into()));
    }
    if req.method() != Method::POST {
        return Ok(error(StatusCode::METHOD_NOT_ALLOWED, "POST only".into()));
    }
    let encoding = req
        .headers()
        .get(hyper::header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    let body = match Limited::new(req.into_body(), MAX_REQUEST_BYTES)
        .collect()
        .await
    {
        Ok(collected) => collected.to_bytes(),
        Err(e) => return Ok(error(StatusCode::BAD_REQUEST, format!("body: {e}"))),
    };
    let body = match encoding.as_deref().map(str::trim) {
        None | Some("") | Some("identity") => body.to_vec(),
        Some("gzip") => {
            let mut out = Vec::new();
            let decoder = flate2::read::GzDecoder::new(&body[..]);
            if let Err(e) = decoder
                .take(MAX_REQUEST_BYTES as u64 + 1)
                .read_to_end(&mut out)
            {
                return Ok(error(StatusCode::BAD_REQUEST, format!("gzip: {e}")));
            }
            out
        }
        Some(other) => {
            return Ok(error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!("unsupported Content-Encoding {other}"),
            ));
        }
    };
    let request = match ExportMetricsServiceRequest::decode(&body[..]) {
        Ok(r) => r,
        Err(e) => return Ok(error(StatusCode::BAD_REQUEST, format!("decode: {e}"))),
    };
    store.record(ReceivedMetrics {
        transport: "http",
        encoding,
        received_at: Instant::now(),
        request,
    });
    let response = ExportMetricsServiceResponse {
        partial_success: None,
    };
    Ok(reply(
        StatusCode::OK,
        "application/x-protobuf",
        response.encode_to_vec(),
    ))
}
