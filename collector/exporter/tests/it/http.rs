//! OTLP/HTTP exporter against the scriptable in-test receiver.

use std::sync::Arc;
use std::time::Duration;

use hermes_e2e::OtlpHttpReceiver;
use hermes_e2e::otlp_receiver::Rejection;
use hermes_exporter::{
    ExportError, ExporterSettings, HttpExporter, HttpExporterConfig, RetryClass, RetrySettings,
    Sink, SpanExporter,
};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use tokio_util::sync::CancellationToken;

use crate::common::*;

fn exporter(endpoint: &str) -> HttpExporter {
    HttpExporter::new(HttpExporterConfig {
        endpoint: endpoint.into(),
        timeout: Duration::from_secs(5),
        headers: vec![("Authorization".into(), "Bearer t0k3n".into())],
    })
    .unwrap()
}

fn fast_retry() -> ExporterSettings {
    ExporterSettings {
        batch_timeout: Duration::from_millis(10),
        retry: RetrySettings {
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(50),
            max_elapsed: Duration::from_secs(10),
        },
        ..ExporterSettings::default()
    }
}

/// Runs the stage with one HTTP sink, sends `spans`, closes the channel and
/// returns the final stats.
async fn run_stage(
    endpoint: &str,
    spans: Vec<opentelemetry_proto::tonic::trace::v1::Span>,
) -> Arc<hermes_exporter::ExporterStats> {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let task = tokio::spawn(hermes_exporter::run(
        rx,
        vec![Sink::new("otlp_http", exporter(endpoint))],
        fast_retry(),
        CancellationToken::new(),
    ));
    tx.send(ours(spans).into()).await.unwrap();
    drop(tx);
    task.await.unwrap()
}

#[tokio::test]
async fn posts_protobuf_to_v1_traces() {
    let receiver = OtlpHttpReceiver::start();
    let mut exporter = exporter(&receiver.endpoint());
    assert_eq!(exporter.uri().to_string(), receiver.traces_url());
    let request = request(leaf_spans(2, 3));
    let outcome = exporter.export(Arc::clone(&request)).await.unwrap();
    assert_eq!(outcome.rejected_spans, 0);

    // The receiver records only a `POST /v1/traces` (404 or 405 otherwise).
    let calls = receiver.store().exports();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].transport, "http");
    assert_eq!(
        calls[0].content_type.as_deref(),
        Some("application/x-protobuf")
    );
    assert_eq!(
        calls[0]
            .headers
            .get("authorization")
            .and_then(|v| v.to_str().ok()),
        Some("Bearer t0k3n")
    );
    assert_eq!(
        calls[0].request,
        ExportTraceServiceRequest::from(request.request())
    );
}

#[tokio::test]
async fn endpoint_with_path_is_used_as_is() {
    let receiver = OtlpHttpReceiver::start();
    let mut exporter = exporter(&receiver.traces_url());
    assert_eq!(exporter.uri().to_string(), receiver.traces_url());
    // Accepted: the receiver answers 404 to any other path.
    exporter.export(request(leaf_spans(2, 1))).await.unwrap();
    assert_eq!(receiver.store().exports().len(), 1);
}

#[tokio::test]
async fn status_mapping() {
    let receiver = OtlpHttpReceiver::start();
    receiver.store().script([
        Rejection::Throttled {
            retry_after_secs: 7,
        },
        Rejection::Unavailable,
        Rejection::InvalidArgument,
        Rejection::Internal,
    ]);
    let mut exporter = exporter(&receiver.endpoint());
    let mut class = async || {
        let err = exporter
            .export(request(leaf_spans(2, 1)))
            .await
            .unwrap_err();
        assert!(matches!(err, ExportError::HttpStatus { .. }), "{err:?}");
        err.retry_class()
    };
    assert_eq!(class().await, RetryClass::Throttled(Duration::from_secs(7)));
    assert_eq!(class().await, RetryClass::Retryable);
    assert_eq!(class().await, RetryClass::NonRetryable);
    assert_eq!(class().await, RetryClass::Retryable);
}

#[tokio::test]
async fn unavailable_twice_then_ok_is_retried_and_arrives_once() {
    let receiver = OtlpHttpReceiver::start();
    receiver.store().fail_next(2);
    let stats = run_stage(&receiver.endpoint(), leaf_spans(2, 3)).await;

    // Two 503s (the script answers the first two requests), then one
    // accepted request with the three spans.
    assert_eq!(receiver.store().rejected(), 2);
    let accepted: Vec<_> = receiver
        .store()
        .exports()
        .into_iter()
        .map(|c| c.request)
        .collect();
    assert_eq!(accepted.len(), 1);
    assert_eq!(all_spans(&accepted).len(), 3);

    let sink = stats.sink("otlp_http").unwrap();
    assert_eq!(sink.spans_sent(), 3);
    assert_eq!(sink.spans_failed(), 0);
    assert_eq!(sink.retries(), 2);
}

#[tokio::test]
async fn bad_request_is_not_retried_and_counted_failed() {
    let receiver = OtlpHttpReceiver::start();
    receiver.store().script([Rejection::InvalidArgument]);
    let stats = run_stage(&receiver.endpoint(), leaf_spans(2, 3)).await;

    assert_eq!(receiver.store().rejected(), 1);
    assert!(receiver.store().exports().is_empty());
    let sink = stats.sink("otlp_http").unwrap();
    assert_eq!(sink.spans_sent(), 0);
    assert_eq!(sink.spans_failed(), 3);
    assert_eq!(sink.batches_failed(), 1);
    assert_eq!(sink.retries(), 0);
}
