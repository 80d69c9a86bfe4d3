//! Stage tests of fleet mode: settlement of a fleet shim's events, and a
//! handoff, on the memory queue (the stage numbers the batches).

use hermes_receiver::Settlements;
use tokio::sync::watch;

use super::*;
use crate::settle::Settlement;
use crate::writer::{Recovered, Settle};

const AGENT: &str = "agent-1";

/// A stage settling into a fresh registry, with the exporter stage's
/// finished messages read from `done`; the watch of [`AGENT`]'s settled
/// seq (as its fleet stream would hold it); the stage's stats.
fn start_fleet(
    events: &[Event],
    done: &Arc<AtomicU64>,
) -> (Stage, watch::Receiver<u64>, Arc<PipelineStats>) {
    let registry = Arc::new(Settlements::default());
    let settled = registry.subscribe(AGENT);
    let mut driver = driver(Ledger::Memory, events);
    let done = done.clone();
    driver.settlement = Some(Settlement::new(
        registry,
        Box::new(move || done.load(Ordering::Relaxed)),
    ));
    let stats = driver.stats.clone();
    (spawn(driver), settled, stats)
}

/// A batch of [`AGENT`]'s `events` from fleet stream `stream` (0: not
/// numbered), without an lsn (the memory queue).
fn fleet_batch(events: Vec<Event>, stream: u64) -> Ingested {
    let mut ingested = ingested(AGENT, events);
    ingested.fleet = true;
    ingested.stream = stream;
    ingested
}

/// Sends each event as a batch of its own from fleet stream `stream`; with
/// `starts`, the first one is the stream's first batch.
async fn feed_stream(stage: &Stage, stream: u64, events: Vec<Event>, starts: bool) {
    for (i, event) in events.into_iter().enumerate() {
        let mut ingested = fleet_batch(vec![event], stream);
        ingested.fresh = starts && i == 0;
        stage.ingest.send(ingested).await.unwrap();
    }
}

/// Sends each event as a batch of its own from a fleet stream.
async fn feed_fleet(stage: &Stage, events: Vec<Event>) {
    feed_stream(stage, 0, events, false).await;
}

