//! Agents against agents, at the collector binary with a raw gRPC client:
//! - an intruder sending events under its own shim instance id with a
//!   victim's session and turn ids does not change the victim's exported
//!   trace (the same spans as without the intruder), and its own spans land
//!   in a trace of their own;
//! - an agent sending ids longer than the limit is refused with
//!   `INVALID_ARGUMENT` naming the field, and an agent flooding turns and
//!   sessions evicts only its own state (counted, bounded gauges) while
//!   another agent's batch is acknowledged (never `UNAVAILABLE`) and its
//!   turn arrives whole.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use hermes_e2e::access::exporting;
use hermes_e2e::collector::Collector;
use hermes_e2e::collector::counter as metric;
use hermes_e2e::ingest::{basic_events, batch_of, send_basic_turn};
use hermes_e2e::{AttrsExt as _, ChildGuard, OtlpReceiver};
use hermes_proto::v1::{Event, EventBatch, Ids};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::Span;
use tempfile::TempDir;

const WAIT: Duration = Duration::from_secs(30);

/// Opens one stream to `endpoint`, sends `batches` and returns the last seqs
/// of the acks, or the status the stream ended with.
fn exchange(endpoint: &str, batches: Vec<EventBatch>) -> Result<Vec<u64>, tonic::Status> {
    hermes_e2e::ingest::exchange(endpoint, None, batches)
}

/// A collector binary on a free port, with `correlator` as its correlator
/// section, exporting to a receiver of its own ([`exporting`]); ready when
/// this returns.
fn start_collector(correlator: &str) -> (TempDir, OtlpReceiver, Collector) {
    exporting(|work, otlp| {
        let sections = format!(
            "correlator:\n{correlator}\nexporters:\n  otlp:\n    endpoint: {}\nbatch:\n  timeout_ms: 50\n",
            otlp.endpoint()
        );
        Collector::start_with_sections(work, &sections)
    })
}

fn instance(resource: &Resource) -> &str {
    resource.str_attr("service.instance.id").unwrap_or_default()
}

/// The spans of `instance_id` at `otlp`, sorted by trace and span id.
fn spans_of(otlp: &OtlpReceiver, instance_id: &str) -> Vec<Span> {
    let mut spans: Vec<Span> = otlp
        .spans()
        .into_iter()
        .filter(|(r, _)| instance(r) == instance_id)
        .map(|(_, s)| s)
        .collect();
    spans.sort_by(|a, b| (&a.trace_id, &a.span_id).cmp(&(&b.trace_id, &b.span_id)));
    spans
}

