//! Access control and hostile input, against the collector binary:
//! - the bearer token on ingest: a stream call without it or with a wrong one
//!   is refused with `UNAUTHENTICATED` and counted; with it, events become
//!   spans at an in-test OTLP receiver;
//! - the installed shim (the real wheel in the venv) sends the token from
//!   `HERMES_COLLECTOR_TOKEN_FILE`/`HERMES_COLLECTOR_TOKEN`: it delivers with
//!   the right one, and with a wrong one does not and says why in `stats()`;
//! - the Unix socket listener: mode 0600, the shim over `unix:` delivers, the
//!   socket is removed at shutdown;
//! - oversized messages get `RESOURCE_EXHAUSTED` and garbage bytes a closed
//!   connection, while another connection's spans arrive intact;
//! - an event above `receiver.max_event_bytes` is refused with
//!   `RESOURCE_EXHAUSTED` naming the limit, and counted on `/metrics`;
//! - a connection flooding above `receiver.stream_events_per_sec` is read
//!   more slowly (paced, never refused: all its batches are acknowledged in
//!   the end) while another connection's turn arrives intact and at once;
//! - mutual TLS on ingest (certificates made by `rcgen` at test time): a
//!   client without a certificate, with one from another CA, or with an
//!   expired one from the right CA cannot connect; the Rust client and the
//!   shim with a valid one deliver;
//! - export over TLS: the binary exports to an in-test OTLP/gRPC receiver
//!   that requires a client certificate, with the CA, certificate and key
//!   from `exporters.otlp.tls` and headers from `headers` (`${VAR}`) and
//!   `header_files`, never logging their values; with the wrong CA it drops
//!   the batch at once, counts the spans as failed and says why; without a
//!   CA it trusts the system's roots (`SSL_CERT_FILE` pointed at the test CA);
//! - bad access-control settings exit 64 naming the key.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read as _, Write as _};
use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use hermes_e2e::collector::Collector;
use hermes_e2e::collector::counter as metric;
use hermes_e2e::ingest::{basic_events, batch_of, exchange, fixture, send_basic_turn};
use hermes_e2e::{
    AttrsExt as _, ChildGuard, OtlpReceiver, ServerTls, cargo_bin, ensure_venv, free_port,
    run_with_timeout, venv_bin,
};
use hermes_proto::v1::{Event, EventBatch};
use serde_json::Value as Json;

const WAIT: Duration = Duration::from_secs(30);
const TOKEN: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f0-test-token";

/// The span names the basic fixture (one turn, two chats, one tool call)
/// gives, sorted.
const BASIC_SPANS: [&str; 4] = [
    "chat fake-model-1",
    "chat fake-model-1",
    "execute_tool terminal",
    "invoke_agent hermes",
];

/// A collector binary with `receiver` as its receiver section, exporting to
/// `otlp`; started and listening when this returns.
fn start_collector(
    work: &Path,
    receiver: &str,
    otlp: &OtlpReceiver,
    env: &[(&str, &str)],
) -> Collector {
    start_collector_with(
        work,
        &format!(
            "receiver:\n{receiver}\nexporters:\n  otlp:\n    endpoint: {}\nbatch:\n  timeout_ms: 50\n",
            otlp.endpoint()
        ),
        env,
    )
}

/// [`start_collector`] receiving on a free port of 127.0.0.1, `receiver`
/// holding the other lines of its receiver section.
fn start_tcp_collector(
    work: &Path,
    receiver: &str,
    otlp: &OtlpReceiver,
    env: &[(&str, &str)],
) -> Collector {
    let listen = format!("  listen: 127.0.0.1:{}\n{receiver}", free_port());
    start_collector(work, &listen, otlp, env)
}

/// A collector binary with the configuration `yaml`; started and ready
/// when this returns.
fn start_collector_with(work: &Path, yaml: &str, env: &[(&str, &str)]) -> Collector {
    let config = work.join("collector.yaml");
    std::fs::write(&config, yaml).unwrap();
    let mut cmd = Collector::command();
    cmd.arg("--config")
        .arg(&config)
        .args(["--admin-listen", "127.0.0.1:0"])
        .envs(env.iter().copied());
    Collector::launch(cmd)
}

