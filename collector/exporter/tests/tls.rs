//! The OTLP exporters against in-test receivers over TLS (certificates made
//! by `rcgen` at test time, on 127.0.0.1): a custom CA works, a wrong CA
//! fails with a clear, non-retryable error that the stage counts as failed
//! spans, a receiver that requires a client certificate gets one when it is
//! configured and refuses the connection when it is not; configured headers
//! arrive, and their values stay out of `Debug` output.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use hermes_e2e::pki::{Ca, Leaf};
use hermes_e2e::{OtlpHttpReceiver, OtlpReceiver, ServerTls, SpanStore};
use hermes_exporter::{
    ExportError, ExporterSettings, ExporterStage, GrpcExporter, GrpcExporterConfig, HttpExporter,
    HttpExporterConfig, RetryClass, RetrySettings, Sink, SpanExporter, TlsSettings,
};
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(10);

/// The receivers' CA, their certificate, a client certificate from the same
/// CA, and another CA.
struct Pki {
    ca: Ca,
    server: Leaf,
    client: Leaf,
    other_ca: Ca,
}

fn pki() -> Pki {
    let ca = Ca::new("exporter test CA");
    Pki {
        server: ca.server(&["localhost", "127.0.0.1"]),
        client: ca.client("collector-1"),
        ca,
        other_ca: Ca::new("another CA"),
    }
}

impl Pki {
    /// The receivers' TLS, requiring a client certificate from the CA when
    /// `mutual`.
    fn receiver_tls(&self, mutual: bool) -> ServerTls {
        ServerTls::new(&self.server, mutual.then_some(&self.ca))
    }
}

fn tls(ca_pem: &str, client: Option<&Leaf>) -> TlsSettings {
    TlsSettings {
        ca_pem: Some(ca_pem.as_bytes().to_vec()),
        client_cert_pem: client.map(|c| c.cert_pem.as_bytes().to_vec()),
        client_key_pem: client.map(|c| c.key_pem.as_bytes().to_vec()),
        server_name: None,
    }
}

/// What a receiver got, call by call: the span count and the `x-api-key`
/// header.
fn calls(store: &SpanStore) -> Vec<(usize, Option<String>)> {
    store
        .exports()
        .iter()
        .map(|export| {
            let spans = export
                .request
                .resource_spans
                .iter()
                .flat_map(|rs| &rs.scope_spans)
                .map(|ss| ss.spans.len())
                .sum();
            let key = export
                .headers
                .get("x-api-key")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            (spans, key)
        })
        .collect()
}

// ------------------------------------------------------------------ helpers

