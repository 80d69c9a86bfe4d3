//! TLS against the collector binary (certificates made by `rcgen` at test
//! time):
//! - mutual TLS on ingest: a client without a certificate, with one from
//!   another CA, or with an expired one from the right CA cannot connect;
//!   the Rust client and the shim with a valid one deliver;
//! - export over TLS: the binary exports to an in-test OTLP/gRPC receiver
//!   that requires a client certificate, with the CA, certificate and key
//!   from `exporters.otlp.tls` and headers from `headers` (`${VAR}`) and
//!   `header_files`, never logging their values; with the wrong CA it drops
//!   the batch at once, counts the spans as failed and says why; without a
//!   CA it trusts the system's roots (`SSL_CERT_FILE` pointed at the test CA).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use hermes_e2e::access::{
    BASIC_SPANS, assert_basic_turn_arrives, shim_replays_basic, start_collector,
    start_collector_with,
};
use hermes_e2e::ingest::{basic_events, batch_of, exchange};
use hermes_e2e::rig::WAIT;
use hermes_e2e::{OtlpReceiver, ServerTls, free_port, write_file};
use hermes_proto::v1::EventBatch;
use serde_json::Value as Json;

/// A CA, a server certificate for 127.0.0.1/localhost and a client
/// certificate it signed, plus a client certificate from another CA; PEM
/// files in `dir`.
struct Pki {
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
    stranger_cert: PathBuf,
    stranger_key: PathBuf,
    /// From the right CA, but valid only in 2020.
    expired_cert: PathBuf,
    expired_key: PathBuf,
    /// A second valid client of the same CA: another agent.
    other_cert: PathBuf,
    other_key: PathBuf,
    /// An OTLP receiver's certificate, requiring clients from the CA.
    receiver_tls: ServerTls,
}

fn make_pki(dir: &Path) -> Pki {
    use hermes_e2e::pki::Ca;
    let ca = Ca::new("hermes test CA");
    let server = ca.server(&["localhost", "127.0.0.1"]);
    let client = ca.client("agent-1");
    let expired = ca.expired_client("agent-2");
    let other = ca.client("agent-3");
    let stranger = Ca::new("another CA").client("stranger");
    let write = |name: &str, text: &str| write_file(dir, name, text);
    Pki {
        ca: write("ca.crt", &ca.pem),
        server_cert: write("server.crt", &server.cert_pem),
        server_key: write("server.key", &server.key_pem),
        client_cert: write("client.crt", &client.cert_pem),
        client_key: write("client.key", &client.key_pem),
        stranger_cert: write("stranger.crt", &stranger.cert_pem),
        stranger_key: write("stranger.key", &stranger.key_pem),
        expired_cert: write("expired.crt", &expired.cert_pem),
        expired_key: write("expired.key", &expired.key_pem),
        other_cert: write("other.crt", &other.cert_pem),
        other_key: write("other.key", &other.key_pem),
        receiver_tls: ServerTls::new(&server, Some(&ca)),
    }
}

/// [`hermes_e2e::ingest::exchange_tls`] trusting the CA `ca`, with the
/// client certificate `identity` (certificate and key files) if given.
fn exchange_tls(
    endpoint: &str,
    ca: &Path,
    identity: Option<(&Path, &Path)>,
    batches: Vec<EventBatch>,
) -> Result<Vec<u64>, String> {
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};
    let mut tls =
        ClientTlsConfig::new().ca_certificate(Certificate::from_pem(std::fs::read(ca).unwrap()));
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(
            std::fs::read(cert).unwrap(),
            std::fs::read(key).unwrap(),
        ));
    }
    hermes_e2e::ingest::exchange_tls(endpoint, tls, batches)
}

