//! A fleet's departures: an instance's open state forgotten without a
//! span (it moved to another collector, or never came back after a
//! restart), its budget given back, and the same turns correlated whole
//! if it returns.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::Feed;
use common::turn::{SESSION, TURN, ids};
use hermes_correlator::Departure;
use hermes_e2e::events::{session_ids, shim, turn_body};
use hermes_e2e::span_attrs::boolean;

#[test]
fn a_departed_instance_is_forgotten_without_a_span_and_may_come_back() {
    let mut f = Feed::new();
    let other = shim("inst-2");
    f.ev("on_session_start", 0, session_ids(SESSION), None);
    f.turn_start(1, TURN);
    f.tool_start(2, TURN, "call-1", "terminal");
    f.ev_from(&other, "pre_llm_call", 3, ids("s:t2:x"), turn_body());
    let (turns, _, bytes) = f.c.agent_usage("inst-1");
    assert!(turns == 1 && bytes > 0);

    assert_eq!(f.c.drop_instance("inst-1", Departure::HandedOff), 1);
    assert!(f.out.is_empty(), "nothing exported: {:?}", f.names());
    assert_eq!(f.c.agent_usage("inst-1"), (0, 0, 0), "its budget is back");
    assert_eq!(
        f.c.agent_usage("inst-2").0,
        1,
        "the other agent keeps its turn"
    );
    assert_eq!(f.c.stats().turns_handed_off, 1);
    assert_eq!(f.c.stats().turns_orphaned, 0);

    // It comes back and sends the same turn again, whole.
    f.ev("on_session_start", 0, session_ids(SESSION), None);
    f.turn_start(1, TURN);
    f.turn_end(5, TURN);
    f.session_end(6, TURN, true, false);
    f.c.flush_all(&mut f.out);
    let root = f
        .spans("invoke_agent hermes")
        .into_iter()
        .find(|s| boolean(s, "hermes.turn.completed") == Some(true))
        .expect("the turn, completed");
    assert_eq!(boolean(root, "hermes.incomplete"), None);
    assert!(
        root.events.iter().any(|e| e.name == "hermes.session.start"),
        "its session start came along: {root:?}"
    );
    assert_eq!(
        f.c.stats().late_events_dropped,
        0,
        "not remembered as closed"
    );
}

#[test]
fn orphans_are_counted_apart_from_handoffs() {
    let mut f = Feed::in_turn();
    assert_eq!(f.c.drop_instance("inst-1", Departure::Orphaned), 1);
    assert_eq!(f.c.drop_instance("inst-1", Departure::Orphaned), 0);
    assert_eq!(f.c.stats().turns_orphaned, 1);
    assert_eq!(f.c.stats().turns_handed_off, 0);
    assert_eq!(f.c.min_lsn(), None);
}
