//! When the correlator closes what is open, and what it keeps until then:
//! a session's finalize or reset and its next turn, the end grace and the
//! state TTL (against backlogs, replays and skewed clocks), the open-turn
//! limits and eviction below a queue position, and the timers the pipeline
//! runs for them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::Feed;
use common::turn::{API1, SESSION, TURN, api, failed, ids, with_retryable};
use hermes_correlator::{Config, Expiry};
use hermes_e2e::events::{self, MS, T0, session_ids, shim, turn_body};
use hermes_e2e::span_attrs::{boolean, string};
use hermes_proto::v1;
use hermes_span::trace::v1::status::StatusCode;

#[test]
fn turn_without_session_end_closes_after_grace_and_ttl() {
    let mut f = Feed::in_turn();
    f.turn_end(100, TURN);
    // Another agent's turn, still open.
    let other = v1::Ids {
        session_id: "other-session".into(),
        ..ids("s:t2:x")
    };
    f.ev("pre_llm_call", 100, other, turn_body());
    f.c.expire(T0 + 1000 * MS, &mut f.out);
    assert!(f.out.is_empty(), "within grace");
    f.c.expire(T0 + 2100 * MS, &mut f.out);
    assert_eq!(f.out.len(), 1);
    assert_eq!(boolean(&f.out[0].span, "hermes.incomplete"), None);
    assert_eq!(f.out[0].span.end_time_unix_nano, T0 + 100 * MS);
    f.c.expire(T0 + 3601 * 1000 * MS, &mut f.out);
    assert_eq!(f.out.len(), 2);
    assert_eq!(boolean(&f.out[1].span, "hermes.incomplete"), Some(true));
    assert_eq!(f.c.stats().expired, 1);
    assert_eq!(f.c.open_turns(), 0);
}

#[test]
fn open_turn_limit_evicts_the_oldest() {
    let mut f = Feed::with(Config {
        max_open_turns: 2,
        ..Config::default()
    });
    // Three agents (sessions) with a turn open each.
    for (i, t) in ["s:a:1", "s:b:1", "s:c:1"].iter().enumerate() {
        let turn_ids = v1::Ids {
            session_id: format!("session-{i}"),
            ..ids(t)
        };
        f.ev("pre_llm_call", i as u64, turn_ids, turn_body());
    }
    assert_eq!(f.c.open_turns(), 2);
    assert_eq!(f.c.stats().turns_evicted, 1);
    assert_eq!(f.out.len(), 1);
    assert_eq!(string(&f.out[0].span, "hermes.turn_id"), Some("s:a:1"));
    assert_eq!(boolean(&f.out[0].span, "hermes.incomplete"), Some(true));
}

#[test]
fn an_agent_at_its_limit_loses_its_least_recently_active_turn() {
    let mut f = Feed::with(Config {
        max_open_turns_per_agent: 3,
        ..Config::default()
    });
    let turn = |i: usize| v1::Ids {
        session_id: format!("session-{i}"),
        ..ids(&format!("s:{i}:1"))
    };
    let open = |f: &mut Feed, i: usize, t_ms: u64| {
        f.ev("pre_llm_call", t_ms, turn(i), turn_body());
    };
    for i in 0..3 {
        open(&mut f, i, i as u64);
    }
    // The first turn is active again: the second is now the oldest.
    f.ev("post_llm_call", 10, turn(0), turn_body());
    open(&mut f, 3, 11);
    // Active again after the agent's first eviction as well.
    f.ev("post_llm_call", 20, turn(2), turn_body());
    for i in 4..7 {
        open(&mut f, i, 20 + i as u64);
    }
    let evicted: Vec<_> = f
        .out
        .iter()
        .filter(|s| s.span.name.starts_with("invoke_agent"))
        .map(|s| string(&s.span, "hermes.turn_id").unwrap_or_default())
        .collect();
    // 1 (at 1 ms), 0 (10), 3 (11), 2 (20): never by the order they opened.
    assert_eq!(evicted, ["s:1:1", "s:0:1", "s:3:1", "s:2:1"]);
    assert_eq!(f.c.stats().turns_evicted, 4);
    assert_eq!(f.c.open_turns(), 3);
}

#[test]
fn finalize_and_reset_close_open_turns_of_the_session() {
    for hook in ["on_session_finalize", "on_session_reset"] {
        let mut f = Feed::in_turn();
        f.ev(hook, 50, session_ids(SESSION), None);
        let root = f.one("invoke_agent hermes");
        assert_eq!(boolean(root, "hermes.incomplete"), Some(true), "{hook}");
        assert_eq!(root.end_time_unix_nano, T0 + 50 * MS, "{hook}");
        assert_eq!(f.c.open_turns(), 0, "{hook}");
    }
}

#[test]
fn finalize_ends_its_session_and_reset_does_not() {
    let mut f = Feed::in_turn();
    f.ev("on_session_reset", 40, session_ids("new-session"), None);
    assert!(
        f.c.take_session_ends().is_empty(),
        "reset names the new session"
    );
    f.ev("on_session_finalize", 50, session_ids(SESSION), None);
    let ends = f.c.take_session_ends();
    assert_eq!(ends.len(), 1);
    assert_eq!(ends[0].session_id, SESSION);
    assert_eq!(ends[0].instance_id, f.shim.instance_id);
    assert!(f.c.take_session_ends().is_empty(), "taken once");
}

