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
use hermes_e2e::span_attrs::{boolean, string};

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

/// An agent whose stream starts over on the same collector (it moved away
/// and back) resends the session's start with the turn it came with, which
/// was closed and exported here. After the departure the turn is rebuilt,
/// the start with it, the same spans as before: the start never goes onto
/// the session's next turn, which would then differ from its copy
/// exported elsewhere.
#[test]
fn a_resent_turn_is_rebuilt_with_its_session_start() {
    const SECOND: &str = "20261129_200230_bbf019:task-1:2c17f88e";
    let mut f = Feed::new();
    let first_pass = |f: &mut Feed| {
        f.ev("on_session_start", 0, session_ids(SESSION), None);
        f.turn_start(1, TURN);
        f.turn_end(2, TURN);
        f.session_end(3, TURN, true, false);
        f.turn_start(4, SECOND);
    };
    first_pass(&mut f);
    assert_eq!(f.c.drop_instance("inst-1", Departure::HandedOff), 1);
    first_pass(&mut f);
    f.turn_end(5, SECOND);
    f.session_end(6, SECOND, true, false);
    f.c.flush_all(&mut f.out);

    let roots = f.spans("invoke_agent hermes");
    let of = |turn: &str| {
        roots
            .iter()
            .filter(|s| string(s, "hermes.turn_id") == Some(turn))
            .collect::<Vec<_>>()
    };
    let (first, second) = (of(TURN), of(SECOND));
    assert_eq!((first.len(), second.len()), (2, 1), "{:?}", f.names());
    assert_eq!(first[0], first[1], "the rebuilt turn is the same span");
    let starts = |s: &hermes_span::trace::v1::Span| {
        s.events
            .iter()
            .filter(|e| e.name == "hermes.session.start")
            .count()
    };
    assert_eq!(starts(first[0]), 1, "the first turn has its session start");
    assert_eq!(starts(second[0]), 0, "the next turn gets no resent start");
    assert_eq!(f.c.stats().late_events_dropped, 0, "nothing taken as late");
    assert_eq!(f.c.agent_usage("inst-1"), (0, 0, 0), "nothing left held");
}