/// Waits until `instance_id` has `n` spans at `otlp`, then a little for
/// stragglers.
fn wait_for_spans_of(otlp: &OtlpReceiver, instance_id: &str, n: usize, collector: &ChildGuard) {
    let deadline = std::time::Instant::now() + WAIT;
    while spans_of(otlp, instance_id).len() < n {
        assert!(
            std::time::Instant::now() < deadline,
            "{instance_id}'s spans did not arrive:\n{}",
            collector.stderr_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
}

#[test]
fn an_intruder_with_the_victims_ids_does_not_alter_its_trace() {
    let events = basic_events();
    let n = events.len();
    // The victim alone.
    let alone = {
        let (_work, otlp, collector) = start_collector("  tick_ms: 50");
        let endpoint = collector.endpoint.clone();
        assert_eq!(
            exchange(&endpoint, vec![batch_of("victim", events.clone())]).unwrap(),
            vec![n as u64]
        );
        wait_for_spans_of(&otlp, "victim", 4, &collector);
        spans_of(&otlp, "victim")
    };
    assert_eq!(alone.len(), 4);

    // The victim's first half, then an intruder replaying the victim's
    // events (its session, turn, request and tool ids) under its own
    // instance, ending and finalizing the session; then the victim's rest.
    let (_work, otlp, collector) = start_collector("  tick_ms: 50");
    let endpoint = collector.endpoint.clone();
    let half = n / 2;
    assert_eq!(
        exchange(&endpoint, vec![batch_of("victim", events[..half].to_vec())]).unwrap(),
        vec![half as u64]
    );
    let session = events[0].ids.as_ref().unwrap().session_id.clone();
    let mut intrusion = events.clone();
    intrusion.push(Event {
        seq: n as u64 + 1,
        hook: "on_session_finalize".into(),
        time_unix_nano: events[half].time_unix_nano,
        ids: Some(Box::new(Ids {
            session_id: session,
            ..Default::default()
        })),
        ..Default::default()
    });
    assert_eq!(
        exchange(&endpoint, vec![batch_of("intruder", intrusion)]).unwrap(),
        vec![n as u64 + 1]
    );
    assert_eq!(
        exchange(&endpoint, vec![batch_of("victim", events[half..].to_vec())]).unwrap(),
        vec![n as u64]
    );
    wait_for_spans_of(&otlp, "victim", 4, &collector);
    wait_for_spans_of(&otlp, "intruder", 4, &collector);
    assert_eq!(
        spans_of(&otlp, "victim"),
        alone,
        "the victim's trace is untouched"
    );
    let victim_trace = &alone[0].trace_id;
    for span in spans_of(&otlp, "intruder") {
        assert_ne!(&span.trace_id, victim_trace, "{}", span.name);
    }
    assert_eq!(
        metric(
            &collector,
            "hermes_collector_correlator_cross_instance_turns_total"
        ),
        Some(1)
    );
}

#[test]
fn a_flooding_agent_does_not_lock_out_another() {
    let (_work, otlp, collector) = start_collector(
        "  max_open_turns_per_agent: 500\n  max_sessions_per_agent: 200\n  tick_ms: 50",
    );
    let endpoint = collector.endpoint.clone();

    // Ids of 100 KB: refused, naming the field and the limit.
    let long = Event {
        seq: 1,
        hook: "pre_llm_call".into(),
        time_unix_nano: 1,
        ids: Some(Box::new(Ids {
            session_id: "s".into(),
            turn_id: "t".repeat(100_000),
            ..Default::default()
        })),
        ..Default::default()
    };
    let refused = exchange(&endpoint, vec![batch_of("flood", vec![long])]).unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(
        refused.message().contains("turn_id") && refused.message().contains("256"),
        "{refused:?}"
    );

    // 5 000 open turns and 20 000 sessions from one agent.
    // Now, so that the TTL closes none of it during the test.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let mut seq = 0;
    let mut event = |hook: &str, session: String, turn: String| {
        seq += 1;
        Event {
            seq,
            hook: hook.into(),
            time_unix_nano: now + seq,
            ids: Some(Box::new(Ids {
                session_id: session,
                turn_id: turn,
                ..Default::default()
            })),
            ..Default::default()
        }
    };
    let mut flood = Vec::new();
    for b in 0..25 {
        let events = (0..1_000)
            .map(|i| {
                let n = b * 1_000 + i;
                if n < 5_000 {
                    event("pre_llm_call", format!("fs-{n}"), format!("ft-{n}"))
                } else {
                    event("on_session_start", format!("fs-{n}"), String::new())
                }
            })
            .collect();
        flood.push(batch_of("flood", events));
    }
    let acks = exchange(&endpoint, flood).expect("the flood is accepted");
    assert_eq!(acks.last(), Some(&25_000));

    // Another agent: acknowledged, and its turn arrives whole.
    send_basic_turn(&endpoint, "honest");
    wait_for_spans_of(&otlp, "honest", 4, &collector);
    let honest = spans_of(&otlp, "honest");
    let mut names: Vec<&str> = honest.iter().map(|s| s.name.as_str()).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "chat fake-model-1",
            "chat fake-model-1",
            "execute_tool terminal",
            "invoke_agent hermes"
        ]
    );
    assert!(honest.iter().all(|s| !s.has_attr("hermes.incomplete")));

    let gauge = |name: &str| metric(&collector, name).unwrap_or(u64::MAX);
    let open = gauge("hermes_collector_correlator_open_turns");
    assert!(open <= 500, "{open} open turns");
    let sessions = gauge("hermes_collector_correlator_sessions");
    assert!(sessions <= 200, "{sessions} sessions");
    let evicted = gauge("hermes_collector_correlator_evicted_turns_total");
    assert!(evicted >= 4_500, "{evicted} evicted turns");
    let forgotten = gauge("hermes_collector_correlator_evicted_sessions_total");
    assert!(forgotten >= 19_800, "{forgotten} evicted sessions");
    assert_eq!(gauge("hermes_collector_receiver_memory_refusals_total"), 0);
}