/// Waits for the basic fixture's four spans and checks they form one whole
/// turn.
fn assert_basic_turn_arrives(otlp: &OtlpReceiver, collector: &ChildGuard) {
    assert!(
        otlp.store().wait_for_spans(BASIC_SPANS.len(), WAIT),
        "spans did not arrive:\n{}",
        collector.stderr_text()
    );
    // Nothing more trickles in.
    std::thread::sleep(Duration::from_millis(300));
    let mut names: Vec<String> = otlp.spans().into_iter().map(|(_, s)| s.name).collect();
    names.sort();
    assert_eq!(names, BASIC_SPANS, "{}", collector.stderr_text());
    let tree = otlp.store().tree();
    assert!(tree.orphans().is_empty(), "every span has its parent");
    assert!(tree.duplicates().is_empty());
}

/// Runs a Python snippet in the venv with the shim installed and registered
/// (`hooks` maps names to the shim's callbacks), replaying the basic fixture
/// through the hooks; prints `flush(flush_ms)` and `stats()` as JSON.
fn shim_replays_basic(env: &[(&str, &str)], flush_ms: u64) -> Json {
    ensure_venv();
    let code = format!(
        r#"
import json
import hermes_collector
hooks = {{}}
class Ctx:
    def register_hook(self, name, callback):
        hooks[name] = callback
hermes_collector.register(Ctx())
for line in open({fixture:?}):
    if not line.strip():
        continue
    r = json.loads(line)
    if r["hook"] in hooks:
        hooks[r["hook"]](**r["kwargs"])
flushed = hermes_collector.flush({flush_ms})
print(json.dumps({{"flushed": flushed, "stats": hermes_collector.stats()}}))
"#,
        fixture = fixture("basic").display().to_string(),
    );
    let mut cmd = Command::new(venv_bin("python"));
    cmd.arg("-c")
        .arg(code)
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("HERMES_COLLECTOR_TOKEN")
        .env_remove("HERMES_COLLECTOR_TOKEN_FILE")
        .env("HERMES_COLLECTOR_EXIT_FLUSH_MS", "0");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = run_with_timeout(&mut cmd, Duration::from_secs(90));
    assert!(out.success(), "python failed:\n{}", out.describe());
    let line = out
        .stdout()
        .lines()
        .last()
        .map(str::to_owned)
        .unwrap_or_default();
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {}", out.describe()))
}

#[test]
fn ingest_requires_the_bearer_token() {
    let work = tempfile::tempdir().unwrap();
    let token_file = work.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let otlp = OtlpReceiver::start();
    let mut collector = start_tcp_collector(
        work.path(),
        &format!("  auth:\n    token_file: {}", token_file.display()),
        &otlp,
        &[],
    );
    let endpoint = collector.endpoint.clone();
    let events = basic_events();

    let missing = exchange(&endpoint, None, vec![batch_of("i-1", events.clone())]).unwrap_err();
    assert_eq!(missing.code(), tonic::Code::Unauthenticated, "{missing:?}");
    assert_eq!(missing.message(), "missing bearer token");
    let other_scheme = exchange(
        &endpoint,
        Some(&format!("Basic {TOKEN}")),
        vec![batch_of("i-1", events.clone())],
    )
    .unwrap_err();
    assert_eq!(other_scheme.message(), "missing bearer token");
    let wrong = exchange(
        &endpoint,
        Some("Bearer 0f1e2d3c4b5a69788796a5b4c3d2e1f0-test-tokem"),
        vec![batch_of("i-1", events.clone())],
    )
    .unwrap_err();
    assert_eq!(wrong.code(), tonic::Code::Unauthenticated, "{wrong:?}");
    assert_eq!(wrong.message(), "invalid bearer token");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(otlp.store().span_count(), 0, "nothing refused was exported");

    let n = events.len() as u64;
    let acks = exchange(
        &endpoint,
        Some(&format!("Bearer {TOKEN}")),
        vec![batch_of("i-1", events)],
    )
    .unwrap();
    assert_eq!(acks, [n]);
    assert_basic_turn_arrives(&otlp, &collector);

    // Counted: the refusals are logged at the 1st, 2nd, 4th, … with the count.
    let log = collector.stderr_text();
    assert!(log.contains("auth_failures=2"), "{log}");
    assert!(!log.contains("auth_failures=3"), "{log}");
    assert!(log.contains("authenticated=true"), "{log}");
    collector.assert_clean_stop(WAIT);
    assert!(
        !collector.stderr_text().contains(TOKEN),
        "the token is never logged"
    );
}

