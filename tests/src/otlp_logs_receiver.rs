//! In-test OTLP **logs** receivers that record every log record.
//!
//! - [`LogsReceiver::start_grpc`]: OTLP/gRPC, the generated
//!   `LogsServiceServer` of `opentelemetry-proto`, accepting gzip.
//! - [`LogsReceiver::start_http`]: OTLP/HTTP, `POST /v1/logs` with an
//!   `application/x-protobuf` body, optionally `Content-Encoding: gzip`.
//!
//! Both listen on 127.0.0.1 (an OS-chosen port) through the shared server
//! plumbing ([`crate::server`]), stop on drop, and record every log record
//! with its resource into a [`LogStore`].

use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use opentelemetry_proto::tonic::collector::logs::v1::logs_service_server::{
    LogsService, LogsServiceServer,
};
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::logs::v1::LogRecord;
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;
use tonic::codec::CompressionEncoding;

use crate::server::{Listening, http_error, http_response, read_post};

/// Largest request either receiver accepts (decompressed).
pub const MAX_REQUEST_BYTES: usize = 16 * 1024 * 1024;

/// One log record as received, with the resource of its `ResourceLogs`.
#[derive(Clone, Debug)]
pub struct ReceivedLog {
    pub resource: Resource,
    pub record: LogRecord,
}

impl ReceivedLog {
    /// The record's attribute `key` as text (strings as they are, other
    /// scalars formatted), if present.
    pub fn attr(&self, key: &str) -> Option<String> {
        text_of(&self.record.attributes, key)
    }

    /// The resource's attribute `key` as text, if present.
    pub fn resource_attr(&self, key: &str) -> Option<String> {
        text_of(&self.resource.attributes, key)
    }

    /// The body, when it is a string.
    pub fn body(&self) -> Option<&str> {
        match self.record.body.as_ref()?.value.as_ref()? {
            Value::StringValue(s) => Some(s),
            _ => None,
        }
    }
}

fn text_of(
    attrs: &[opentelemetry_proto::tonic::common::v1::KeyValue],
    key: &str,
) -> Option<String> {
    let value = attrs.iter().find(|kv| kv.key == key)?.value.as_ref()?;
    Some(match value.value.as_ref()? {
        Value::StringValue(s) => s.clone(),
        Value::BoolValue(b) => b.to_string(),
        Value::IntValue(i) => i.to_string(),
        Value::DoubleValue(d) => d.to_string(),
        other => format!("{other:?}"),
    })
}

/// What a receiver recorded; shared between the server thread and the test.
#[derive(Clone, Default)]
pub struct LogStore {
    records: Arc<Mutex<Vec<ReceivedLog>>>,
}

impl LogStore {
    fn record(&self, request: ExportLogsServiceRequest) {
        let mut records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        for rl in request.resource_logs {
            let resource = rl.resource.unwrap_or_default();
            for record in rl.scope_logs.into_iter().flat_map(|sl| sl.log_records) {
                records.push(ReceivedLog {
                    resource: resource.clone(),
                    record,
                });
            }
        }
    }

    /// Every log record so far, in arrival order.
    pub fn records(&self) -> Vec<ReceivedLog> {
        self.records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Waits at most `timeout` for at least `n` records; whether they came.
    pub fn wait_for_records(&self, n: usize, timeout: Duration) -> bool {
        crate::wait_until(timeout, Duration::from_millis(50), || {
            self.records().len() >= n
        })
    }
}

struct GrpcLogsService {
    store: LogStore,
}

#[tonic::async_trait]
impl LogsService for GrpcLogsService {
    async fn export(
        &self,
        request: tonic::Request<ExportLogsServiceRequest>,
    ) -> Result<tonic::Response<ExportLogsServiceResponse>, tonic::Status> {
        self.store.record(request.into_inner());
        Ok(tonic::Response::new(ExportLogsServiceResponse {
            partial_success: None,
        }))
    }
}

/// An OTLP logs receiver on 127.0.0.1; stops on drop.
pub struct LogsReceiver {
    server: Listening,
    store: LogStore,
}

impl LogsReceiver {
    /// OTLP/gRPC (`LogsService/Export`) on an OS-chosen port.
    pub fn start_grpc() -> LogsReceiver {
        let store = LogStore::default();
        let service = LogsServiceServer::new(GrpcLogsService {
            store: store.clone(),
        })
        .accept_compressed(CompressionEncoding::Gzip)
        .max_decoding_message_size(MAX_REQUEST_BYTES);
        let server = Listening::grpc(
            "otlp-logs-grpc-receiver",
            0,
            None,
            move |builder, incoming| builder.serve_with_incoming(service, incoming),
        );
        LogsReceiver { server, store }
    }

    /// OTLP/HTTP (`POST /v1/logs`, protobuf) on an OS-chosen port.
    pub fn start_http() -> LogsReceiver {
        let store = LogStore::default();
        let server_store = store.clone();
        let server = Listening::http("otlp-logs-http-receiver", 0, None, move |req| {
            handle_http(server_store.clone(), req)
        });
        LogsReceiver { server, store }
    }

    /// `http://127.0.0.1:PORT` (for HTTP, the base: `/v1/logs` is where
    /// requests go).
    pub fn endpoint(&self) -> String {
        self.server.endpoint()
    }

    /// The store the receiver records into.
    pub fn store(&self) -> &LogStore {
        &self.store
    }
}

async fn handle_http(
    store: LogStore,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (_, body) = match read_post(req, "/v1/logs", MAX_REQUEST_BYTES).await {
        Ok(read) => read,
        Err(refused) => return Ok(refused),
    };
    let request = match ExportLogsServiceRequest::decode(&body[..]) {
        Ok(r) => r,
        Err(e) => return Ok(http_error(StatusCode::BAD_REQUEST, &format!("decode: {e}"))),
    };
    store.record(request);
    let response = ExportLogsServiceResponse {
        partial_success: None,
    };
    Ok(http_response(
        StatusCode::OK,
        "application/x-protobuf",
        response.encode_to_vec(),
    ))
}
