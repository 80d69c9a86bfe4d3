//! One collector of a replicated fleet (`fleet.replicated: true`), over
//! the wire protocol as fleet shims speak it: at SIGTERM it asks every
//! fleet stream to leave, takes their handoffs, and exports none of the
//! open turns they take along, while the open turn of an agent that went
//! away without a handoff (presumed dead) is exported incomplete.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use hermes_e2e::OtlpReceiver;
use hermes_e2e::collector::Collector;
use hermes_e2e::ingest::{
    FleetStream, basic_events, basic_open_turn, batch_of, connect, fleet_stream,
};
use hermes_e2e::span_tree::AttrsExt;

/// The `service.instance.id` of every root span the receiver holds, and
/// whether the turn is incomplete.
fn root_instances(receiver: &OtlpReceiver) -> Vec<(String, bool)> {
    let tree = receiver.store().tree();
    tree.roots()
        .into_iter()
        .map(|root| {
            let instance = tree
                .resource_of(root)
                .and_then(|r| r.str_attr("service.instance.id"))
                .unwrap_or_default()
                .to_owned();
            (instance, root.bool_attr("hermes.incomplete") == Some(true))
        })
        .collect()
}

#[test]
fn a_draining_replica_hands_fleet_agents_off_and_exports_only_a_dead_agents_turn() {
    let receiver = OtlpReceiver::start();
    let work = tempfile::tempdir().unwrap();
    let grace_ms = 10_000;
    let mut collector = Collector::start_with_sections(
        work.path(),
        &format!(
            "exporters:\n  otlp:\n    endpoint: {}\nshutdown:\n  grace_ms: {grace_ms}\nfleet:\n  replicated: true\n",
            receiver.endpoint()
        ),
    );
    let endpoint = collector.endpoint.clone();
    let open = basic_open_turn();
    let last_seq = open.last().unwrap().seq;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut moving: FleetStream = runtime.block_on(async {
        let mut client = connect(&endpoint, None).await.unwrap();
        // The agent that goes away without a handoff: its stream ends.
        let mut dead = fleet_stream(&mut client, batch_of("fleet-dead", open.clone()))
            .await
            .unwrap();
        assert!(dead.settles, "this collector settles");
        assert_eq!(dead.next_ack().await.unwrap().unwrap().last_seq, last_seq);
        dead.end();
        assert!(dead.next_ack().await.unwrap().is_none());
        // The agent that stays connected until the collector asks it to
        // leave.
        let mut moving = fleet_stream(&mut client, batch_of("fleet-moving", open.clone()))
            .await
            .unwrap();
        assert_eq!(moving.next_ack().await.unwrap().unwrap().last_seq, last_seq);
        moving
    });

    let stopping = std::thread::spawn(move || {
        let (status, _) = collector.sigterm(Duration::from_millis(grace_ms + 5000));
        (status, collector.stderr_text())
    });
    runtime.block_on(async {
        loop {
            let ack = moving
                .next_ack()
                .await
                .unwrap()
                .expect("asked to leave before the stream ends");
            if ack.leave {
                break;
            }
        }
        let mut handoff = batch_of("fleet-moving", Vec::new());
        handoff.handoff = true;
        moving.batches.send(handoff).await.unwrap();
        moving.end();
        while moving.next_ack().await.is_ok_and(|ack| ack.is_some()) {}
    });
    let (status, log) = stopping.join().unwrap();
    assert!(status.is_some_and(|s| s.success()), "{status:?}\n{log}");
    assert!(log.contains("handoffs=1"), "{log}");

    let roots = root_instances(&receiver);
    assert_eq!(
        roots.len(),
        1,
        "only the dead agent's turn: {roots:?}\n{log}"
    );
    assert_eq!(roots[0], ("fleet-dead".to_owned(), true), "{roots:?}");
    // The agent that moved: its closed attempts and tools may be exported
    // (the next replica sends identical copies), its turn is not.
    assert!(!roots.iter().any(|(i, _)| i == "fleet-moving"));
}

#[test]
fn a_fleet_agent_learns_its_events_are_settled_once_its_turn_is_exported() {
    let receiver = OtlpReceiver::start();
    let work = tempfile::tempdir().unwrap();
    let collector = Collector::start_with_sections(
        work.path(),
        &format!(
            "exporters:\n  otlp:\n    endpoint: {}\n",
            receiver.endpoint()
        ),
    );
    let events = basic_events();
    let last_seq = events.last().unwrap().seq;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut client = connect(&collector.endpoint, None).await.unwrap();
        let mut stream = fleet_stream(&mut client, batch_of("fleet-1", events))
            .await
            .unwrap();
        assert!(stream.settles);
        let ack = stream.next_ack().await.unwrap().unwrap();
        assert_eq!((ack.last_seq, ack.settled_seq), (last_seq, 0));
        // Settlement-only acks until every event is settled.
        loop {
            let ack = stream.next_ack().await.unwrap().unwrap();
            assert_eq!((ack.first_seq, ack.last_seq), (0, 0), "{ack:?}");
            if ack.settled_seq == last_seq {
                break;
            }
        }
    });
    // Settled means exported: the backend has the turn.
    let roots = root_instances(&receiver);
    assert_eq!(roots, vec![("fleet-1".to_owned(), false)]);
}
