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
//! - a well-framed gRPC message that is not a valid `EventBatch` (a string
//!   that is not UTF-8, a field of the wrong wire type, a group) is refused
//!   with `INTERNAL` naming the field, before it is acknowledged; nothing
//!   accepted fails to decode later (`correlator_undecodable_events`);
//! - an event above `receiver.max_event_bytes` is refused with
//!   `RESOURCE_EXHAUSTED` naming the limit, and counted on `/metrics`;
//! - a connection flooding above `receiver.stream_events_per_sec` is read
//!   more slowly (paced, never refused: all its batches are acknowledged in
//!   the end) while another connection's turn arrives intact and at once;
//! - bad access-control settings exit 64 naming the key.
//!
//! TLS, on ingest and on export, is in `security_tls.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read as _, Write as _};
use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};
use std::process::Command;
use std::time::Duration;

use hermes_e2e::access::{
    assert_basic_turn_arrives, shim_replays_basic, start_collector, start_tcp_collector,
    tcp_collector,
};
use hermes_e2e::collector::counter as metric;
use hermes_e2e::ingest::{
    assert_paced, basic_events, batch_of, exchange, exchange_raw, send_basic_turn,
};
use hermes_e2e::{AttrsExt as _, OtlpReceiver, cargo_bin, run_with_timeout, write_file};
use hermes_proto::v1::Event;
use prost::Message as _;
use serde_json::Value as Json;

const WAIT: Duration = Duration::from_secs(30);
const TOKEN: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f0-test-token";

#[test]
fn ingest_requires_the_bearer_token() {
    let work = tempfile::tempdir().unwrap();
    let token_file = write_file(work.path(), "token", format!("{TOKEN}\n"));
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

    // Counted: the refusals are logged at the 1st, 2nd, 4th, … with the
    // count (read through a pipe: wait for the line).
    collector.wait_for_stderr(WAIT, |l| l.contains("auth_failures=2"));
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
    let (work, otlp, collector) = tcp_collector(
        "  auth:\n    token_env: SECURITY_TEST_INGEST_TOKEN",
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

    let token_file = write_file(work.path(), "shim-token", TOKEN);
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
    let (_work, otlp, collector) = tcp_collector("  max_message_bytes: 65536", &[]);
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
fn malformed_batches_are_refused_naming_the_field() {
    let (_work, otlp, collector) = tcp_collector("", &[]);
    let endpoint = collector.endpoint.clone();
    // A valid batch whose first event's hook (field 2 of the event) is
    // "pre_llm_call": the same bytes with one byte of it changed.
    let valid = batch_of("raw-1", vec![basic_events()[0].clone()]).encode_to_vec();
    let hook = valid
        .windows(basic_events()[0].hook.len())
        .position(|w| w == basic_events()[0].hook.as_bytes())
        .unwrap();
    let mut not_utf8 = valid.clone();
    not_utf8[hook] = 0xff;
    // The batch's shim (field 1) sent as a varint.
    let mut wrong_type = vec![0x08, 0x01];
    wrong_type.extend_from_slice(&valid);
    // An unknown field of the group wire type (field 9: start, end).
    let mut group = valid.clone();
    group.extend_from_slice(&[0x4b, 0x4c]);
    // 65 537 empty events (two bytes each) after it: refused before any is
    // decoded, whatever max_events_per_batch says.
    let mut many = valid.clone();
    many.extend_from_slice(&[0x12, 0x00].repeat(65_537));

    use tonic::Code::{Internal, ResourceExhausted};
    for (bytes, code, says) in [
        (not_utf8, Internal, "field 2: string is not valid UTF-8"),
        (wrong_type, Internal, "field 1: invalid wire type"),
        (group, Internal, "field 9: groups are not accepted"),
        (
            many,
            ResourceExhausted,
            "65538 events in one batch, more than 65536",
        ),
    ] {
        let status = exchange_raw(&endpoint, vec![bytes]).unwrap_err();
        assert_eq!(status.code(), code, "{status:?}");
        assert!(status.message().contains(says), "{status:?}");
    }
    // The same client's bytes, unchanged, are acknowledged.
    let seq = basic_events()[0].seq;
    assert_eq!(exchange_raw(&endpoint, vec![valid]).unwrap(), vec![seq]);

    send_basic_turn(&endpoint, "honest");
    assert_basic_turn_arrives(&otlp, &collector);
    assert_eq!(
        metric(
            &collector,
            "hermes_collector_correlator_undecodable_events_total"
        ),
        Some(0)
    );
}

#[test]
fn an_event_above_max_event_bytes_is_refused_and_counted() {
    let (_work, otlp, collector) = tcp_collector("  max_event_bytes: 4096", &[]);
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
    // 200 events/s after a burst of 200 per stream.
    let (_work, otlp, collector) = tcp_collector(
        "  stream_events_per_sec: 200\n  stream_burst_events: 200",
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

    // 1 600 events at 200/s after a burst of 200.
    let flood = flood.join().unwrap();
    assert_paced(flood, 40, 1600, Duration::from_secs(5), honest_took);
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

#[test]
fn bad_access_control_settings_exit_64_naming_the_key() {
    let work = tempfile::tempdir().unwrap();
    let empty = write_file(work.path(), "empty-token", "\n");
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
        let config = write_file(work.path(), &format!("bad-{i}.yaml"), yaml);
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