#[test]
fn shim_with_the_right_token_delivers_and_with_a_wrong_one_does_not() {
    let work = tempfile::tempdir().unwrap();
    let otlp = OtlpReceiver::start();
    let collector = start_tcp_collector(
        work.path(),
        "  auth:\n    token_env: SECURITY_TEST_INGEST_TOKEN",
        &otlp,
        &[("SECURITY_TEST_INGEST_TOKEN", TOKEN)],
    );
    let endpoint = collector.endpoint.clone();

    let wrong = shim_replays_basic(
        &[
            ("HERMES_COLLECTOR_ENDPOINT", &endpoint),
            ("HERMES_COLLECTOR_TOKEN", "not-the-token"),
        ],
        1500,
    );
    assert_eq!(wrong["flushed"], Json::Bool(false), "{wrong}");
    assert_eq!(wrong["stats"]["acked_events"], 0, "{wrong}");
    let error = wrong["stats"]["last_error"].as_str().unwrap_or_default();
    assert!(
        error.to_ascii_lowercase().contains("unauthenticated"),
        "{wrong}"
    );
    assert!(!error.contains("not-the-token"), "{wrong}");
    // Backoff, not a tight loop: a handful of attempts in 1.5 s.
    let log = collector.stderr_text();
    assert!(
        !log.contains("auth_failures=32"),
        "retried in a tight loop:\n{log}"
    );
    assert_eq!(otlp.store().span_count(), 0);

    let token_file = work.path().join("shim-token");
    std::fs::write(&token_file, TOKEN).unwrap();
    let right = shim_replays_basic(
        &[
            ("HERMES_COLLECTOR_ENDPOINT", &endpoint),
            (
                "HERMES_COLLECTOR_TOKEN_FILE",
                &token_file.display().to_string(),
            ),
        ],
        10_000,
    );
    assert_eq!(right["flushed"], Json::Bool(true), "{right}");
    assert_basic_turn_arrives(&otlp, &collector);
}

#[test]
fn unix_socket_is_private_and_carries_the_shim() {
    let work = tempfile::tempdir().unwrap();
    let socket = work.path().join("ingest.sock");
    // A stale socket file from a previous run is replaced.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let otlp = OtlpReceiver::start();
    let mut collector = start_collector(
        work.path(),
        &format!(
            "  listen: unix:{}\n  auth:\n    token_env: SECURITY_TEST_INGEST_TOKEN",
            socket.display()
        ),
        &otlp,
        &[("SECURITY_TEST_INGEST_TOKEN", TOKEN)],
    );
    let metadata = std::fs::symlink_metadata(&socket).unwrap();
    assert!(metadata.file_type().is_socket());
    assert_eq!(
        metadata.permissions().mode() & 0o777,
        0o600,
        "{:o}",
        metadata.permissions().mode()
    );

    let endpoint = format!("unix:{}", socket.display());
    let refused = exchange(&endpoint, None, vec![batch_of("i-1", basic_events())]).unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);

    let out = shim_replays_basic(
        &[
            ("HERMES_COLLECTOR_ENDPOINT", &endpoint),
            ("HERMES_COLLECTOR_TOKEN", TOKEN),
        ],
        10_000,
    );
    assert_eq!(out["flushed"], Json::Bool(true), "{out}");
    assert_basic_turn_arrives(&otlp, &collector);

    collector.assert_clean_stop(WAIT);
    assert!(!socket.exists(), "the socket is removed at shutdown");
}

