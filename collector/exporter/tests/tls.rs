//! The OTLP exporters against in-test receivers over TLS (certificates made
//! by `rcgen` at test time, on 127.0.0.1): a custom CA works, a wrong CA
//! fails with a clear, non-retryable error that the stage counts as failed
//! spans, a receiver that requires a client certificate gets one when it is
//! configured and refuses the connection when it is not; configured headers
//! arrive, and their values stay out of `Debug` output.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use hermes_exporter::{
    ExportError, ExporterSettings, ExporterStage, GrpcExporter, GrpcExporterConfig, HttpExporter,
    HttpExporterConfig, RetryClass, RetrySettings, Sink, SpanExporter, TlsSettings,
};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(10);

// ------------------------------------------------------------ certificates

struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

fn ca(name: &str) -> Ca {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let cert = params.self_signed(&key).unwrap();
    Ca {
        pem: cert.pem(),
        issuer: Issuer::new(params, key),
    }
}

/// A leaf certificate and its key (PEM) for `names`, signed by `ca`.
fn leaf(ca: &Ca, names: &[&str], usage: ExtendedKeyUsagePurpose) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let mut params =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
    params.distinguished_name.push(DnType::CommonName, names[0]);
    params.extended_key_usages = vec![usage];
    let cert = params.signed_by(&key, &ca.issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// The receivers' CA, their certificate, a client certificate from the same
/// CA, and another CA.
struct Pki {
    ca: Ca,
    server: (String, String),
    client: (String, String),
    other_ca: Ca,
}

fn pki() -> Pki {
    let ca = ca("exporter test CA");
    let server = leaf(
        &ca,
        &["localhost", "127.0.0.1"],
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let client = leaf(&ca, &["collector-1"], ExtendedKeyUsagePurpose::ClientAuth);
    Pki {
        ca,
        server,
        client,
        other_ca: ca_other(),
    }
}

fn ca_other() -> Ca {
    ca("another CA")
}

fn tls(ca_pem: &str, client: Option<&(String, String)>) -> TlsSettings {
    TlsSettings {
        ca_pem: Some(ca_pem.as_bytes().to_vec()),
        client_cert_pem: client.map(|c| c.0.as_bytes().to_vec()),
        client_key_pem: client.map(|c| c.1.as_bytes().to_vec()),
        server_name: None,
    }
}

// --------------------------------------------------------------- receivers

/// One export call: its span count and its `x-api-key` header.
type Call = (usize, Option<String>);

/// What a receiver got, call by call.
#[derive(Clone, Default)]
struct Recorded(Arc<Mutex<Vec<Call>>>);

impl Recorded {
    fn push(&self, request: &ExportTraceServiceRequest, api_key: Option<String>) {
        let spans = request
            .resource_spans
            .iter()
            .flat_map(|rs| &rs.scope_spans)
            .map(|ss| ss.spans.len())
            .sum();
        self.0.lock().unwrap().push((spans, api_key));
    }

    fn calls(&self) -> Vec<Call> {
        self.0.lock().unwrap().clone()
    }
}

#[tonic::async_trait]
impl TraceService for Recorded {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let key = request
            .metadata()
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        self.push(request.get_ref(), key);
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// An OTLP/gRPC receiver over TLS on 127.0.0.1, requiring a client
/// certificate from `client_ca` if given. Stops when `stop` is cancelled.
async fn grpc_receiver(
    pki: &Pki,
    client_ca: Option<&str>,
    stop: &CancellationToken,
) -> (String, Recorded) {
    use tonic::transport::{Certificate, Identity, ServerTlsConfig};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut tls = ServerTlsConfig::new().identity(Identity::from_pem(&pki.server.0, &pki.server.1));
    if let Some(ca) = client_ca {
        tls = tls.client_ca_root(Certificate::from_pem(ca));
    }
    let recorded = Recorded::default();
    let server = tonic::transport::Server::builder()
        .tls_config(tls)
        .unwrap()
        .add_service(TraceServiceServer::new(recorded.clone()))
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::TcpListenerStream::new(listener),
            stop.clone().cancelled_owned(),
        );
    tokio::spawn(server);
    (format!("https://127.0.0.1:{}", addr.port()), recorded)
}

/// An OTLP/HTTP receiver (HTTP/1.1 over TLS) on 127.0.0.1, requiring a
/// client certificate from `client_ca` if given.
async fn http_receiver(
    pki: &Pki,
    client_ca: Option<&str>,
    stop: &CancellationToken,
) -> (String, Recorded) {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = match client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
                roots.add(cert.unwrap()).unwrap();
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .unwrap();
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let chain = CertificateDer::pem_slice_iter(pki.server.0.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_slice(pki.server.1.as_bytes()).unwrap();
    let mut config = builder.with_single_cert(chain, key).unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let recorded = Recorded::default();
    let record = recorded.clone();
    let stop = stop.clone();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(_) => continue,
                },
                () = stop.cancelled() => break,
            };
            let acceptor = acceptor.clone();
            let record = record.clone();
            tokio::spawn(async move {
                // A refused handshake just ends this connection.
                let Ok(Ok(stream)) = tokio::time::timeout(WAIT, acceptor.accept(tcp)).await else {
                    return;
                };
                let service = service_fn(move |request: hyper::Request<Incoming>| {
                    let record = record.clone();
                    async move {
                        let key = request
                            .headers()
                            .get("x-api-key")
                            .and_then(|v| v.to_str().ok())
                            .map(str::to_owned);
                        let body = request.into_body().collect().await.unwrap().to_bytes();
                        let decoded = ExportTraceServiceRequest::decode(body).unwrap();
                        record.push(&decoded, key);
                        let response = ExportTraceServiceResponse::default().encode_to_vec();
                        Ok::<_, Infallible>(
                            hyper::Response::builder()
                                .header("content-type", "application/x-protobuf")
                                .body(Full::new(Bytes::from(response)))
                                .unwrap(),
                        )
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (format!("https://127.0.0.1:{}", addr.port()), recorded)
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
    let stop = CancellationToken::new();
    let (endpoint, recorded) = grpc_receiver(&pki, None, &stop).await;

    let mut exporter = grpc(&endpoint, tls(&pki.ca.pem, None)).unwrap();
    export(&mut exporter).await.unwrap();
    assert_eq!(recorded.calls(), [(3, Some(API_KEY.to_owned()))]);
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
    assert_eq!(recorded.calls().len(), 1);
    stop.cancel();
}

#[tokio::test]
async fn grpc_mutual_tls() {
    let pki = pki();
    let stop = CancellationToken::new();
    let (endpoint, recorded) = grpc_receiver(&pki, Some(&pki.ca.pem), &stop).await;

    let mut without = grpc(&endpoint, tls(&pki.ca.pem, None)).unwrap();
    let error = export(&mut without).await.unwrap_err();
    assert!(recorded.calls().is_empty(), "served without a certificate");
    // TLS 1.3: the refusal arrives as an alert after our side of the
    // handshake; either way it is a handshake failure naming the alert.
    assert!(
        matches!(error, ExportError::TlsHandshake(_)),
        "a TLS handshake error, not {error:?}"
    );

    let mut with = grpc(&endpoint, tls(&pki.ca.pem, Some(&pki.client))).unwrap();
    export(&mut with).await.unwrap();
    assert_eq!(recorded.calls(), [(3, Some(API_KEY.to_owned()))]);
    stop.cancel();
}

#[tokio::test]
async fn http_over_tls_with_a_custom_ca() {
    let pki = pki();
    let stop = CancellationToken::new();
    let (endpoint, recorded) = http_receiver(&pki, None, &stop).await;

    let mut exporter = http(&endpoint, tls(&pki.ca.pem, None)).unwrap();
    assert_eq!(
        exporter.uri().to_string(),
        format!("{endpoint}/v1/traces"),
        "https kept, path appended"
    );
    export(&mut exporter).await.unwrap();
    assert_eq!(recorded.calls(), [(3, Some(API_KEY.to_owned()))]);
    assert!(!format!("{exporter:?}").contains(API_KEY));

    let mut wrong = http(&endpoint, tls(&pki.other_ca.pem, None)).unwrap();
    assert_handshake_failure(export(&mut wrong).await, "UnknownIssuer");
    assert_eq!(recorded.calls().len(), 1);
    stop.cancel();
}

#[tokio::test]
async fn http_mutual_tls() {
    let pki = pki();
    let stop = CancellationToken::new();
    let (endpoint, recorded) = http_receiver(&pki, Some(&pki.ca.pem), &stop).await;

    let mut without = http(&endpoint, tls(&pki.ca.pem, None)).unwrap();
    let error = export(&mut without).await.unwrap_err();
    assert!(recorded.calls().is_empty(), "served without a certificate");
    assert!(
        matches!(error, ExportError::TlsHandshake(_)),
        "a TLS handshake error, not {error:?}"
    );
    // A certificate from a CA the receiver does not trust: refused too.
    let stranger = leaf(
        &pki.other_ca,
        &["stranger"],
        ExtendedKeyUsagePurpose::ClientAuth,
    );
    let mut untrusted = http(&endpoint, tls(&pki.ca.pem, Some(&stranger))).unwrap();
    assert!(export(&mut untrusted).await.is_err());
    assert!(recorded.calls().is_empty());

    let mut with = http(&endpoint, tls(&pki.ca.pem, Some(&pki.client))).unwrap();
    export(&mut with).await.unwrap();
    assert_eq!(recorded.calls(), [(3, Some(API_KEY.to_owned()))]);
    stop.cancel();
}

/// Through the stage: a wrong CA drops the batch at once (no retry for the
/// whole `max_elapsed`) and counts its spans as failed.
#[tokio::test]
async fn a_wrong_ca_is_counted_as_failed_spans_without_retrying() {
    let pki = pki();
    let stop = CancellationToken::new();
    let (grpc_endpoint, _) = grpc_receiver(&pki, None, &stop).await;
    let (http_endpoint, _) = http_receiver(&pki, None, &stop).await;
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
    stop.cancel();
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
                client_key_pem: Some(pki.client.1.as_bytes().to_vec()),
                ..tls(&pki.ca.pem, None)
            },
            TlsSettings {
                client_cert_pem: Some(pki.client.0.as_bytes().to_vec()),
                client_key_pem: Some(pki.server.1.as_bytes().to_vec()),
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