#[test]
fn session_ends_nobody_takes_stay_bounded() {
    let mut f = Feed::new();
    for i in 0..hermes_correlator::MAX_SESSION_ENDS + 10 {
        f.ev(
            "on_session_finalize",
            1,
            session_ids(&format!("s{i}")),
            None,
        );
    }
    let ends = f.c.take_session_ends();
    assert_eq!(ends.len(), hermes_correlator::MAX_SESSION_ENDS);
    assert_eq!(ends[0].session_id, "s10", "the oldest went first");
}

#[test]
fn next_turn_of_the_session_closes_a_turn_that_never_ended() {
    let mut f = Feed::in_turn();
    f.api_start(10, API1, 1, 10);
    let call = failed(api(1, 10, 49), 400, "format_error");
    f.api_error(50, API1, with_retryable(call, false));
    // Hermes' failure path fires neither post_llm_call nor on_session_end.
    assert!(
        f.out
            .iter()
            .all(|s| !s.span.name.starts_with("invoke_agent"))
    );
    let next = "20261129_200230_bbf019:task-2:22222222";
    f.turn_start(100, next);
    let root = f.one("invoke_agent hermes");
    assert_eq!(string(root, "hermes.turn_id"), Some(TURN));
    assert_eq!(boolean(root, "hermes.incomplete"), Some(true));
    assert_eq!(
        root.end_time_unix_nano,
        T0 + 50 * MS,
        "ends with its last event"
    );
    assert_eq!(
        root.status.as_ref().map(|s| s.code),
        Some(StatusCode::Error as i32),
        "the failed attempt fails the turn"
    );
    assert_eq!(string(root, "error.type"), Some("format_error"));
    assert_eq!(f.c.open_turns(), 1);
}

#[test]
fn open_state_remembers_the_lowest_queue_position_that_touched_it() {
    let mut f = Feed::new();
    assert_eq!(f.c.min_lsn(), None);
    f.c.set_lsn(7);
    f.ev("on_session_start", 0, session_ids(SESSION), None);
    assert_eq!(f.c.min_lsn(), Some(7), "a pending session start counts");
    f.c.set_lsn(9);
    f.turn_start(1, "turn-1");
    // The turn took the pending start as an event of its span: it needs
    // the start's record (7) as well as its own (9).
    assert_eq!(f.c.min_lsn(), Some(7));
    // A late event from an older record (released by the sequencer after a
    // hole closed) lowers the turn's position.
    f.c.set_lsn(4);
    f.tool_start(2, "turn-1", "call-1", "terminal");
    f.c.set_lsn(12);
    f.tool_end(3, "turn-1", "call-1", "terminal", "ok", Some(1));
    assert_eq!(f.c.min_lsn(), Some(4));
    f.turn_end(4, "turn-1");
    f.session_end(5, "turn-1", true, false);
    assert_eq!(f.c.min_lsn(), None, "nothing open, nothing needed");
}

#[test]
fn eviction_below_a_queue_position_closes_what_depends_on_it() {
    let mut f = Feed::new();
    f.c.set_lsn(3);
    f.turn_start(0, "turn-old");
    f.c.set_lsn(10);
    let other_session = v1::Ids {
        session_id: "session-2".into(),
        ..ids("turn-new")
    };
    f.ev("pre_llm_call", 1, other_session, turn_body());
    f.c.evict_below_lsn(5, &mut f.out);
    assert_eq!(f.c.open_turns(), 1);
    assert_eq!(f.c.min_lsn(), Some(10));
    assert_eq!(f.c.stats().turns_evicted, 1);
    let old = &f.out[0].span;
    assert_eq!(boolean(old, "hermes.incomplete"), Some(true));
}

#[test]
fn a_backlog_does_not_split_a_turn_at_the_end_grace() {
    let mut f = Feed::new();
    // The collector's clock is 10 s past the events' capture times (events
    // queued in front of the correlator).
    f.c.expire(T0 + 10_000 * MS, &mut f.out);
    f.turn_start(0, TURN);
    f.turn_end(100, TURN);
    f.c.expire(T0 + 10_100 * MS, &mut f.out);
    assert!(
        f.out.is_empty(),
        "the grace runs from when the end was seen"
    );
    f.session_end(101, TURN, true, false);
    assert_eq!(f.names(), ["invoke_agent hermes"]);
    assert_eq!(boolean(&f.out[0].span, "hermes.incomplete"), None);
    f.c.expire(T0 + 20_000 * MS, &mut f.out);
    assert_eq!(
        f.out.len(),
        1,
        "one turn, not a second one from its end event"
    );
}

