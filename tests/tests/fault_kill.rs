//! SIGKILL with the persistent queue: the collector binary, fed by the load
//! generator (the shim's sender core: it resends what was not acknowledged),
//! is killed in the middle of a stream of more than 100 000 events and
//! restarted on the same queue directory. Every span the events make reaches
//! the OTLP receiver; a span delivered twice (exported before the kill, and
//! again from the replay) carries the same ids and content.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use hermes_e2e::collector::Collector;
use hermes_e2e::fault::{
    assert_all_arrived, loadgen_summary, read_span_keys, span_key, spawn_loadgen,
};
use hermes_e2e::{OtlpReceiver, cargo_bin, free_port};

#[test]
fn sigkill_mid_stream_then_restart_on_the_same_queue_loses_nothing() {
    cargo_bin("hermes-loadgen", "hermes-loadgen");
    let receiver = OtlpReceiver::start();
    let work = tempfile::tempdir().unwrap();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let config = format!(
        "receiver:\n  listen: {listen}\nadmin:\n  listen: 127.0.0.1:0\nqueue:\n  kind: disk\n  dir: {}\nexporters:\n  otlp:\n    endpoint: {}\n",
        work.path().join("queue").display(),
        receiver.endpoint()
    );
    let expected_file = work.path().join("expected-spans.txt");

    let mut collector = Collector::start_with_config(work.path(), &listen, &config);
    // 4 agents x 1 600 recorded turns: about 100 800 events.
    let endpoint = format!("http://127.0.0.1:{port}");
    let loadgen = spawn_loadgen(&[
        "--endpoint",
        &endpoint,
        "--instances",
        "4",
        "--turns",
        "1600",
        "--batch",
        "256",
        "--timeout-secs",
        "400",
        "--expect-spans",
        expected_file.to_str().unwrap(),
    ]);

    // Kill once a good part of the stream was acknowledged and exported.
    let deadline = Instant::now() + Duration::from_secs(240);
    while collector.metric("hermes_collector_receiver_accepted_events_total") < 30_000.0 {
        assert!(
            Instant::now() < deadline,
            "the load never reached 30 000 events:\n{}",
            collector.guard.stderr_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let before_kill = receiver.store().span_count();
    let status = collector.guard.kill();
    assert!(!status.success());
    assert!(before_kill > 0, "spans were flowing before the kill");

    // Same queue, same port: the loadgen's senders reconnect and resend.
    let mut collector = Collector::start_with_config(work.path(), &listen, &config);
    let replayed =
        |c: &Collector| c.metric("hermes_collector_persistent_queue_replayed_batches_total");
    let deadline = Instant::now() + Duration::from_secs(30);
    while replayed(&collector) == 0.0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(replayed(&collector) > 0.0, "the restart replayed the queue");

    let out = loadgen.into_output(Duration::from_secs(420));
    assert!(out.success(), "loadgen failed:\n{}", out.describe());
    let summary = loadgen_summary(&out);
    assert!(
        summary["events_acked"].as_u64().unwrap() >= 100_000,
        "{summary}"
    );

    let expected = read_span_keys(&expected_file);
    assert!(expected.len() > 30_000, "{} expected spans", expected.len());
    let received =
        || -> BTreeSet<String> { receiver.spans().iter().map(|(_, s)| span_key(s)).collect() };
    let deadline = Instant::now() + Duration::from_secs(120);
    while !received().is_superset(&expected) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(250));
    }
    let got = received();
    assert_all_arrived(&expected, &got, &collector.guard.stderr_text());
    let unexpected: Vec<_> = got.difference(&expected).take(10).collect();
    assert!(
        unexpected.is_empty(),
        "spans nobody expected: {unexpected:?}"
    );

    // A duplicate is the same span: same name, parent, times and status.
    let mut seen: HashMap<(Vec<u8>, Vec<u8>), _> = HashMap::new();
    let mut duplicates = 0usize;
    for (_, span) in receiver.spans() {
        let shape = (
            span.name.clone(),
            span.parent_span_id.clone(),
            span.start_time_unix_nano,
            span.end_time_unix_nano,
            span.status.clone(),
        );
        if let Some(first) =
            seen.insert((span.trace_id.clone(), span.span_id.clone()), shape.clone())
        {
            duplicates += 1;
            assert_eq!(first, shape, "a duplicate differs from the first delivery");
        }
    }
    eprintln!(
        "fault_kill: {} spans expected, {} received before the kill, {duplicates} duplicates",
        expected.len(),
        before_kill
    );

    collector.assert_clean_stop(Duration::from_secs(30));
}
