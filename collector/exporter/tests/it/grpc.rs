//! OTLP/gRPC exporter against an in-process receiver.

use std::sync::Arc;
use std::time::Duration;

use hermes_e2e::{OtlpReceiver, ReceivedExport};
use hermes_exporter::{
    Compression, ExportError, ExporterSettings, ExporterStage, GrpcExporter, GrpcExporterConfig,
    Outgoing, RetryClass, Sink, SpanExporter,
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

/// A stage exporting to `receiver` over gRPC with gzip, in batches of at
/// most 4 spans, sent when full or at shutdown.
fn by_fours(receiver: &OtlpReceiver) -> ExporterStage {
    let sink = Sink::new(
        "otlp_grpc",
        exporter(&receiver.endpoint(), Compression::Gzip),
    );
    let settings = ExporterSettings {
        max_batch_spans: 4,
        batch_timeout: Duration::from_secs(60),
        ..ExporterSettings::default()
    };
    ExporterStage::new(vec![sink], settings)
}

/// Runs `stage` ([`by_fours`]) on `messages`, ten spans, then shuts it
/// down; the requests `receiver` got, in order.
async fn ten_spans_then_shutdown(
    stage: ExporterStage,
    receiver: &OtlpReceiver,
    messages: Vec<Outgoing>,
) -> Vec<ReceivedExport> {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(stage.run(rx, shutdown.clone()));
    for message in messages {
        tx.send(message).await.unwrap();
    }
    // Two full batches of 4 go out at once, 2 spans wait for shutdown.
    assert!(receiver.store().until_spans(8, WAIT).await);
    shutdown.cancel();
    let stats = task.await.unwrap();
    assert!(receiver.store().until_spans(10, WAIT).await);
    let sink = stats.sink("otlp_grpc").unwrap();
    assert_eq!(stats.spans_received(), 10);
    assert_eq!(sink.spans_sent(), 10);
    assert_eq!(sink.spans_failed(), 0);
    assert_eq!(sink.batches_sent(), 3);
    let calls = receiver.store().exports();
    assert_eq!(calls.len(), 3);
    calls
}

/// Five groups of two spans.
fn five_pairs() -> impl Iterator<Item = Vec<hermes_span::trace::v1::ResourceSpans>> {
    (0..5u8).map(|i| ours(leaf_spans(2 + i * 2, 2)))
}

#[tokio::test]
async fn stage_exports_to_grpc_and_drains_on_shutdown() {
    let receiver = OtlpReceiver::start();
    let messages = five_pairs().map(Outgoing::from).collect();
    let calls = ten_spans_then_shutdown(by_fours(&receiver), &receiver, messages).await;
    // Merged: one resource, one scope per request.
    for call in &calls {
        assert_eq!(call.request.resource_spans.len(), 1);
        assert_eq!(call.request.resource_spans[0].scope_spans.len(), 1);
    }
}

/// The correlation stage's path when every sink sends protobuf: spans
/// encoded by the stage's encoder, joined by the exporter stage, arrive at
/// a real OTLP receiver whole and in order, within the batch limit.
#[tokio::test]
async fn encoded_spans_are_joined_and_arrive_whole() {
    let receiver = OtlpReceiver::start();
    let stage = by_fours(&receiver);
    let encoder = stage.encoder().expect("a gRPC sink takes encoded batches");
    let messages = five_pairs().map(|spans| encoder.encode(spans)).collect();
    let calls = ten_spans_then_shutdown(stage, &receiver, messages).await;
    // Joined, not merged: each group keeps its resource entry.
    let entries: Vec<usize> = calls
        .iter()
        .map(|c| c.request.resource_spans.len())
        .collect();
    assert_eq!(entries, vec![2, 2, 1]);
    let names: Vec<String> = calls
        .iter()
        .flat_map(|c| &c.request.resource_spans)
        .flat_map(|rs| &rs.scope_spans)
        .flat_map(|ss| &ss.spans)
        .map(|span| span.name.clone())
        .collect();
    let sent: Vec<String> = five_pairs()
        .flatten()
        .flat_map(|rs| rs.scope_spans)
        .flat_map(|ss| ss.spans)
        .map(|span| span.name.to_string())
        .collect();
    assert_eq!(names, sent);
}