#[test]
fn a_turn_replayed_with_old_capture_times_lives_while_its_events_arrive() {
    let mut f = Feed::new();
    let ttl = Config::default().state_ttl_nanos;
    // The events were captured two TTLs ago (a spool replayed after a long
    // outage): the clock is far past them, but they arrive now.
    let now = T0 + 2 * ttl;
    f.c.expire(now, &mut f.out);
    f.turn_start(0, TURN);
    f.c.expire(now + 500 * MS, &mut f.out);
    assert!(
        f.out.is_empty(),
        "expired between two batches of its events"
    );
    f.turn_end(100, TURN);
    f.session_end(101, TURN, true, false);
    assert_eq!(f.names(), ["invoke_agent hermes"]);
    assert_eq!(boolean(&f.out[0].span, "hermes.incomplete"), None);
    // Still closed by the TTL once its events stop.
    let mut g = Feed::new();
    g.c.expire(now, &mut g.out);
    g.turn_start(0, TURN);
    g.c.expire(now + ttl, &mut g.out);
    assert_eq!(g.names(), ["invoke_agent hermes"]);
    assert_eq!(boolean(&g.out[0].span, "hermes.incomplete"), Some(true));
}

#[test]
fn one_agent_cannot_evict_the_turns_of_another() {
    let mut f = Feed::with(Config {
        max_open_turns_per_agent: 2,
        ..Config::default()
    });
    let quiet = events::ids("qs", "", "q1");
    f.ev_from(&shim("quiet"), "pre_llm_call", 0, quiet, turn_body());
    for n in 0..5 {
        // A flooding agent opens turns in sessions of its own.
        let flood = events::ids(&format!("fs{n}"), "", &format!("f{n}"));
        f.ev_from(&shim("flood"), "pre_llm_call", 0, flood, turn_body());
    }
    assert_eq!(
        f.c.open_turns(),
        3,
        "2 of the flooder's, 1 of the quiet agent's"
    );
    assert_eq!(f.c.stats().turns_evicted, 3);
    let evicted: Vec<_> = f
        .out
        .iter()
        .map(|s| string(&s.span, "hermes.turn_id"))
        .collect();
    assert_eq!(evicted, [Some("f0"), Some("f1"), Some("f2")]);
}

#[test]
fn far_future_timestamps_do_not_keep_state_forever() {
    let mut f = Feed::new();
    // A shim whose clock is a year ahead.
    let year_ms = 365 * 24 * 3600 * 1000;
    f.turn_start(year_ms, TURN);
    f.ev("on_session_start", year_ms, session_ids("other"), None);
    f.c.expire(T0 + 1000 * MS, &mut f.out);
    assert_eq!(f.c.open_turns(), 0, "closed by the TTL, counted both ways");
    assert_eq!(f.c.min_lsn(), None, "the pending session start is gone too");
}

#[test]
fn idle_once_nothing_is_left_for_the_timers() {
    // The pipeline stops its timer while the correlator expects nothing:
    // `expire` must then have nothing to do.
    let mut f = Feed::new();
    assert_eq!(f.c.expiry(), Expiry::Never);
    f.turn_start(0, TURN);
    assert_eq!(f.c.expiry(), Expiry::EveryTick, "an open turn");
    f.turn_end(100, TURN);
    f.session_end(101, TURN, true, false);
    assert_eq!(f.c.open_turns(), 0);
    assert!(!f.out.is_empty());
    // The turn's resource goes at the next tick once its spans are gone.
    f.out.clear();
    assert_eq!(f.c.expiry(), Expiry::EveryTick, "a cached resource");
    f.c.expire(T0 + 200 * MS, &mut f.out);
    assert!(f.out.is_empty());
    assert_eq!(f.c.expiry(), Expiry::Never);
}

#[test]
fn state_only_the_ttl_closes_wakes_the_timers_at_the_ttl() {
    // A session start without a turn and a finished subagent's link are
    // kept for `state_ttl`; the pipeline sleeps until then.
    let ttl = 60_000 * MS;
    let mut f = Feed::with(Config {
        state_ttl_nanos: ttl,
        ..Config::default()
    });
    let link = events::link(SESSION, TURN, "child", "sa-1");
    f.turn_start(0, TURN);
    f.ev("subagent_start", 10, link.clone(), None);
    f.ev("subagent_stop", 20, link, None);
    f.turn_end(30, TURN);
    f.session_end(31, TURN, true, false);
    let start = session_ids("next");
    f.ev("on_session_start", 40, start, None);
    f.out.clear();
    f.c.expire(T0 + 100 * MS, &mut f.out);
    // The link was last seen at its subagent's start (10 ms).
    assert_eq!(f.c.expiry(), Expiry::At(T0 + 10 * MS + ttl));
    f.c.expire(T0 + 10 * MS + ttl - 1, &mut f.out);
    assert_eq!(f.c.expiry(), Expiry::At(T0 + 10 * MS + ttl), "not yet");
    f.c.expire(T0 + 10 * MS + ttl, &mut f.out);
    assert_eq!(
        f.c.expiry(),
        Expiry::At(T0 + 40 * MS + ttl),
        "the session start"
    );
    f.c.expire(T0 + 40 * MS + ttl, &mut f.out);
    assert_eq!(f.c.expiry(), Expiry::Never);
    assert!(f.out.is_empty(), "TTL-only state closes no span");
}
