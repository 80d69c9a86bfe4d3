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

async fn export<E: SpanExporter + ?Sized>(exporter: &mut E) -> Result<(), ExportError> {
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

/// An exporter under test: what the stage runs, and its `Debug` form.
trait Exporter: SpanExporter + std::fmt::Debug {}
impl<T: SpanExporter + std::fmt::Debug> Exporter for T {}

/// The two OTLP transports, each tested the same way.
#[derive(Clone, Copy, Debug)]
enum Transport {
    Grpc,
    Http,
}

impl Transport {
    const BOTH: [Transport; 2] = [Transport::Grpc, Transport::Http];

    /// A receiver of this transport over `tls`.
    fn receiver(self, tls: &ServerTls) -> OtlpReceiver {
        match self {
            Transport::Grpc => OtlpReceiver::start_tls(tls),
            Transport::Http => OtlpHttpReceiver::start_tls(tls).into_inner(),
        }
    }

    /// This transport's exporter to `endpoint` with `tls`.
    fn exporter(self, endpoint: &str, tls: TlsSettings) -> Result<Box<dyn Exporter>, ExportError> {
        Ok(match self {
            Transport::Grpc => Box::new(grpc(endpoint, tls)?),
            Transport::Http => Box::new(http(endpoint, tls)?),
        })
    }
}

#[tokio::test]
async fn over_tls_with_a_custom_ca() {
    let pki = pki();
    for t in Transport::BOTH {
        let receiver = t.receiver(&pki.receiver_tls(false));
        let endpoint = receiver.endpoint();

        let mut exporter = t.exporter(&endpoint, tls(&pki.ca.pem, None)).unwrap();
        export(&mut *exporter).await.unwrap();
        let api_key = Some(API_KEY.to_owned());
        assert_eq!(calls(receiver.store()), [(3, api_key)], "{t:?}");
        assert!(!format!("{exporter:?}").contains(API_KEY), "{t:?}");

        // Another CA: the receiver's certificate is not trusted.
        let mut wrong = t.exporter(&endpoint, tls(&pki.other_ca.pem, None)).unwrap();
        assert_handshake_failure(export(&mut *wrong).await, "UnknownIssuer");
        // The name the certificate must carry is checked too.
        let mut other_name = t
            .exporter(
                &endpoint,
                TlsSettings {
                    server_name: Some("collector.example".into()),
                    ..tls(&pki.ca.pem, None)
                },
            )
            .unwrap();
        assert_handshake_failure(export(&mut *other_name).await, "not valid for name");
        assert_eq!(calls(receiver.store()).len(), 1, "{t:?}");
    }
}

#[test]
fn http_keeps_https_and_appends_the_path() {
    let exporter = http("https://127.0.0.1:4318", tls(&pki().ca.pem, None)).unwrap();
    assert_eq!(
        exporter.uri().to_string(),
        "https://127.0.0.1:4318/v1/traces"
    );
}

#[tokio::test]
async fn mutual_tls() {
    let pki = pki();
    for t in Transport::BOTH {
        let receiver = t.receiver(&pki.receiver_tls(true));
        let endpoint = receiver.endpoint();

        let mut without = t.exporter(&endpoint, tls(&pki.ca.pem, None)).unwrap();
        let error = export(&mut *without).await.unwrap_err();
        assert!(
            calls(receiver.store()).is_empty(),
            "{t:?} served without a certificate"
        );
        // TLS 1.3: the refusal arrives as an alert after our side of the
        // handshake. Over HTTP it is read as a handshake failure naming the
        // alert. Over gRPC it is only when the call's error carries the
        // alert (tonic's `transport error` over hyper's I/O error); when the
        // HTTP/2 connection closes first, the call ends as `Cancelled` with
        // nothing below hyper's "connection closed": hyper's connection task
        // keeps its own I/O error (the alert, if it read it at all) and
        // drops it, so the exporter cannot name the refusal from tonic's
        // error. It could only by owning the TLS connector and recording
        // what the connection read.
        let refused = match t {
            Transport::Http => matches!(error, ExportError::TlsHandshake(_)),
            Transport::Grpc => matches!(
                error,
                ExportError::TlsHandshake(_)
                    | ExportError::Grpc {
                        transport: true,
                        ..
                    }
            ),
        };
        assert!(refused, "{t:?}: refused in the handshake, not {error:?}");
        // A certificate from a CA the receiver does not trust: refused too.
        let stranger = pki.other_ca.client("stranger");
        let mut untrusted = t
            .exporter(&endpoint, tls(&pki.ca.pem, Some(&stranger)))
            .unwrap();
        assert!(export(&mut *untrusted).await.is_err(), "{t:?}");
        assert!(calls(receiver.store()).is_empty(), "{t:?}");

        let mut with = t
            .exporter(&endpoint, tls(&pki.ca.pem, Some(&pki.client)))
            .unwrap();
        export(&mut *with).await.unwrap();
        let api_key = Some(API_KEY.to_owned());
        assert_eq!(calls(receiver.store()), [(3, api_key)], "{t:?}");
    }
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
    tx.send(spans(4).into()).await.unwrap();
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
            let key = String::from_utf8_lossy(case.client_key_pem.as_deref().unwrap_or(b"-"))
                .lines()
                .nth(1)
                .unwrap_or("-")
                .to_owned();
            assert!(!format!("{case:?}").contains(&key));
            for t in Transport::BOTH {
                let e = t.exporter(endpoint, case.clone()).unwrap_err();
                assert!(matches!(e, ExportError::TlsConfig(_)), "{t:?} {i}: {e:?}");
                assert_eq!(e.retry_class(), RetryClass::NonRetryable, "{t:?} {i}");
                assert!(!e.to_string().contains(&key), "{t:?} {i}: {e}");
            }
        }
    }
    // TLS settings with a plaintext endpoint: never silently plaintext.
    for t in Transport::BOTH {
        let plain = t
            .exporter("http://127.0.0.1:1", tls(&pki.ca.pem, None))
            .unwrap_err();
        assert!(
            matches!(plain, ExportError::InvalidEndpoint { .. }),
            "{t:?}: {plain:?}"
        );
    }
}