#[test]
fn mutual_tls_on_ingest() {
    let work = tempfile::tempdir().unwrap();
    let pki = make_pki(work.path());
    let otlp = OtlpReceiver::start();
    let port = free_port();
    let collector = start_collector(
        work.path(),
        &format!(
            "  listen: 127.0.0.1:{port}\n  tls:\n    cert_file: {}\n    key_file: {}\n    client_ca_file: {}",
            pki.server_cert.display(),
            pki.server_key.display(),
            pki.ca.display()
        ),
        &otlp,
        &[],
    );
    assert!(
        collector.stderr_text().contains("mutual_tls=true"),
        "{}",
        collector.stderr_text()
    );
    let endpoint = format!("https://127.0.0.1:{port}");
    let events = basic_events();

    // No client certificate, one from another CA, an expired one, or no TLS
    // at all: refused.
    // No client certificate, one of another CA, an expired one: refused.
    for (client, identity) in [
        ("none", None),
        ("stranger", Some((&pki.stranger_cert, &pki.stranger_key))),
        ("expired", Some((&pki.expired_cert, &pki.expired_key))),
    ] {
        let refused = exchange_tls(
            &endpoint,
            &pki.ca,
            identity.map(|(cert, key)| (cert.as_path(), key.as_path())),
            vec![batch_of("i", events.clone())],
        );
        assert!(refused.is_err(), "{client}: {refused:?}");
    }
    let plaintext = std::panic::catch_unwind(|| {
        exchange(
            &format!("http://127.0.0.1:{port}"),
            None,
            vec![batch_of("i", events.clone())],
        )
    });
    assert!(
        !matches!(plaintext, Ok(Ok(_))),
        "a plaintext client was served"
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(otlp.store().span_count(), 0);

    let n = events.len() as u64;
    let acks = exchange_tls(
        &endpoint,
        &pki.ca,
        Some((&pki.client_cert, &pki.client_key)),
        vec![batch_of("i", events.clone())],
    )
    .unwrap();
    assert_eq!(acks, [n]);
    assert_basic_turn_arrives(&otlp, &collector);

    // Another agent's certificate cannot send under the first one's
    // instance id (it would write into its sequence and traces); it keeps
    // its own ids.
    otlp.store().clear();
    let intruder = exchange_tls(
        &endpoint,
        &pki.ca,
        Some((&pki.other_cert, &pki.other_key)),
        vec![batch_of("i", events.clone())],
    );
    let refusal = intruder.expect_err("another certificate wrote under a taken instance id");
    assert!(refusal.contains("PermissionDenied"), "{refusal}");
    assert!(
        hermes_e2e::collector::admin_get(&collector, "/metrics")
            .contains("hermes_collector_receiver_foreign_instance_refusals_total 1"),
        "{}",
        hermes_e2e::collector::admin_get(&collector, "/metrics")
    );
    let own = exchange_tls(
        &endpoint,
        &pki.ca,
        Some((&pki.other_cert, &pki.other_key)),
        vec![batch_of("other", events)],
    )
    .unwrap();
    assert_eq!(own, [n]);

    // The shim, with the CA and its client certificate.
    otlp.store().clear();
    let out = shim_replays_basic(
        &[
            ("HERMES_COLLECTOR_ENDPOINT", &endpoint),
            (
                "HERMES_COLLECTOR_TLS_CA_FILE",
                &pki.ca.display().to_string(),
            ),
            (
                "HERMES_COLLECTOR_TLS_CERT_FILE",
                &pki.client_cert.display().to_string(),
            ),
            (
                "HERMES_COLLECTOR_TLS_KEY_FILE",
                &pki.client_key.display().to_string(),
            ),
        ],
        10_000,
    );
    assert_eq!(out["flushed"], Json::Bool(true), "{out}");
    assert!(
        otlp.store().wait_for_spans(BASIC_SPANS.len(), WAIT),
        "{}",
        collector.stderr_text()
    );
    // The shim without its certificate does not get through.
    let out = shim_replays_basic(
        &[
            ("HERMES_COLLECTOR_ENDPOINT", &endpoint),
            (
                "HERMES_COLLECTOR_TLS_CA_FILE",
                &pki.ca.display().to_string(),
            ),
        ],
        1500,
    );
    assert_eq!(out["flushed"], Json::Bool(false), "{out}");
    assert_ne!(out["stats"]["last_error"], "", "{out}");
}

/// The spans `receiver` got, and its `authorization` and `x-tenant`
/// metadata as `name=value`.
fn tls_received(receiver: &OtlpReceiver) -> (usize, Vec<String>) {
    let headers = receiver
        .store()
        .exports()
        .iter()
        .flat_map(|export| {
            ["authorization", "x-tenant"]
                .into_iter()
                .filter_map(|name| {
                    let value = export.headers.get(name)?.to_str().ok()?;
                    Some(format!("{name}={value}"))
                })
        })
        .collect();
    (receiver.store().span_count(), headers)
}

#[test]
fn export_over_mutual_tls_with_headers_from_a_file_and_the_environment() {
    let work = tempfile::tempdir().unwrap();
    let pki = make_pki(work.path());
    // Requires a client certificate from the test CA.
    let receiver = OtlpReceiver::start_tls(&pki.receiver_tls);
    const SECRET: &str = "Basic c2VjcmV0LWZyb20tYS1maWxl";
    let secret_file = write_file(work.path(), "otlp-authorization", format!("{SECRET}\n"));
    let port = free_port();
    let config = |ca: &Path| {
        format!(
            "receiver:\n  listen: 127.0.0.1:{port}\nbatch:\n  timeout_ms: 50\nexporters:\n  otlp:\n    endpoint: https://127.0.0.1:{}\n    headers:\n      x-tenant: ${{SECURITY_TEST_TENANT}}\n    header_files:\n      authorization: {}\n    max_elapsed_secs: 60\n    tls:\n      ca_file: {}\n      cert_file: {}\n      key_file: {}\n",
            receiver.addr().port(),
            secret_file.display(),
            ca.display(),
            pki.client_cert.display(),
            pki.client_key.display(),
        )
    };
    let env = [("SECURITY_TEST_TENANT", "tenant-7")];

    let mut collector = start_collector_with(work.path(), &config(&pki.ca), &env);
    let log = collector.stderr_text();
    assert!(
        log.contains("tls=true") && log.contains("client_certificate=true"),
        "{log}"
    );
    let events = basic_events();
    let n = events.len() as u64;
    let endpoint = format!("http://127.0.0.1:{port}");
    assert_eq!(
        exchange(&endpoint, None, vec![batch_of("i-1", events.clone())]).unwrap(),
        [n]
    );
    assert!(
        hermes_e2e::wait_until(WAIT, Duration::from_millis(50), || tls_received(&receiver)
            .0
            >= BASIC_SPANS.len()),
        "spans did not arrive over TLS:\n{}",
        collector.stderr_text()
    );
    let headers = tls_received(&receiver).1;
    assert!(
        headers.contains(&format!("authorization={SECRET}")),
        "{headers:?}"
    );
    assert!(
        headers.contains(&"x-tenant=tenant-7".to_owned()),
        "{headers:?}"
    );
    collector.assert_clean_stop(WAIT);
    let log = collector.stderr_text();
    assert!(
        !log.contains("c2VjcmV0"),
        "a header value was logged:\n{log}"
    );
    assert!(
        !log.contains("tenant-7"),
        "a header value was logged:\n{log}"
    );

    // The wrong CA (the receiver's certificate is from another): the batch
    // is dropped at once, not retried for max_elapsed_secs, and counted.
    let other = work.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    let other_ca = make_pki(&other).ca;
    let before = tls_received(&receiver).0;
    let mut collector = start_collector_with(work.path(), &config(&other_ca), &env);
    assert_eq!(
        exchange(&endpoint, None, vec![batch_of("i-2", events)]).unwrap(),
        [n]
    );
    assert!(
        collector.wait_for_stderr(WAIT, |e| e
            .contains("TLS handshake with the backend failed")),
        "{}",
        collector.stderr_text()
    );
    collector.assert_clean_stop(Duration::from_secs(15));
    let log = collector.stderr_text();
    // (The other CA has the same name: rustls reports a bad signature.)
    assert!(
        log.contains("the backend's certificate was rejected"),
        "{log}"
    );
    assert!(log.contains("spans_failed=4"), "{log}");
    assert!(!log.contains("c2VjcmV0"), "{log}");
    assert_eq!(
        tls_received(&receiver).0,
        before,
        "nothing arrived with the wrong CA"
    );

    // No ca_file: the system's root store, here pointed at the test CA with
    // SSL_CERT_FILE (as an operator would for a corporate root).
    let system_roots = format!(
        "receiver:\n  listen: 127.0.0.1:{port}\nbatch:\n  timeout_ms: 50\nexporters:\n  otlp:\n    endpoint: https://127.0.0.1:{}\n    tls:\n      cert_file: {}\n      key_file: {}\n",
        receiver.addr().port(),
        pki.client_cert.display(),
        pki.client_key.display(),
    );
    let ca_file = pki.ca.display().to_string();
    let mut collector = start_collector_with(
        work.path(),
        &system_roots,
        &[("SSL_CERT_FILE", &ca_file), ("SSL_CERT_DIR", "")],
    );
    assert!(
        collector.stderr_text().contains("custom_ca=false"),
        "{}",
        collector.stderr_text()
    );
    assert_eq!(
        exchange(&endpoint, None, vec![batch_of("i-3", basic_events())]).unwrap(),
        [n]
    );
    assert!(
        hermes_e2e::wait_until(WAIT, Duration::from_millis(50), || tls_received(&receiver)
            .0
            >= before + BASIC_SPANS.len()),
        "spans did not arrive over TLS with the system's roots:\n{}",
        collector.stderr_text()
    );
    collector.assert_clean_stop(WAIT);
}
