//! SIGTERM under load: the collector binary, fed by the load generator over
//! the wire protocol, exporting to an in-test OTLP receiver, stops within its
//! grace period, and every span it produced from the events it acknowledged
//! reaches the receiver (open turns are closed as incomplete, not dropped).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use hermes_e2e::collector::Collector;
use hermes_e2e::fault::{loadgen_summary, spawn_loadgen};
use hermes_e2e::{OtlpReceiver, cargo_bin};

/// `key=value` of the collector's final `stopped` log line.
fn stopped_field(log: &str, key: &str) -> u64 {
    let line = log
        .lines()
        .rev()
        .find(|l| l.contains("stopped"))
        .unwrap_or_else(|| panic!("no stopped line:\n{log}"));
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {line}"))
}

#[test]
fn sigterm_during_load_exits_within_grace_and_loses_nothing_acknowledged() {
    // Build both binaries first: the load must start right after the collector.
    cargo_bin("hermes-collector", "hermes-collector");
    cargo_bin("hermes-loadgen", "hermes-loadgen");
    let receiver = OtlpReceiver::start();
    let work = tempfile::tempdir().unwrap();
    // Debug builds on a busy 2-core machine: a generous grace, still far
    // below Kubernetes' 30 s.
    let grace_ms = 15_000;
    let mut collector = Collector::start_with_sections(
        work.path(),
        &format!(
            "exporters:\n  otlp:\n    endpoint: {}\nshutdown:\n  grace_ms: {grace_ms}\n",
            receiver.endpoint()
        ),
    );
    let loadgen = spawn_loadgen(&[
        "--endpoint",
        &collector.endpoint,
        "--instances",
        "4",
        "--turns",
        "5000",
        "--timeout-secs",
        "120",
        // The collector is gone after SIGTERM: stop waiting for acks.
        "--give-up-secs",
        "2",
    ]);
    // Load is flowing end to end.
    assert!(
        receiver
            .store()
            .wait_for_spans(500, Duration::from_secs(60)),
        "no spans under load: {}",
        collector.stderr_text()
    );

    let (status, took) = collector.sigterm(Duration::from_millis(grace_ms + 5000));
    assert!(
        status.is_some_and(|s| s.success()),
        "collector did not exit cleanly within the grace period: {status:?}\n{}",
        collector.stderr_text()
    );
    assert!(
        took <= Duration::from_millis(grace_ms + 2000),
        "took {took:?}"
    );

    let out = loadgen.into_output(Duration::from_secs(30));
    let summary = loadgen_summary(&out);
    let acked = summary["events_acked"].as_u64().unwrap();
    assert!(acked > 0, "{summary}");

    let log = collector.stderr_text();
    let accepted = stopped_field(&log, "events");
    let produced = stopped_field(&log, "spans");
    let sent = stopped_field(&log, "spans_sent");
    let failed = stopped_field(&log, "spans_failed");
    assert!(
        accepted >= acked,
        "the collector accepted every event it acknowledged: {accepted} < {acked}"
    );
    assert_eq!(failed, 0, "{log}");
    assert_eq!(sent, produced, "every span produced was exported:\n{log}");
    let tree = receiver.store().tree();
    assert_eq!(
        tree.len() as u64,
        produced,
        "the receiver holds every span, once"
    );
    assert!(tree.duplicates().is_empty());
    assert!(
        tree.orphans().is_empty(),
        "no span lost its parent at shutdown"
    );
}