fn spans(n: u8) -> Vec<hermes_span::trace::v1::ResourceSpans> {
    hermes_span::convert::from_otlp(vec![ResourceSpans {
        scope_spans: vec![ScopeSpans {
            spans: (1..=n)
                .map(|i| Span {
                    trace_id: vec![7; 16],
                    span_id: vec![0, 0, 0, 0, 0, 0, 0, i],
                    name: format!("span {i}"),
                    start_time_unix_nano: 1,
                    end_time_unix_nano: 2,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }],
        ..Default::default()
    }])
}

fn request(n: u8) -> Arc<hermes_exporter::ExportBatch> {
    Arc::new(hermes_exporter::ExportBatch::new(
        hermes_span::collector::trace::v1::ExportTraceServiceRequest {
            resource_spans: spans(n),
        },
    ))
}

const API_KEY: &str = "k3y-from-a-secret-file";

fn grpc(endpoint: &str, tls: TlsSettings) -> Result<GrpcExporter, ExportError> {
    GrpcExporter::new_with_tls(
        GrpcExporterConfig {
            endpoint: endpoint.into(),
            timeout: Duration::from_secs(5),
            headers: vec![("X-Api-Key".into(), API_KEY.into())],
            ..GrpcExporterConfig::default()
        },
        Some(tls),
    )
}

fn http(endpoint: &str, tls: TlsSettings) -> Result<HttpExporter, ExportError> {
    HttpExporter::new_with_tls(
        HttpExporterConfig {
            endpoint: endpoint.into(),
            timeout: Duration::from_secs(5),
            headers: vec![("X-Api-Key".into(), API_KEY.into())],
        },
        Some(tls),
    )
}

async fn export(exporter: &mut dyn SpanExporter) -> Result<(), ExportError> {
    tokio::time::timeout(WAIT, exporter.export(request(3)))
        .await
        .expect("export answers within its timeout")
        .map(|_| ())
}

/// The error of a failed handshake: non-retryable, saying what to check.
fn assert_handshake_failure(result: Result<(), ExportError>, expected: &str) {
    let error = result.expect_err("the export must fail");
    assert!(
        matches!(error, ExportError::TlsHandshake(_)),
        "a TLS handshake error, not {error:?}"
    );
    assert_eq!(error.retry_class(), RetryClass::NonRetryable);
    let text = error.to_string();
    assert!(text.contains(expected), "{text}");
    assert!(!text.contains(API_KEY), "{text}");
}

// -------------------------------------------------------------------- tests

#[tokio::test]
async fn grpc_over_tls_with_a_custom_ca() {
    let pki = pki();
    let receiver = OtlpReceiver::start_tls(&pki.receiver_tls(false));
    let endpoint = receiver.endpoint();

    let mut exporter = grpc(&endpoint, tls(&pki.ca.pem, None)).unwrap();
    export(&mut exporter).await.unwrap();
    assert_eq!(calls(receiver.store()), [(3, Some(API_KEY.to_owned()))]);
    assert!(!format!("{exporter:?}").contains(API_KEY));

    // Another CA: the receiver's certificate is not trusted.
    let mut wrong = grpc(&endpoint, tls(&pki.other_ca.pem, None)).unwrap();
    assert_handshake_failure(export(&mut wrong).await, "UnknownIssuer");
    // The name the certificate must carry is checked too.
    let mut other_name = grpc(
        &endpoint,
        TlsSettings {
            server_name: Some("collector.example".into()),
            ..tls(&pki.ca.pem, None)
        },
    )
    .unwrap();
    assert_handshake_failure(export(&mut other_name).await, "not valid for name");
    assert_eq!(calls(receiver.store()).len(), 1);
}

#[tokio::test]
async fn grpc_mutual_tls() {
    let pki = pki();
    let receiver = OtlpReceiver::start_tls(&pki.receiver_tls(true));
    let endpoint = receiver.endpoint();

    let mut without = grpc(&endpoint, tls(&pki.ca.pem, None)).unwrap();
    let error = export(&mut without).await.unwrap_err();
    assert!(
        calls(receiver.store()).is_empty(),
        "served without a certificate"
    );
    // TLS 1.3: the refusal arrives as an alert after our side of the
    // handshake; either way it is a handshake failure naming the alert.
    assert!(
        matches!(error, ExportError::TlsHandshake(_)),
        "a TLS handshake error, not {error:?}"
    );

    let mut with = grpc(&endpoint, tls(&pki.ca.pem, Some(&pki.client))).unwrap();
    export(&mut with).await.unwrap();
    assert_eq!(calls(receiver.store()), [(3, Some(API_KEY.to_owned()))]);
}

#[tokio::test]
async fn http_over_tls_with_a_custom_ca() {
    let pki = pki();
    let receiver = OtlpHttpReceiver::start_tls(&pki.receiver_tls(false));
    let endpoint = receiver.endpoint();

    let mut exporter = http(&endpoint, tls(&pki.ca.pem, None)).unwrap();
    assert_eq!(
        exporter.uri().to_string(),
        format!("{endpoint}/v1/traces"),
        "https kept, path appended"
    );
    export(&mut exporter).await.unwrap();
    assert_eq!(calls(receiver.store()), [(3, Some(API_KEY.to_owned()))]);
    assert!(!format!("{exporter:?}").contains(API_KEY));

    let mut wrong = http(&endpoint, tls(&pki.other_ca.pem, None)).unwrap();
    assert_handshake_failure(export(&mut wrong).await, "UnknownIssuer");
    assert_eq!(calls(receiver.store()).len(), 1);
}

#[tokio::test]
async fn http_mutual_tls() {
    let pki = pki();
    let receiver = OtlpHttpReceiver::start_tls(&pki.receiver_tls(true));
    let endpoint = receiver.endpoint();

    let mut without = http(&endpoint, tls(&pki.ca.pem, None)).unwrap();
    let error = export(&mut without).await.unwrap_err();
    assert!(
        calls(receiver.store()).is_empty(),
        "served without a certificate"
    );
    assert!(
        matches!(error, ExportError::TlsHandshake(_)),
        "a TLS handshake error, not {error:?}"
    );
    // A certificate from a CA the receiver does not trust: refused too.
    let stranger = pki.other_ca.client("stranger");
    let mut untrusted = http(&endpoint, tls(&pki.ca.pem, Some(&stranger))).unwrap();
    assert!(export(&mut untrusted).await.is_err());
    assert!(calls(receiver.store()).is_empty());

    let mut with = http(&endpoint, tls(&pki.ca.pem, Some(&pki.client))).unwrap();
    export(&mut with).await.unwrap();
    assert_eq!(calls(receiver.store()), [(3, Some(API_KEY.to_owned()))]);
}

/// Through the stage: a wrong CA drops the batch at once (no retry for the
/// whole `max_elapsed`) and counts its spans as failed.
#[tokio::test]
async fn a_wrong_ca_is_counted_as_failed_spans_without_retrying() {
    let pki = pki();
    let grpc_receiver = OtlpReceiver::start_tls(&pki.receiver_tls(false));
    let http_receiver = OtlpHttpReceiver::start_tls(&pki.receiver_tls(false));
    let (grpc_endpoint, http_endpoint) = (grpc_receiver.endpoint(), http_receiver.endpoint());
    let sinks = vec![
        Sink::new(
            "otlp_grpc",
            grpc(&grpc_endpoint, tls(&pki.other_ca.pem, None)).unwrap(),
        ),
        Sink::new(
            "otlp_http",
            http(&http_endpoint, tls(&pki.other_ca.pem, None)).unwrap(),
        ),
    ];
    let stage = ExporterStage::new(
        sinks,
        ExporterSettings {
            batch_timeout: Duration::from_millis(10),
            retry: RetrySettings {
                max_elapsed: Duration::from_secs(60),
                ..RetrySettings::default()
            },
            ..ExporterSettings::default()
        },
    );
    let stats = stage.stats();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(stage.run(rx, shutdown.clone()));
    tx.send(spans(4)).await.unwrap();
    drop(tx);
    // Well within max_elapsed: no retries.
    tokio::time::timeout(WAIT, task)
        .await
        .expect("the stage drains without retrying")
        .unwrap();
    for name in ["otlp_grpc", "otlp_http"] {
        let sink = stats.sink(name).unwrap();
        assert_eq!(sink.spans_failed(), 4, "{name}");
        assert_eq!(sink.spans_sent(), 0, "{name}");
        assert_eq!(sink.retries(), 0, "{name}");
    }
}

#[test]
fn bad_tls_settings_are_refused_when_building() {
    let pki = pki();
    for endpoint in ["https://127.0.0.1:1"] {
        // Not PEM, a key without its certificate, a key of another
        // certificate.
        let cases = [
            TlsSettings {
                ca_pem: Some(b"garbage".to_vec()),
                ..TlsSettings::default()
            },
            TlsSettings {
                client_key_pem: Some(pki.client.key_pem.as_bytes().to_vec()),
                ..tls(&pki.ca.pem, None)
            },
            TlsSettings {
                client_cert_pem: Some(pki.client.cert_pem.as_bytes().to_vec()),
                client_key_pem: Some(pki.server.key_pem.as_bytes().to_vec()),
                ..tls(&pki.ca.pem, None)
            },
        ];
        for (i, case) in cases.into_iter().enumerate() {
            let g = grpc(endpoint, case.clone()).unwrap_err();
            assert!(matches!(g, ExportError::TlsConfig(_)), "{i}: {g:?}");
            let h = http(endpoint, case.clone()).unwrap_err();
            assert!(matches!(h, ExportError::TlsConfig(_)), "{i}: {h:?}");
            assert_eq!(g.retry_class(), RetryClass::NonRetryable);
            let key = String::from_utf8_lossy(case.client_key_pem.as_deref().unwrap_or(b"-"))
                .lines()
                .nth(1)
                .unwrap_or("-")
                .to_owned();
            assert!(!g.to_string().contains(&key), "{g}");
            assert!(!format!("{case:?}").contains(&key));
        }
    }
    // TLS settings with a plaintext endpoint: never silently plaintext.
    let plain = grpc("http://127.0.0.1:1", tls(&pki.ca.pem, None)).unwrap_err();
    assert!(
        matches!(plain, ExportError::InvalidEndpoint { .. }),
        "{plain:?}"
    );
    let plain = http("http://127.0.0.1:1", tls(&pki.ca.pem, None)).unwrap_err();
    assert!(
        matches!(plain, ExportError::InvalidEndpoint { .. }),
        "{plain:?}"
    );
}
