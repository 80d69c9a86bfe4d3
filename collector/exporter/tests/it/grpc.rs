//! OTLP/gRPC exporter against an in-process receiver.

use std::sync::Arc;
use std::time::Duration;

use hermes_e2e::OtlpReceiver;
use hermes_exporter::{
    Compression, ExportError, ExporterSettings, GrpcExporter, GrpcExporterConfig, RetryClass, Sink,
    SpanExporter,
};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use tokio_util::sync::CancellationToken;

use crate::common::*;

fn exporter(endpoint: &str, compression: Compression) -> GrpcExporter {
    GrpcExporter::new(GrpcExporterConfig {
        endpoint: endpoint.into(),
        timeout: Duration::from_secs(5),
        compression,
        headers: vec![("X-Api-Key".into(), "secret".into())],
        ..GrpcExporterConfig::default()
    })
    .unwrap()
}

#[tokio::test]
async fn spans_arrive_uncompressed_with_metadata() {
    let receiver = OtlpReceiver::start();
    let mut exporter = exporter(&receiver.endpoint(), Compression::None);
    let request = request(leaf_spans(2, 3));
    let outcome = exporter.export(Arc::clone(&request)).await.unwrap();
    assert_eq!(outcome.rejected_spans, 0);

    assert!(receiver.store().until_spans(3, WAIT).await);
    let calls = receiver.store().exports();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        calls[0].request,
        ExportTraceServiceRequest::from(request.request())
    );
    assert_eq!(calls[0].encoding, None);
    assert_eq!(
        calls[0]
            .headers
            .get("x-api-key")
            .and_then(|v| v.to_str().ok()),
        Some("secret")
    );
}

#[tokio::test]
async fn spans_arrive_gzip_compressed() {
    let receiver = OtlpReceiver::start();
    let mut exporter = exporter(&receiver.endpoint(), Compression::Gzip);
    let request = request(leaf_spans(2, 50));
    exporter.export(Arc::clone(&request)).await.unwrap();

    assert!(receiver.store().until_spans(50, WAIT).await);
    let calls = receiver.store().exports();
    assert_eq!(
        calls[0].request,
        ExportTraceServiceRequest::from(request.request())
    );
    assert_eq!(calls[0].encoding.as_deref(), Some("gzip"));
}

#[tokio::test]
async fn spans_arrive_gzip_compressed_at_every_level() {
    let receiver = OtlpReceiver::start();
    for (i, level) in [1, 9].into_iter().enumerate() {
        let mut exporter = GrpcExporter::new(GrpcExporterConfig {
            endpoint: receiver.endpoint(),
            compression: Compression::Gzip,
            gzip_level: level,
            ..GrpcExporterConfig::default()
        })
        .unwrap();
        let request = request(leaf_spans(2, 50));
        exporter.export(Arc::clone(&request)).await.unwrap();
        assert!(receiver.store().until_spans(50 * (i + 1), WAIT).await);
        let calls = receiver.store().exports();
        assert_eq!(
            calls[i].request,
            ExportTraceServiceRequest::from(request.request()),
            "level {level}"
        );
        assert_eq!(calls[i].encoding.as_deref(), Some("gzip"), "level {level}");
    }
}

#[tokio::test]
async fn unreachable_receiver_is_retryable() {
    // A port that was free a moment ago: connection refused.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let mut exporter = exporter(&format!("http://127.0.0.1:{port}"), Compression::None);
    let err = exporter
        .export(request(leaf_spans(2, 1)))
        .await
        .unwrap_err();
    assert!(matches!(err, ExportError::Grpc { .. }), "{err:?}");
    assert_eq!(err.retry_class(), RetryClass::Retryable, "{err:?}");
}

#[tokio::test]
async fn stage_exports_to_grpc_and_drains_on_shutdown() {
    let receiver = OtlpReceiver::start();
    let sink = Sink::new(
        "otlp_grpc",
        exporter(&receiver.endpoint(), Compression::Gzip),
    );
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let shutdown = CancellationToken::new();
    let settings = ExporterSettings {
        max_batch_spans: 4,
        batch_timeout: Duration::from_secs(60),
        ..ExporterSettings::default()
    };
    let task = tokio::spawn(hermes_exporter::run(
        rx,
        vec![sink],
        settings,
        shutdown.clone(),
    ));
    for i in 0..5u8 {
        tx.send(ours(leaf_spans(2 + i * 2, 2))).await.unwrap();
    }
    // 10 spans: two full batches of 4 go out at once, 2 wait for shutdown.
    assert!(receiver.store().until_spans(8, WAIT).await);
    shutdown.cancel();
    let stats = task.await.unwrap();
    assert!(receiver.store().until_spans(10, WAIT).await);
    let calls = receiver.store().exports();
    assert_eq!(calls.len(), 3);
    // Merged: one resource, one scope per request.
    for call in &calls {
        assert_eq!(call.request.resource_spans.len(), 1);
        assert_eq!(call.request.resource_spans[0].scope_spans.len(), 1);
    }
    let sink = stats.sink("otlp_grpc").unwrap();
    assert_eq!(stats.spans_received(), 10);
    assert_eq!(sink.spans_sent(), 10);
    assert_eq!(sink.spans_failed(), 0);
    assert_eq!(sink.batches_sent(), 3);
}
