//! `validate` returns what it read (secrets, TLS material) once, and the
//! sections convert into the stages' settings.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::metadata::MetadataMap;

use crate::*;

/// A self-signed certificate and its key, as PEM files in `dir`.
fn cert_files(dir: &Path) -> (PathBuf, PathBuf, String) {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    let key_pem = certified.signing_key.serialize_pem();
    std::fs::write(&cert, certified.cert.pem()).unwrap();
    std::fs::write(&key, &key_pem).unwrap();
    (cert, key, key_pem)
}

/// Whether `token` accepts `Authorization: Bearer <value>`.
fn accepts(token: &hermes_receiver::BearerToken, value: &str) -> bool {
    let mut metadata = MetadataMap::new();
    metadata.insert("authorization", format!("Bearer {value}").parse().unwrap());
    token.check(&metadata).is_ok()
}

/// An environment that counts its lookups.
#[derive(Default)]
struct CountingEnv {
    values: HashMap<&'static str, &'static str>,
    lookups: RefCell<HashMap<String, usize>>,
}

impl CountingEnv {
    fn get(&self, name: &str) -> Option<String> {
        *self
            .lookups
            .borrow_mut()
            .entry(name.to_owned())
            .or_default() += 1;
        self.values.get(name).map(|v| (*v).to_owned())
    }

    fn lookups(&self, name: &str) -> usize {
        self.lookups.borrow().get(name).copied().unwrap_or(0)
    }
}

/// A configuration with every kind of secret: an ingest token from the
/// environment, a metrics token from a file, TLS on the ingest, an OTLP
/// exporter over https with a CA, a header file and a header, and an OTLP
/// metrics exporter with a header.
fn secret_config(dir: &Path) -> (String, String) {
    let (cert, key, key_pem) = cert_files(dir);
    let metrics_token = dir.join("metrics-token");
    std::fs::write(&metrics_token, "scr4pe-s3cret\n").unwrap();
    let header_file = dir.join("authorization");
    std::fs::write(&header_file, "Basic hdr-file-s3cret\n").unwrap();
    let yaml = format!(
        "receiver:
  auth:
    token_env: INGEST_TOKEN
  tls:
    cert_file: {cert}
    key_file: {key}
admin:
  metrics_auth:
    token_file: {metrics_token}
exporters:
  otlp:
    endpoint: https://localhost:4317
    headers:
      x-api-key: hdr-inline-s3cret
    header_files:
      authorization: {header_file}
    tls:
      ca_file: {cert}
  otlp_metrics:
    endpoint: http://127.0.0.1:4318
    headers:
      x-api-key: metrics-hdr-s3cret
",
        cert = cert.display(),
        key = key.display(),
        metrics_token = metrics_token.display(),
        header_file = header_file.display(),
    );
    (yaml, key_pem)
}

fn secret_env() -> CountingEnv {
    CountingEnv {
        values: HashMap::from([("INGEST_TOKEN", "ingest-s3cret")]),
        ..Default::default()
    }
}

#[test]
fn every_secret_is_read_once_and_kept_after_its_file_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let (yaml, _) = secret_config(dir.path());
    let env = secret_env();
    let config = Config::parse_text(&yaml, &|name| env.get(name)).unwrap();
    let validated = config.validate_with(&|name| env.get(name)).unwrap();
    assert_eq!(env.lookups("INGEST_TOKEN"), 1);

    // Every file validation read can go: the stages need none of them.
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        std::fs::remove_file(entry.unwrap().path()).unwrap();
    }
    let ingest = validated.ingest_token.as_ref().unwrap();
    assert!(accepts(ingest, "ingest-s3cret"));
    assert!(!accepts(ingest, "scr4pe-s3cret"));
    assert!(accepts(
        validated.metrics_token.as_ref().unwrap(),
        "scr4pe-s3cret"
    ));
    assert!(!validated.receiver_tls.as_ref().unwrap().mutual);
    let otlp = validated.otlp.as_ref().unwrap();
    assert!(otlp.tls.as_ref().unwrap().ca_pem.is_some());
    let grpc = otlp.grpc();
    assert!(
        grpc.headers
            .contains(&("authorization".into(), "Basic hdr-file-s3cret".into()))
    );
    assert!(
        grpc.headers
            .contains(&("x-api-key".into(), "hdr-inline-s3cret".into()))
    );
    assert_eq!(otlp.http().headers, grpc.headers);
    let metrics = validated.otlp_metrics.as_ref().unwrap();
    assert!(metrics.tls.is_none());
    assert_eq!(metrics.config.endpoint, "http://127.0.0.1:4318");

    // Validating again would read them again: it fails naming the key.
    let e = config.validate_with(&|name| env.get(name)).unwrap_err();
    assert_eq!(e.path, "receiver.tls.cert_file", "{e}");
}