#[test]
fn floods_of_oversized_messages_and_garbage_do_not_disturb_other_streams() {
    let work = tempfile::tempdir().unwrap();
    let otlp = OtlpReceiver::start();
    let collector = start_tcp_collector(work.path(), "  max_message_bytes: 65536", &otlp, &[]);
    let endpoint = collector.endpoint.clone();
    let addr = endpoint.trim_start_matches("http://").to_owned();

    // Two hostile connections, each a bounded burst, during the honest one.
    let flood_endpoint = endpoint.clone();
    let oversized = std::thread::spawn(move || {
        let mut codes = Vec::new();
        for i in 0..20u64 {
            let huge = Event {
                seq: 1,
                hook: "x".repeat(256 * 1024),
                ..Default::default()
            };
            let result = exchange(
                &flood_endpoint,
                None,
                vec![batch_of(&format!("flood-{i}"), vec![huge])],
            );
            codes.push(result.map_err(|s| s.code()));
        }
        codes
    });
    let garbage = std::thread::spawn(move || {
        let mut closed = 0;
        for i in 0..20u8 {
            let mut stream = std::net::TcpStream::connect(&addr).unwrap();
            stream
                .set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            let junk: Vec<u8> = (0..64 * 1024u32)
                .map(|n| (n as u8).wrapping_mul(31).wrapping_add(i))
                .collect();
            let _ = stream.write_all(&junk);
            let mut buf = [0u8; 4096];
            // The server answers with at most an HTTP/2 GOAWAY, then closes.
            loop {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
            closed += 1;
        }
        closed
    });

    send_basic_turn(&endpoint, "honest");

    let codes = oversized.join().unwrap();
    assert!(
        codes
            .iter()
            .all(|c| *c == Err(tonic::Code::ResourceExhausted)),
        "{codes:?}"
    );
    assert_eq!(garbage.join().unwrap(), 20);
    assert_basic_turn_arrives(&otlp, &collector);

    // Refusals are counted, and logged only at the 1st, 2nd, 4th, 8th, 16th.
    let log = collector.stderr_text();
    let refusal_lines = log
        .lines()
        .filter(|l| l.contains("refused an event batch"))
        .count();
    assert_eq!(refusal_lines, 5, "{log}");
    assert!(log.contains("batches_refused=16"), "{log}");
    // The honest spans are whole: their attributes survived.
    let spans = otlp.spans();
    let root = spans
        .iter()
        .find(|(_, s)| s.name == "invoke_agent hermes")
        .unwrap();
    assert_eq!(root.1.str_attr("hermes.platform"), Some("cli"));
    assert_eq!(root.1.int_attr("hermes.turn.tool_calls"), Some(1));
    assert_eq!(root.1.int_attr("hermes.turn.api_attempts"), Some(2));
}

#[test]
fn an_event_above_max_event_bytes_is_refused_and_counted() {
    let work = tempfile::tempdir().unwrap();
    let otlp = OtlpReceiver::start();
    let collector = start_tcp_collector(work.path(), "  max_event_bytes: 4096", &otlp, &[]);
    let endpoint = collector.endpoint.clone();

    // 10 KiB in one event: far below max_message_bytes, above the event limit.
    let big = Event {
        seq: 1,
        hook: "pre_tool_call".into(),
        thread: "x".repeat(10 * 1024),
        ..Default::default()
    };
    let refused = exchange(&endpoint, None, vec![batch_of("big", vec![big])]).unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    assert!(
        refused.message().contains("max_event_bytes") && refused.message().contains("4096"),
        "{refused:?}"
    );

    send_basic_turn(&endpoint, "honest");
    assert_basic_turn_arrives(&otlp, &collector);
    assert_eq!(
        metric(
            &collector,
            "hermes_collector_receiver_oversized_events_total"
        ),
        Some(1)
    );
    assert_eq!(
        metric(
            &collector,
            "hermes_collector_receiver_refused_batches_total"
        ),
        Some(1)
    );
}

#[test]
fn a_flooding_connection_is_paced_while_another_ones_turn_arrives() {
    let work = tempfile::tempdir().unwrap();
    let otlp = OtlpReceiver::start();
    // 200 events/s after a burst of 200 per stream.
    let collector = start_tcp_collector(
        work.path(),
        "  stream_events_per_sec: 200\n  stream_burst_events: 200",
        &otlp,
        &[],
    );
    let endpoint = collector.endpoint.clone();

    // The flood: 1 600 events in batches of 40, from one connection; at the
    // limit that takes about 7 s.
    let flood_endpoint = endpoint.clone();
    let flood = std::thread::spawn(move || {
        let started = std::time::Instant::now();
        let batches = (0..40u64)
            .map(|b| {
                let events = (1..=40u64)
                    .map(|i| Event {
                        seq: b * 40 + i,
                        hook: "flood".into(),
                        time_unix_nano: 1,
                        ..Default::default()
                    })
                    .collect();
                batch_of("flood", events)
            })
            .collect();
        let acks = exchange(&flood_endpoint, None, batches);
        (acks, started.elapsed())
    });
    std::thread::sleep(Duration::from_millis(500));

    // Meanwhile, an agent on another connection: its turn arrives at once
    // and whole.
    let started = std::time::Instant::now();
    send_basic_turn(&endpoint, "honest");
    assert_basic_turn_arrives(&otlp, &collector);
    let honest_took = started.elapsed();
    assert!(!flood.is_finished(), "the flood was not paced");

    let (flood_acks, flood_took) = flood.join().unwrap();
    let flood_acks = flood_acks.expect("paced, never refused");
    assert_eq!(flood_acks.len(), 40);
    assert_eq!(flood_acks.last(), Some(&1600));
    assert!(
        flood_took >= Duration::from_secs(5),
        "1 600 events at 200/s after a burst of 200: {flood_took:?}"
    );
    assert!(
        honest_took < flood_took / 2,
        "{honest_took:?} vs {flood_took:?}"
    );
    let throttled = metric(
        &collector,
        "hermes_collector_receiver_throttled_batches_total",
    );
    assert!(throttled.is_some_and(|t| t >= 30), "{throttled:?}");
    assert_eq!(
        metric(
            &collector,
            "hermes_collector_receiver_refused_batches_total"
        ),
        Some(0)
    );
    let log = collector.stderr_text();
    assert!(log.contains("over its rate limit"), "{log}");
}

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
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
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

#[test]
fn bad_access_control_settings_exit_64_naming_the_key() {
    let work = tempfile::tempdir().unwrap();
    let empty = work.path().join("empty-token");
    std::fs::write(&empty, "\n").unwrap();
    let cases = [
        (
            format!(
                "receiver:\n  auth:\n    token_file: {}\n",
                work.path().join("missing").display()
            ),
            "receiver.auth.token_file",
        ),
        (
            format!("receiver:\n  auth:\n    token_file: {}\n", empty.display()),
            "receiver.auth.token_file",
        ),
        (
            format!(
                "receiver:\n  auth:\n    token_file: {}\n    token_env: X\n",
                empty.display()
            ),
            "receiver.auth",
        ),
        (
            "receiver:\n  auth:\n    token_env: SECURITY_TEST_UNSET_VARIABLE\n".to_owned(),
            "receiver.auth.token_env",
        ),
        (
            format!(
                "receiver:\n  listen: unix:{}/no/such/dir/ingest.sock\n",
                work.path().display()
            ),
            "receiver.listen",
        ),
        (
            format!(
                "receiver:\n  tls:\n    cert_file: {}\n    key_file: {}\n",
                work.path().join("missing.crt").display(),
                empty.display()
            ),
            "receiver.tls.cert_file",
        ),
        (
            format!(
                "exporters:\n  otlp:\n    endpoint: http://127.0.0.1:4317\n    tls:\n      ca_file: {}\n",
                empty.display()
            ),
            "exporters.otlp.tls",
        ),
        (
            format!(
                "exporters:\n  otlp:\n    endpoint: https://127.0.0.1:4317\n    tls:\n      ca_file: {}\n",
                work.path().join("missing-ca.crt").display()
            ),
            "exporters.otlp.tls.ca_file",
        ),
        (
            format!(
                "exporters:\n  otlp:\n    endpoint: https://127.0.0.1:4317\n    header_files:\n      authorization: {}\n",
                empty.display()
            ),
            "exporters.otlp.header_files.authorization",
        ),
    ];
    for (i, (yaml, key)) in cases.iter().enumerate() {
        let config = work.path().join(format!("bad-{i}.yaml"));
        std::fs::write(&config, yaml).unwrap();
        let out = run_with_timeout(
            Command::new(cargo_bin("hermes-collector", "hermes-collector"))
                .arg("--config")
                .arg(&config)
                .args(["--admin-listen", "127.0.0.1:0"])
                .env_remove("SECURITY_TEST_UNSET_VARIABLE"),
            WAIT,
        );
        out.assert_refused_naming(yaml, &format!("`{key}`"));
    }
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
    let secret_file = work.path().join("otlp-authorization");
    std::fs::write(&secret_file, format!("{SECRET}\n")).unwrap();
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