/// The handoff batch of [`AGENT`] on fleet stream `stream`.
async fn hand_off(stage: &Stage, stream: u64) {
    let mut ingested = fleet_batch(Vec::new(), stream);
    ingested.batch.handoff = true;
    stage.ingest.send(ingested).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn events_settle_only_once_their_turn_is_exported() {
    let events = basic_events();
    let last_seq = events.last().unwrap().seq;
    let open = open_turn();
    let rest = events[open.len()..].to_vec();
    let done = Arc::new(AtomicU64::new(u64::MAX));
    let (mut stage, settled, _) = start_fleet(&events, &done);
    feed_fleet(&stage, open).await;
    tokio::time::sleep(4 * TICK).await;
    assert_eq!(*settled.borrow(), 0, "the turn is open: nothing settled");

    // The exporter stage has finished nothing from here on.
    done.store(0, Ordering::Relaxed);
    feed_fleet(&stage, rest).await;
    let spans = exported_within(&mut stage.export, GRACE + 2 * TICK).await;
    assert!(!incomplete(one_root(&spans, "the turn ended")));
    tokio::time::sleep(4 * TICK).await;
    assert_eq!(*settled.borrow(), 0, "sent, not exported: nothing settled");

    done.store(u64::MAX, Ordering::Relaxed);
    tokio::time::sleep(2 * TICK).await;
    assert_eq!(*settled.borrow(), last_seq, "exported: every event settled");
    drop(stage.ingest);
    stage.task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_handoff_forgets_open_state_without_exporting_it() {
    let events = basic_events();
    let done = Arc::new(AtomicU64::new(u64::MAX));
    let (mut stage, settled, stats) = start_fleet(&events, &done);
    feed_fleet(&stage, open_turn()).await;
    hand_off(&stage, 0).await;
    // The end of the stage closes what is open (memory queue): nothing is.
    stage.stop.cancel();
    drop(stage.ingest);
    stage.task.await.unwrap();
    // The attempts and tools that closed before the handoff went out as
    // they closed (the next replica builds identical copies); the turn
    // itself is not closed here, as incomplete or otherwise.
    let spans = exported_within(&mut stage.export, TICK).await;
    assert!(
        roots(&spans).is_empty(),
        "handed off, not exported: {spans:?}"
    );
    assert!(!spans.iter().any(incomplete), "{spans:?}");
    assert_eq!(stats.turns_handed_off.load(Ordering::Relaxed), 1);
    assert_eq!(*settled.borrow(), 0, "a handoff settles nothing");
}

#[tokio::test(start_paused = true)]
async fn a_shim_that_comes_back_after_a_handoff_is_correlated_whole() {
    let events = basic_events();
    let done = Arc::new(AtomicU64::new(u64::MAX));
    let (mut stage, settled, _) = start_fleet(&events, &done);
    feed_fleet(&stage, open_turn()).await;
    hand_off(&stage, 0).await;
    // It returns and sends every event it kept again, from seq 1.
    feed_fleet(&stage, events.clone()).await;
    let spans = exported_within(&mut stage.export, GRACE + 2 * TICK).await;
    let root = one_root(&spans, "the turn ended once");
    assert!(!incomplete(root), "{root:?}");
    tokio::time::sleep(2 * TICK).await;
    assert_eq!(*settled.borrow(), events.last().unwrap().seq);
    drop(stage.ingest);
    stage.task.await.unwrap();
}

/// A replicated stage (`fleet.replicated`) on `ledger`, settling into
/// `registry`, everything exported at once.
fn start_replicated(ledger: Ledger, events: &[Event], registry: &Arc<Settlements>) -> Stage {
    let mut driver = driver(ledger, events);
    driver.settlement = Some(
        Settlement::new(registry.clone(), Box::new(|| u64::MAX)).replicated(TTL.as_secs() * SEC),
    );
    spawn(driver)
}

/// How many turns `spans` hold, and how many of them are incomplete.
fn roots_incomplete(spans: &[Span]) -> (usize, usize) {
    let roots = roots(spans);
    let incomplete = roots.iter().filter(|s| incomplete(s)).count();
    (roots.len(), incomplete)
}

#[tokio::test(start_paused = true)]
async fn a_replicated_drain_drops_what_moves_and_closes_what_a_dead_agent_left() {
    let events = open_turn();
    let registry = Arc::new(Settlements::default());
    // agent-1 is still connected at the end (it moves with its events);
    // agent-2's stream ended without a handoff (presumed dead).
    let _connected = registry.subscribe(AGENT);
    registry.stream_opened();
    let dead = registry.subscribe("agent-2");
    registry.stream_closed(Some(("agent-2".to_owned(), dead)), true);
    let mut stage = start_replicated(Ledger::Memory, &events, &registry);
    for instance in [AGENT, "agent-2"] {
        for event in events.clone() {
            let mut ingested = ingested(instance, vec![event]);
            ingested.fleet = true;
            stage.ingest.send(ingested).await.unwrap();
        }
    }
    tokio::time::sleep(TICK).await;
    stage.stop.cancel();
    let ended = stage.task.await.unwrap();
    assert_eq!(ended.open, None);
    let spans = exported_within(&mut stage.export, TICK).await;
    assert_eq!(
        roots_incomplete(&spans),
        (1, 1),
        "only the dead agent's turn is closed, as incomplete: {spans:?}"
    );
}

/// A replicated stage on `registry` (as the receiver left it) that took
/// [`AGENT`]'s basic turn up to its end, `post_llm_call`, without its
/// `on_session_end`; the events from that one on.
async fn ended_turn(registry: &Arc<Settlements>) -> (Stage, Vec<Event>) {
    let (events, rest) = ended_and_rest();
    let stage = start_replicated(Ledger::Memory, &events, registry);
    feed_fleet(&stage, events).await;
    (stage, rest)
}

/// [`AGENT`]'s basic turn up to its end, `post_llm_call`, and the events
/// from its `on_session_end` on.
fn ended_and_rest() -> (Vec<Event>, Vec<Event>) {
    let mut events = basic_events();
    let end = events
        .iter()
        .position(|e| e.hook == "on_session_end")
        .unwrap();
    let rest = events.split_off(end);
    (events, rest)
}

#[tokio::test(start_paused = true)]
async fn an_ended_turn_of_an_agent_gone_without_a_handoff_waits_for_the_ttl() {
    // The agent's stream ended without a handoff after its turn's
    // post_llm_call: the agent may have moved on with its handoff stuck
    // behind a full stream, and its next replica ends the turn whole. This
    // one must not close it at the end grace, ended but without its end.
    let registry = Arc::new(Settlements::default());
    registry.stream_opened();
    let gone = registry.subscribe(AGENT);
    registry.stream_closed(Some((AGENT.to_owned(), gone)), true);
    let (mut stage, _) = ended_turn(&registry).await;
    let spans = exported_within(&mut stage.export, GRACE + 4 * TICK).await;
    assert!(roots(&spans).is_empty(), "closed at the grace: {spans:?}");
    let spans = exported_within(&mut stage.export, TTL).await;
    assert_eq!(
        roots_incomplete(&spans),
        (1, 1),
        "closed at the TTL, incomplete"
    );
    drop(stage.ingest);
    stage.task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_ended_turn_of_a_connected_agent_waits_past_the_grace_for_its_end_or_handoff() {
    // The agent is still connected after its turn's post_llm_call, but it
    // may have moved: its on_session_end went to its next replica, and the
    // handoff behind its last batches here is read late (a backed-up
    // stream). Closing the turn at the end grace would export it without
    // its end while the next replica ends it whole.
    let registry = Arc::new(Settlements::default());
    let _connected = registry.subscribe(AGENT);
    let (mut stage, rest) = ended_turn(&registry).await;
    let spans = exported_within(&mut stage.export, GRACE + 4 * TICK).await;
    assert!(roots(&spans).is_empty(), "closed at the grace: {spans:?}");
    // It did not move: its end comes, and the turn ends whole.
    feed_fleet(&stage, rest).await;
    let spans = exported_within(&mut stage.export, 2 * TICK).await;
    assert_eq!(roots_incomplete(&spans), (1, 0), "{spans:?}");
    let completed = one_root(&spans, "ended")
        .attributes
        .iter()
        .find(|kv| kv.key == "hermes.turn.completed")
        .and_then(|kv| kv.value.as_ref()?.value.clone());
    assert_eq!(
        completed,
        Some(Value::BoolValue(true)),
        "ended by its end event"
    );
    drop(stage.ingest);
    stage.task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_ended_turn_handed_off_after_the_grace_is_not_exported() {
    let registry = Arc::new(Settlements::default());
    let _connected = registry.subscribe(AGENT);
    let (mut stage, _) = ended_turn(&registry).await;
    tokio::time::sleep(GRACE + 4 * TICK).await;
    hand_off(&stage, 0).await;
    stage.stop.cancel();
    drop(stage.ingest);
    stage.task.await.unwrap();
    let spans = exported_within(&mut stage.export, TICK).await;
    assert!(
        roots(&spans).is_empty(),
        "the next replica ends it; not exported here: {spans:?}"
    );
}

/// A replicated stage on the persistent queue, restarted: the records up
/// to lsn `replay_end` are the queue's replay; everything exported at once.
fn start_restarted(
    events: &[Event],
    replay_end: u64,
) -> (Stage, Arc<PipelineStats>, mpsc::Receiver<Settle>) {
    let recovered = Recovered {
        replay_end,
        ..Recovered::default()
    };
    let (ledger, settles) = disk_ledger(Arc::new(AtomicU64::new(u64::MAX)), recovered);
    let registry = Arc::new(Settlements::default());
    let mut driver = driver(ledger, events);
    driver.settlement =
        Some(Settlement::new(registry, Box::new(|| u64::MAX)).replicated(TTL.as_secs() * SEC));
    let stats = driver.stats.clone();
    (spawn(driver), stats, settles)
}

#[tokio::test(start_paused = true)]
async fn an_ended_turn_replayed_after_a_restart_waits_for_its_agent() {
    // The queue replays an agent's turn up to its post_llm_call: the
    // replica died before it read the on_session_end, and the agent moved
    // to a replica that ends the turn whole. Closed here at the end grace,
    // it would be a second copy of that root without its end.
    let (events, _) = ended_and_rest();
    let (mut stage, stats, _settles) = start_restarted(&events, events.len() as u64);
    for (lsn, event) in (1..).zip(events) {
        let mut ingested = ingested(AGENT, vec![event]);
        ingested.lsn = lsn;
        stage.ingest.send(ingested).await.unwrap();
    }
    let spans = exported_within(&mut stage.export, TTL + 4 * TICK).await;
    assert!(roots(&spans).is_empty(), "{spans:?}");
    assert_eq!(stats.turns_orphaned.load(Ordering::Relaxed), 1);
    drop(stage.ingest);
    stage.task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn replayed_state_of_an_agent_that_does_not_come_back_is_dropped_at_the_ttl() {
    let events = basic_events();
    let open = open_turn();
    let rest = events[open.len()..].to_vec();
    let n = open.len() as u64;
    let (mut stage, stats, _settles) = start_restarted(&events, 2 * n);
    // The queue replays both agents' open turns (lsn 1..=2n).
    let mut lsn = 0;
    for instance in [AGENT, "agent-2"] {
        for event in open.clone() {
            lsn += 1;
            let mut ingested = ingested(instance, vec![event]);
            ingested.lsn = lsn;
            stage.ingest.send(ingested).await.unwrap();
        }
    }
    // agent-2 comes back and ends its turn; agent-1 went elsewhere.
    for event in rest {
        lsn += 1;
        let mut ingested = ingested("agent-2", vec![event]);
        ingested.lsn = lsn;
        ingested.fleet = true;
        stage.ingest.send(ingested).await.unwrap();
    }
    let spans = exported_within(&mut stage.export, TTL + 4 * TICK).await;
    assert_eq!(
        roots_incomplete(&spans),
        (1, 0),
        "agent-2's turn whole, agent-1's neither exported nor closed: {spans:?}"
    );
    assert_eq!(stats.turns_orphaned.load(Ordering::Relaxed), 1);
    assert_eq!(stats.expired.load(Ordering::Relaxed), 0);
    drop(stage.ingest);
    let ended = stage.task.await.unwrap();
    assert_eq!(ended.open, None, "nothing kept for a next start");
}

#[tokio::test(start_paused = true)]
async fn a_new_stream_rebuilds_what_an_earlier_one_left_open() {
    // A stream broke mid-turn; the agent finished the turn on another
    // replica, which exported and settled it, and comes back here with a
    // new stream that resends only what is still unsettled: nothing of
    // that turn. What this replica held of it must not come out (as an
    // incomplete copy of a root the other replica exported whole).
    let events = basic_events();
    let done = Arc::new(AtomicU64::new(u64::MAX));
    let (mut stage, _, stats) = start_fleet(&events, &done);
    feed_fleet(&stage, open_turn()).await;
    let mut later = events.last().unwrap().clone();
    later.seq += 10;
    let mut ingested = fleet_batch(vec![later.clone()], 0);
    ingested.batch.floor_seq = later.seq;
    ingested.fresh = true;
    stage.ingest.send(ingested).await.unwrap();
    tokio::time::sleep(2 * TICK).await;
    stage.stop.cancel();
    drop(stage.ingest);
    stage.task.await.unwrap();
    let spans = exported_within(&mut stage.export, TICK).await;
    assert!(
        !spans.iter().any(incomplete),
        "the earlier stream's open turn came out cut: {spans:?}"
    );
    assert!(roots(&spans).is_empty(), "{spans:?}");
    assert_eq!(stats.turns_resent.load(Ordering::Relaxed), 1);
}

#[tokio::test(start_paused = true)]
async fn a_turn_closed_before_a_new_stream_settles_only_whole_from_its_resend() {
    // The agent's turn came whole on stream 1 and was exported here, but
    // never settled (the export had not finished when the stream broke);
    // stream 2 resends it from seq 1, in two batches. Settling the first
    // one alone would send the agent's next replica only the turn's tail,
    // and it would build a second, incomplete root from it.
    let events = basic_events();
    let open = open_turn();
    let rest = events[open.len()..].to_vec();
    let last_seq = events.last().unwrap().seq;
    let done = Arc::new(AtomicU64::new(0));
    let (mut stage, settled, _) = start_fleet(&events, &done);
    feed_stream(&stage, 1, events.clone(), true).await;
    let spans = exported_within(&mut stage.export, GRACE + 2 * TICK).await;
    let first = one_root(&spans, "the turn ended").clone();
    assert_eq!(*settled.borrow(), 0, "sent, not exported: nothing settled");

    let mut head = fleet_batch(open, 2);
    head.fresh = true;
    stage.ingest.send(head).await.unwrap();
    // Exported from here on, once the stage took the head (before, it
    // would rightly settle the first stream's events).
    tokio::time::sleep(TICK).await;
    done.store(u64::MAX, Ordering::Relaxed);
    tokio::time::sleep(4 * TICK).await;
    assert_eq!(
        *settled.borrow(),
        0,
        "the head of a turn alone settles nothing"
    );

    stage.ingest.send(fleet_batch(rest, 2)).await.unwrap();
    let spans = exported_within(&mut stage.export, GRACE + 2 * TICK).await;
    let again = one_root(&spans, "the resent turn, rebuilt whole");
    assert_eq!(*again, first, "the same turn, the same span");
    tokio::time::sleep(4 * TICK).await;
    assert_eq!(*settled.borrow(), last_seq);
    drop(stage.ingest);
    stage.task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_handoff_of_an_earlier_stream_leaves_the_newer_one_alone() {
    // The agent left on stream 1 and came straight back on stream 2; the
    // handoff sent on stream 1 reaches the stage after stream 2 started.
    let events = basic_events();
    let open = open_turn();
    let rest = events[open.len()..].to_vec();
    let done = Arc::new(AtomicU64::new(u64::MAX));
    let (mut stage, _, stats) = start_fleet(&events, &done);
    feed_stream(&stage, 1, open.clone(), true).await;
    feed_stream(&stage, 2, open, true).await;
    hand_off(&stage, 1).await;
    feed_stream(&stage, 2, rest, false).await;
    let spans = exported_within(&mut stage.export, GRACE + 2 * TICK).await;
    let root = one_root(&spans, "the turn ended once, whole");
    assert!(!incomplete(root), "{root:?}");
    assert_eq!(stats.turns_handed_off.load(Ordering::Relaxed), 0);
    drop(stage.ingest);
    stage.task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn batches_of_an_earlier_stream_after_a_newer_one_started_are_ignored() {
    // The agent left on stream 1 and came straight back on stream 2, which
    // resends from seq 1; stream 1's last batches, read late by a busy
    // replica, reach the stage after stream 2's first one. Taken, they
    // would be early events ahead of a hole that stream 2 fills only after
    // the gap timeout: the turn would come out without the events between.
    let events = basic_events();
    let open = open_turn();
    let rest = events[open.len()..].to_vec();
    let done = Arc::new(AtomicU64::new(u64::MAX));
    let (mut one_stream, _, _) = start_fleet(&events, &done);
    feed_stream(&one_stream, 1, events.clone(), true).await;
    let spans = exported_within(&mut one_stream.export, GRACE + 2 * TICK).await;
    let whole = one_root(&spans, "the turn from one stream").clone();

    let (mut stage, _, _) = start_fleet(&events, &done);
    feed_stream(&stage, 1, open.clone(), true).await;
    feed_stream(&stage, 2, open[..1].to_vec(), true).await;
    feed_stream(&stage, 1, rest, false).await;
    let gap = Duration::from_nanos(SequencerConfig::default().gap_timeout_nanos);
    tokio::time::sleep(gap + TICK).await;
    feed_stream(&stage, 2, events[1..].to_vec(), false).await;
    let spans = exported_within(&mut stage.export, GRACE + 2 * TICK).await;
    assert_eq!(*one_root(&spans, "the turn, once"), whole);
    drop(stage.ingest);
    stage.task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_fresh_stream_after_a_restart_is_rebuilt_even_below_the_persisted_seqs() {
    // Before the restart this replica held the agent's turn until a
    // handoff dropped it, and the queue deleted its records; the agent
    // comes back and resends the turn, whose seqs the queue once held.
    let events = basic_events();
    let last_seq = events.last().unwrap().seq;
    let recovered = Recovered {
        seqs: [(AGENT.to_owned(), last_seq)].into_iter().collect(),
        ..Recovered::default()
    };
    let (ledger, _settles) = disk_ledger(Arc::new(AtomicU64::new(u64::MAX)), recovered);
    let registry = Arc::new(Settlements::default());
    let mut driver = driver(ledger, &events);
    driver.settlement = Some(Settlement::new(registry, Box::new(|| u64::MAX)));
    let mut stage = spawn(driver);
    for (i, event) in events.into_iter().enumerate() {
        let mut ingested = fleet_batch(vec![event], 1);
        ingested.lsn = i as u64 + 1;
        ingested.fresh = i == 0;
        stage.ingest.send(ingested).await.unwrap();
    }
    let spans = exported_within(&mut stage.export, GRACE + 2 * TICK).await;
    let root = one_root(&spans, "the resent turn, rebuilt");
    assert!(!incomplete(root), "{root:?}");
    drop(stage.ingest);
    stage.task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_closed_turn_is_settled_whole_or_not_at_all() {
    // Three turns of one session in three batches: the first turn closes
    // in the second batch, where the second turn starts and stays open.
    let events = hermes_e2e::ingest::events_of(&hermes_e2e::ingest::fixture_records("multiturn"));
    let nth = |hook: &str, n: usize| events.iter().filter(|e| e.hook == hook).nth(n).unwrap().seq;
    let cuts = [nth("post_tool_call", 0), nth("pre_api_request", 2)];
    let done = Arc::new(AtomicU64::new(u64::MAX));
    let (mut stage, settled, _) = start_fleet(&events, &done);
    let last = events.last().unwrap().seq;
    // Settling the first batch alone would leave the first turn's tail to
    // be sent again after a move, and the next replica would build a
    // second, different root from it.
    for (batch, (roots_exported, settled_seq)) in events
        .chunk_by(|a, b| cuts.iter().all(|&cut| a.seq >= cut || b.seq < cut))
        .zip([(0, 0), (1, 0), (2, last)])
    {
        stage
            .ingest
            .send(fleet_batch(batch.to_vec(), 0))
            .await
            .unwrap();
        let spans = exported_within(&mut stage.export, GRACE + 2 * TICK).await;
        assert_eq!(roots(&spans).len(), roots_exported, "{spans:?}");
        tokio::time::sleep(4 * TICK).await;
        assert_eq!(*settled.borrow(), settled_seq, "after seq {}", batch[0].seq);
    }
    drop(stage.ingest);
    stage.task.await.unwrap();
}
