//! The supervisor, against the binary: a stage that panics or returns on
//! its own ends the process with exit code 70 within the shutdown grace,
//! `/livez` answers 503 naming the stage before the exit, and what the
//! agents had acknowledged is not lost (with the disk queue, the next start
//! exports it). An idle ingest connection, which the drain closes after
//! its linger, keeps the process up long enough for the probe to look.
//!
//! The faults are injected with `HERMES_COLLECTOR_TEST_FAULT`, which only
//! debug builds (the binaries tests run) read: see `collector/pipeline/src/fault.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use hermes_e2e::OtlpReceiver;
use hermes_e2e::collector::Collector;
use hermes_e2e::free_port;
use hermes_e2e::ingest::{basic_events, batch_of, exchange};

const GRACE: Duration = Duration::from_secs(5);
const WAIT: Duration = Duration::from_secs(60);

fn config(listen: &str, otlp_endpoint: &str, queue_dir: Option<&Path>) -> String {
    let queue = match queue_dir {
        Some(dir) => format!("queue:\n  kind: disk\n  dir: {}\n", dir.display()),
        None => String::new(),
    };
    format!(
        "receiver:\n  listen: {listen}\nadmin:\n  listen: 127.0.0.1:0\n\
         exporters:\n  otlp:\n    endpoint: {otlp_endpoint}\n\
         shutdown:\n  grace_ms: {}\n{queue}",
        GRACE.as_millis()
    )
}

/// Polls `/livez` until it is not 200; its whole response.
fn livez_until_failing(collector: &Collector, within: Duration) -> Option<String> {
    let end = Instant::now() + within;
    while Instant::now() < end {
        let response = collector.admin_get("/livez");
        if !response.starts_with("HTTP/1.1 200") && !response.is_empty() {
            return Some(response);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// Starts a collector with `fault`, sends the basic turn, and checks the
/// supervisor's answer: `/livez` 503 naming `stage`, exit 70 within the
/// grace, the stage and how it ended in the log.
fn stage_fault_ends_the_process(
    fault: &str,
    stage: &str,
    how: &str,
    otlp_endpoint: &str,
    queue_dir: Option<&Path>,
) {
    let work = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let mut collector = Collector::start_with_config_env(
        work.path(),
        &listen,
        &config(&listen, otlp_endpoint, queue_dir),
        &[("HERMES_COLLECTOR_TEST_FAULT", fault)],
    );
    let acked = exchange(
        &collector.endpoint,
        None,
        vec![batch_of("supervised", basic_events())],
    )
    .unwrap();
    assert_eq!(acked.len(), 1, "the batch was acknowledged");
    // A connection that never speaks: the drain closes it after its linger,
    // which gives the probe below a window to see the failed liveness in.
    let _idle = std::net::TcpStream::connect(&listen).unwrap();

    let livez = livez_until_failing(&collector, WAIT)
        .unwrap_or_else(|| panic!("/livez never failed:\n{}", collector.guard.stderr_text()));
    assert!(livez.starts_with("HTTP/1.1 503"), "{livez}");
    assert!(
        livez.contains(&format!("the {stage} stage stopped")),
        "{livez}"
    );

    let failed_at = Instant::now();
    let status = collector
        .guard
        .wait_timeout(GRACE + Duration::from_secs(5))
        .unwrap_or_else(|| {
            panic!(
                "no exit within the grace:\n{}",
                collector.guard.stderr_text()
            )
        });
    let log = collector.guard.stderr_text();
    assert_eq!(status.code(), Some(70), "{log}");
    assert!(failed_at.elapsed() < GRACE + Duration::from_secs(5));
    assert!(
        log.lines()
            .any(|l| l.contains("a pipeline stage ended on its own")
                && l.contains(&format!("stage=\"{stage}\""))
                && l.contains(how)),
        "the log names the stage and how it ended:\n{log}"
    );
}

#[test]
fn a_panicking_correlator_fails_liveness_and_exits_70() {
    let receiver = OtlpReceiver::start();
    stage_fault_ends_the_process(
        "correlator:panic:1500",
        "correlator",
        "panicked",
        &receiver.endpoint(),
        None,
    );
}

#[test]
fn a_correlator_that_returns_early_fails_liveness_and_exits_70() {
    let receiver = OtlpReceiver::start();
    stage_fault_ends_the_process(
        "correlator:return:1500",
        "correlator",
        "returned",
        &receiver.endpoint(),
        None,
    );
}

/// The exporter dies while its backend is down; the acknowledged turn is
/// kept on disk and the next start exports it.
#[test]
fn a_panicking_exporter_exits_70_and_the_next_start_exports_what_was_acknowledged() {
    let queue = tempfile::tempdir().unwrap();
    let backend_port = free_port();
    let backend = format!("http://127.0.0.1:{backend_port}");
    stage_fault_ends_the_process(
        "exporter:panic:2500",
        "exporter",
        "panicked",
        &backend,
        Some(queue.path()),
    );

    let receiver = OtlpReceiver::start_on(backend_port);
    let work = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let mut collector = Collector::start_with_config(
        work.path(),
        &listen,
        &config(&listen, &backend, Some(queue.path())),
    );
    let names = || {
        receiver
            .spans()
            .into_iter()
            .map(|(_, span)| span.name)
            .collect::<Vec<_>>()
    };
    let exported = hermes_e2e::wait_until(WAIT, Duration::from_millis(100), || {
        let names = names();
        names.iter().any(|n| n.starts_with("invoke_agent"))
            && names.iter().any(|n| n.starts_with("execute_tool"))
    });
    assert!(
        exported,
        "the acknowledged turn was not exported after the restart: {:?}\n{}",
        names(),
        collector.guard.stderr_text()
    );
    assert_eq!(collector.guard.terminate(WAIT).code(), Some(0));
}
