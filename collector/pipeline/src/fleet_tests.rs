//! Stage tests of fleet mode: settlement of a fleet shim's events, and a
//! handoff, on the memory queue (the stage numbers the batches).

use hermes_receiver::Settlements;
use tokio::sync::watch;

use super::*;
use crate::settle::Settlement;

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

/// Sends each event as a batch of its own from a fleet stream, without
/// an lsn (the memory queue).
async fn feed_fleet(stage: &Stage, events: Vec<Event>) {
    for event in events {
        let mut ingested = Ingested::new(batch_of(AGENT, vec![event]));
        ingested.fleet = true;
        stage.ingest.send(ingested).await.unwrap();
    }
}

/// The handoff batch of [`AGENT`].
async fn hand_off(stage: &Stage) {
    let mut batch = batch_of(AGENT, Vec::new());
    batch.handoff = true;
    let mut ingested = Ingested::new(batch);
    ingested.fleet = true;
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
    hand_off(&stage).await;
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
    hand_off(&stage).await;
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