#[test]
fn the_validated_debug_output_shows_no_secret() {
    let dir = tempfile::tempdir().unwrap();
    let (yaml, key_pem) = secret_config(dir.path());
    let env = secret_env();
    let validated = Config::parse_text(&yaml, &|name| env.get(name))
        .unwrap()
        .validate_with(&|name| env.get(name))
        .unwrap();
    let debug = format!("{validated:?}");
    for secret in [
        "ingest-s3cret",
        "scr4pe-s3cret",
        "hdr-file-s3cret",
        "hdr-inline-s3cret",
        "metrics-hdr-s3cret",
    ] {
        assert!(!debug.contains(secret), "{secret} in {debug}");
    }
    let key_body: String = key_pem
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect();
    assert!(!debug.contains(&key_body[..32]), "{debug}");
    // What is there is said without its value.
    assert!(debug.contains("x-api-key"), "{debug}");
    assert!(debug.contains("BearerToken(<redacted>)"), "{debug}");
}

#[test]
fn bad_material_is_refused_naming_its_key() {
    let pems = super::bad_pems();
    let not_pem = &pems.not_pem;
    let cases = [
        (
            format!(
                "exporters:\n  otlp_metrics:\n    endpoint: https://localhost:4318\n    tls:\n      ca_file: {}\n",
                not_pem.display()
            ),
            "exporters.otlp_metrics.tls.ca_file",
        ),
        (
            format!(
                "exporters:\n  otlp:\n    endpoint: https://localhost:4317\n    tls:\n      ca_file: {}\n",
                not_pem.display()
            ),
            "exporters.otlp.tls.ca_file",
        ),
        (
            "admin:\n  metrics_auth:\n    token_env: UNSET_TOKEN\n".to_owned(),
            "admin.metrics_auth.token_env",
        ),
        (
            "exporters:\n  otlp:\n    endpoint: http://localhost:4317\n    compression: gzip\n    compression_level: 0\n".to_owned(),
            "exporters.otlp.compression_level",
        ),
        (
            "exporters:\n  otlp:\n    endpoint: http://localhost:4317\n    compression_level: 10\n".to_owned(),
            "exporters.otlp.compression_level",
        ),
    ];
    for (yaml, key) in cases {
        let config = Config::parse_text(&yaml, &|_| None).unwrap();
        let e = config.validate_with(&|_| None).unwrap_err();
        assert_eq!(e.path, key, "{yaml} -> {e}");
    }
    // The binary exits with this code on any `ConfigError`.
    assert_eq!(EXIT_CONFIG, 64);
}

#[test]
fn validate_reads_the_process_environment_and_conceals_interpolated_values() {
    let config = Config::parse_text("receiver:\n  listen: ${LISTEN}\n", &|name| {
        (name == "LISTEN").then(|| "not-an-address".to_owned())
    })
    .unwrap();
    let e = config.validate().unwrap_err();
    assert_eq!(e.path, "receiver.listen");
    assert!(!e.to_string().contains("not-an-address"), "{e}");
    assert!(e.to_string().contains("${LISTEN}"), "{e}");
}

#[test]
fn listen_addresses_are_parsed() {
    let validated = Config::parse_text(
        "receiver:\n  listen: 127.0.0.1:4400\nadmin:\n  listen: 127.0.0.1:4401\n",
        &|_| None,
    )
    .unwrap()
    .validate_with(&|_| None)
    .unwrap();
    assert_eq!(
        validated.listen,
        hermes_receiver::ListenAddr::Tcp("127.0.0.1:4400".parse().unwrap())
    );
    assert_eq!(validated.admin_listen, "127.0.0.1:4401".parse().unwrap());
    assert!(validated.ingest_token.is_none() && validated.receiver_tls.is_none());
    assert!(validated.otlp.is_none() && validated.otlp_metrics.is_none());
}

/// Every key below differs from its default.
const TUNED: &str = "
receiver:
  max_message_bytes: 1234567
  max_events_per_batch: 77
  max_event_bytes: 9999
  stream_events_per_sec: 11
  stream_burst_events: 22
  max_streams_per_connection: 3
  max_connections: 44
  handshake_timeout_ms: 1500
  idle_timeout_secs: 7
  memory_limit_mib: 2
correlator:
  max_open_turns: 101
  max_open_turns_per_agent: 102
  max_sessions_per_agent: 103
  max_sessions: 104
  max_bytes_per_agent: 105
  max_bytes: 106
  state_ttl_secs: 107
  turn_end_grace_ms: 108
  tick_ms: 109
  gap_timeout_ms: 110
