//! The OTLP log export (`LogsExporter`) against the in-test logs receivers
//! on 127.0.0.1: a request arrives whole over gRPC and over HTTP, and a
//! receiver that is gone fails with a retryable error given up after
//! `max_elapsed`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use hermes_e2e::LogsReceiver;
use hermes_exporter::{
    Delivery, GrpcExporterConfig, HttpExporterConfig, LogsExporter, RetrySettings,
};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, any_value::Value};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(10);

fn request(body: &str) -> ExportLogsServiceRequest {
    ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            scope_logs: vec![ScopeLogs {
                log_records: vec![LogRecord {
                    body: Some(AnyValue {
                        value: Some(Value::StringValue(body.to_owned())),
                    }),
                    event_name: "test.event".to_owned(),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

fn grpc(endpoint: String) -> LogsExporter {
    let config = GrpcExporterConfig {
        endpoint,
        ..GrpcExporterConfig::default()
    };
    LogsExporter::grpc(config, None).unwrap()
}

fn http(endpoint: String) -> LogsExporter {
    let config = HttpExporterConfig {
        endpoint,
        ..HttpExporterConfig::default()
    };
    LogsExporter::http(config, None).unwrap()
}

#[tokio::test]
async fn a_log_request_arrives_over_grpc_and_http() {
    for (name, receiver) in [
        ("grpc", LogsReceiver::start_grpc()),
        ("http", LogsReceiver::start_http()),
    ] {
        let mut exporter = match name {
            "grpc" => grpc(receiver.endpoint()),
            _ => http(receiver.endpoint()),
        };
        let delivery = exporter
            .export_with_retry(
                &request(name),
                &RetrySettings::default(),
                &CancellationToken::new(),
            )
            .await;
        assert!(
            matches!(
                delivery,
                Delivery::Sent {
                    rejected: 0,
                    retries: 0
                }
            ),
            "{name}: {delivery:?}"
        );
        assert!(receiver.store().wait_for_records(1, WAIT), "{name}");
        let records = receiver.store().records();
        assert_eq!(records.len(), 1, "{name}");
        assert_eq!(records[0].body(), Some(name));
        assert_eq!(records[0].record.event_name, "test.event");
    }
}

#[tokio::test]
async fn a_receiver_that_is_gone_is_given_up_after_max_elapsed() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let retry = RetrySettings {
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(20),
        max_elapsed: Duration::from_millis(200),
    };
    for mut exporter in [grpc(endpoint.clone()), http(endpoint.clone())] {
        let delivery = exporter
            .export_with_retry(&request("lost"), &retry, &CancellationToken::new())
            .await;
        assert!(
            matches!(&delivery, Delivery::Failed(e) if e.retry_class() != hermes_exporter::RetryClass::NonRetryable),
            "{} {delivery:?}",
            exporter.destination()
        );
    }
    let stop = CancellationToken::new();
    stop.cancel();
    let delivery = grpc(endpoint)
        .export_with_retry(&request("stopped"), &retry, &stop)
        .await;
    assert!(matches!(delivery, Delivery::Stopped), "{delivery:?}");
}
