//! Clients that hold connections instead of using them, and signals, against
//! the collector binary:
//! - one connection that never speaks neither delays the drain nor loses
//!   the open turn: SIGTERM closes the turn as incomplete, exports it, and
//!   exits at once with code 0;
//! - many silent connections: past `receiver.max_connections` they are
//!   closed at once, the rest after `receiver.handshake_timeout_ms`; the
//!   admin server answers throughout and a real client delivers afterwards;
//! - SIGHUP is logged and ignored, never the end of the process;
//! - spans the drain cannot export within the grace (a backend that keeps
//!   failing) are counted in `spans_failed`, said in the log, and the exit
//!   code is 75.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read as _;
use std::net::TcpStream;
use std::os::unix::process::ExitStatusExt as _;
use std::path::Path;
use std::time::Duration;

use hermes_e2e::access::exporting;
use hermes_e2e::collector::Collector;
use hermes_e2e::ingest::{basic_events, batch_of, exchange, send_basic_turn};
use hermes_e2e::otlp_receiver::Rejection;
use hermes_e2e::{OtlpReceiver, free_port, wait_until};
use tempfile::TempDir;

/// A collector exporting to a receiver of its own ([`exporting`]), with
/// `extra` YAML sections appended.
fn start(receiver: &str, extra: &str) -> (TempDir, OtlpReceiver, Collector) {
    exporting(|work, otlp| start_in(work, otlp, receiver, extra))
}

/// A collector in `work` exporting to `otlp` with `extra` YAML sections
/// appended.
fn start_in(work: &Path, otlp: &OtlpReceiver, receiver: &str, extra: &str) -> Collector {
    let listen = format!("127.0.0.1:{}", free_port());
    Collector::start_with_config(
        work,
        &listen,
        &format!(
            "receiver:\n  listen: {listen}\n{receiver}admin:\n  listen: 127.0.0.1:0\nexporters:\n  otlp:\n    endpoint: {}\nbatch:\n  timeout_ms: 50\n{extra}",
            otlp.endpoint()
        ),
    )
}

fn addr(collector: &Collector) -> String {
    collector.endpoint.trim_start_matches("http://").to_owned()
}

#[test]
fn a_silent_connection_neither_delays_the_drain_nor_loses_the_open_turn() {
    let (_work, otlp, mut collector) = start("", "shutdown:\n  grace_ms: 15000\n");
    // A turn left open: everything up to the tool call, no turn end.
    let events: Vec<_> = basic_events().into_iter().take(7).collect();
    let n = events.len() as u64;
    assert_eq!(
        exchange(&collector.endpoint, None, vec![batch_of("a", events)]).unwrap(),
        [n]
    );
    let _silent = TcpStream::connect(addr(&collector)).unwrap();
    std::thread::sleep(Duration::from_millis(200));

    let (status, took) = collector.sigterm(Duration::from_secs(30));
    let status = status.expect("the collector did not stop");
    let log = collector.guard.stderr_text();
    assert_eq!(status.code(), Some(0), "{log}");
    // The connection lingers half a second at most; the grace is 15 s.
    assert!(
        took < Duration::from_secs(5),
        "the drain took {took:?}\n{log}"
    );
    assert!(
        otlp.store()
            .wait_for_span_named("invoke_agent hermes", Duration::from_secs(5)),
        "the open turn's root span was lost:\n{log}"
    );
}

#[test]
fn silent_connections_are_closed_and_cannot_exhaust_the_collector() {
    let (_work, otlp, collector) =
        start("  max_connections: 40\n  handshake_timeout_ms: 1000\n", "");
    let target = addr(&collector);
    let silent: Vec<TcpStream> = (0..300)
        .map(|_| TcpStream::connect(&target).unwrap())
        .collect();
    // Probes answer while the ingest is full.
    assert!(collector.admin_get("/livez").starts_with("HTTP/1.1 200"));
    assert!(collector.admin_get("/readyz").starts_with("HTTP/1.1 200"));
    // Every silent connection is closed by the collector: the ones over the
    // limit at once, the others after the handshake timeout.
    for mut stream in silent {
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        assert!(
            closed_by_peer(&mut stream),
            "a silent connection stayed open"
        );
    }
    let refused = collector.metric("hermes_collector_receiver_connections_refused_total");
    let timed_out = collector.metric("hermes_collector_receiver_connections_timed_out_total");
    assert!(refused >= 250.0, "refused {refused}");
    assert!(timed_out >= 1.0, "timed out {timed_out}");
    assert!(
        wait_until(Duration::from_secs(5), Duration::from_millis(50), || {
            collector.metric("hermes_collector_receiver_connections_open") == 0.0
        }),
        "connections still counted open"
    );
    // A real client is served.
    send_basic_turn(&collector.endpoint, "a");
    assert!(otlp.store().wait_for_spans(4, Duration::from_secs(10)));
}

/// Reads what the server sends (its HTTP/2 settings) until it closes the
/// connection; false when it is still open at the read timeout.
fn closed_by_peer(stream: &mut TcpStream) -> bool {
    let mut buf = [0u8; 256];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) => return e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    }
}

#[test]
fn sighup_is_logged_and_ignored() {
    let (_work, _otlp, mut collector) = start("", "");
    assert!(collector.guard.signal("HUP"));
    assert!(
        collector
            .guard
            .wait_for_stderr(Duration::from_secs(10), |e| e.contains("SIGHUP ignored")),
        "{}",
        collector.guard.stderr_text()
    );
    assert!(collector.is_running());
    send_basic_turn(&collector.endpoint, "a");
    let status = collector.guard.terminate(Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "{}", collector.guard.stderr_text());
}

#[test]
fn spans_the_drain_cannot_export_are_counted_and_the_exit_code_says_so() {
    let (_work, otlp, mut collector) = exporting(|work, otlp| {
        otlp.store().fail_always(Some(Rejection::Unavailable));
        start_in(work, otlp, "", "shutdown:\n  grace_ms: 2000\n")
    });
    send_basic_turn(&collector.endpoint, "a");
    // The backend has refused the turn at least once: it is being retried.
    assert!(wait_until(
        Duration::from_secs(10),
        Duration::from_millis(50),
        || { otlp.store().rejected() > 0 }
    ));
    let (status, took) = collector.sigterm(Duration::from_secs(30));
    let status = status.expect("the collector did not stop");
    let log = collector.guard.stderr_text();
    assert!(took < Duration::from_secs(6), "took {took:?}:\n{log}");
    assert_eq!(
        status.code(),
        Some(75),
        "{status:?} {:?}\n{log}",
        status.signal()
    );
    let stopped = log
        .lines()
        .rev()
        .find(|l| l.contains("stopped"))
        .unwrap_or_else(|| panic!("no stopped line:\n{log}"));
    assert!(stopped.contains("spans_failed=4"), "{stopped}");
    assert!(log.contains("these are lost"), "{log}");
}