batch:
  max_spans: 201
  max_bytes: 202
  timeout_ms: 203
queue:
  kind: disk
  dir: /tmp/hermes-config-test-queue
  max_bytes: 301
  fsync_interval_ms: 302
shutdown:
  grace_ms: 401
exporters:
  otlp:
    endpoint: http://127.0.0.1:4317
    protocol: http/protobuf
    timeout_ms: 501
    compression: gzip
    compression_level: 3
    max_elapsed_secs: 502
";

fn tuned() -> Validated {
    Config::parse_text(TUNED, &|_| None)
        .unwrap()
        .validate_with(&|_| None)
        .unwrap()
}

#[test]
fn the_receiver_limits_take_every_receiver_key() {
    let validated = tuned();
    let limits = validated.config.receiver.limits();
    assert_eq!(limits.max_message_bytes, 1_234_567);
    assert_eq!(limits.max_events_per_batch, 77);
    assert_eq!(limits.max_event_bytes, 9_999);
    assert_eq!(limits.stream_events_per_sec, 11);
    assert_eq!(limits.stream_burst_events, 22);
    assert_eq!(limits.max_streams_per_connection, 3);
    assert_eq!(limits.connections.max_connections, 44);
    assert_eq!(
        limits.connections.handshake_timeout,
        Duration::from_millis(1_500)
    );
    assert_eq!(limits.connections.idle_timeout, Duration::from_secs(7));
    assert_eq!(
        validated.config.receiver.memory_limit_bytes(),
        Some(2 << 20)
    );
    let unlimited = ReceiverConfig {
        memory_limit_mib: 0,
        ..ReceiverConfig::default()
    };
    assert_eq!(unlimited.memory_limit_bytes(), None);
    // The defaults stay the receiver's where no key sets them.
    let defaults = ReceiverConfig::default().limits();
    let receiver = hermes_receiver::Limits::default();
    assert_eq!(defaults.keepalive_interval, receiver.keepalive_interval);
    assert_eq!(defaults.max_message_bytes, receiver.max_message_bytes);
}

#[test]
fn the_correlator_and_sequencer_take_every_correlator_key() {
    let validated = tuned();
    let section = &validated.config.correlator;
    let c = section.correlator();
    assert_eq!(
        (
            c.max_open_turns,
            c.max_open_turns_per_agent,
            c.max_sessions_per_agent,
            c.max_sessions,
            c.max_bytes_per_agent,
            c.max_bytes
        ),
        (101, 102, 103, 104, 105, 106)
    );
    assert_eq!(c.state_ttl_nanos, 107 * 1_000_000_000);
    assert_eq!(c.turn_end_grace_nanos, 108 * 1_000_000);
    assert_eq!(section.tick(), Duration::from_millis(109));
    assert_eq!(section.sequencer().gap_timeout_nanos, 110 * 1_000_000);
}

#[test]
fn the_exporter_settings_take_batch_retry_and_grace() {
    let validated = tuned();
    let settings = validated.config.exporter_settings();
    assert_eq!(settings.max_batch_spans, 201);
    assert_eq!(settings.max_batch_bytes, 202);
    assert_eq!(settings.batch_timeout, Duration::from_millis(203));
    assert_eq!(settings.retry.max_elapsed, Duration::from_secs(502));
    assert_eq!(settings.drain_timeout, Duration::from_millis(401));
    let otlp = validated.otlp.as_ref().unwrap();
    assert_eq!(otlp.protocol, OtlpProtocol::HttpProtobuf);
    assert_eq!(otlp.timeout, Duration::from_millis(501));
    assert_eq!(otlp.compression, hermes_exporter::Compression::Gzip);
    assert_eq!(otlp.grpc().compression, hermes_exporter::Compression::Gzip);
    assert_eq!(otlp.grpc().gzip_level, 3);
    assert_eq!(otlp.grpc().connect_timeout, Duration::from_millis(501));
    assert_eq!(otlp.http().timeout, Duration::from_millis(501));
    assert_eq!(otlp.http().endpoint, "http://127.0.0.1:4317");
}

#[test]
fn the_queue_settings_take_every_queue_key() {
    let validated = tuned();
    let queue = &validated.config.queue;
    assert_eq!(queue.delivery(), hermes_receiver::Delivery::Durable);
    assert_eq!(
        queue.disk(),
        Some(DiskQueueSettings {
            dir: PathBuf::from("/tmp/hermes-config-test-queue"),
            max_bytes: 301,
            fsync_interval: Duration::from_millis(302),
        })
    );
    let memory = QueueConfig::default();
    assert_eq!(memory.delivery(), hermes_receiver::Delivery::Memory);
    assert_eq!(memory.disk(), None);
}
