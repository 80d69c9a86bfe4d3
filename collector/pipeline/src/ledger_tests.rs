#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;

use hermes_span::resource::v1::Resource;
use hermes_span::trace::v1::ScopeSpans;

use super::*;

fn span(id: u8) -> Span {
    Span {
        trace_id: [7; 16].into(),
        span_id: [id; 8].into(),
        ..Default::default()
    }
}

fn batch(ids: &[u8]) -> Vec<ResourceSpans> {
    vec![ResourceSpans {
        scope_spans: vec![ScopeSpans {
            spans: ids.iter().map(|&id| span(id)).collect(),
            ..Default::default()
        }],
        ..Default::default()
    }]
}

struct Fixture {
    ledger: Ledger,
    settles: mpsc::Receiver<Settle>,
    done: Arc<AtomicU64>,
    queue: Arc<QueueStats>,
}

fn disk(recovered: Recovered, room: usize) -> Fixture {
    let (settle, settles) = mpsc::channel(room);
    let done = Arc::new(AtomicU64::new(0));
    let queue = Arc::new(QueueStats::default());
    let ledger = Ledger::disk(Durable {
        settle,
        done: {
            let done = done.clone();
            Box::new(move || done.load(Ordering::Relaxed))
        },
        recovered,
        queue: queue.clone(),
    });
    Fixture {
        ledger,
        settles,
        done,
        queue,
    }
}

#[test]
fn memory_keeps_nothing_and_is_always_settled() {
    let mut ledger = Ledger::Memory;
    assert_eq!(ledger.floor("a", 0, 5), 5);
    ledger.sending(&batch(&[1]));
    assert!(ledger.is_settled(Some(1)));
    assert_eq!(ledger.pressure(Some(1)), None);
    assert!(!ledger.keeps_open_state());
}

#[test]
fn markers_and_the_watermark_wait_for_the_exporters() {
    let mut f = disk(Recovered::default(), 4);
    for lsn in 1..=10 {
        f.ledger.floor("a", lsn, 0);
    }
    // A turn from lsn 4 is still open; one message sent.
    f.ledger.settle(Some(4));
    assert_eq!(f.settles.try_recv().unwrap().below, 4);
    f.ledger.sending(&batch(&[1, 2]));
    assert!(!f.ledger.is_settled(Some(4)));
    f.ledger.settle(None);
    assert!(
        f.settles.try_recv().is_err(),
        "the unfinished message pins its records: nothing new to settle"
    );
    f.done.store(1, Ordering::Relaxed);
    f.ledger.settle(None);
    let settle = f.settles.try_recv().unwrap();
    assert_eq!(settle.below, 11);
    assert_eq!(settle.exported.len(), 1);
    assert_eq!(
        settle.exported[0].0, 10,
        "marked with the last lsn it was built from"
    );
    assert_eq!(
        settle.exported[0].1,
        [key_of(&span(1)), key_of(&span(2))].concat()
    );
    assert!(f.ledger.is_settled(None));
}

#[test]
fn a_full_writer_channel_keeps_the_markers_for_the_next_settle() {
    let mut f = disk(Recovered::default(), 1);
    f.ledger.floor("a", 3, 0);
    f.ledger.settle(Some(2)); // fills the channel
    f.ledger.sending(&batch(&[9]));
    f.done.store(1, Ordering::Relaxed);
    f.ledger.settle(None); // no room: kept
    assert_eq!(f.settles.try_recv().unwrap().below, 2);
    assert!(f.settles.try_recv().is_err());
    f.ledger.settle(None);
    let settle = f.settles.try_recv().unwrap();
    assert_eq!(settle.exported.len(), 1, "the markers were not lost");
    assert_eq!(settle.below, 4);
}

#[test]
fn after_a_restart_a_resent_batch_is_a_duplicate_and_exported_spans_stay_out() {
    let recovered = Recovered {
        exported: [key_of(&span(1))].into_iter().collect(),
        replay_end: 5,
        seqs: HashMap::from([("a".to_owned(), 40), ("b".to_owned(), 7)]),
    };
    let mut f = disk(recovered, 4);
    // Replayed record of `b`: the replay rebuilds its state.
    assert_eq!(f.ledger.floor("b", 3, 1), 1);
    // A batch of `a` after the replay: above every seq it had persisted.
    assert_eq!(f.ledger.floor("a", 6, 10), 41);
    let resource = Arc::new(Resource::default());
    let mut spans: Vec<FinishedSpan> = [1, 2]
        .into_iter()
        .map(|id| FinishedSpan {
            resource: resource.clone(),
            span: span(id),
        })
        .collect();
    f.ledger.suppress_exported(&mut spans);
    assert_eq!(spans.len(), 1);
    assert_eq!(spans[0].span.span_id, vec![2; 8]);
}

#[test]
fn open_state_is_closed_only_when_it_fills_the_queue() {
    let mut f = disk(Recovered::default(), 4);
    f.queue.capacity_bytes.store(1000, Ordering::Relaxed);
    for lsn in 1..=100 {
        f.ledger.floor("a", lsn, 0);
    }
    f.queue.bytes.store(899, Ordering::Relaxed);
    assert_eq!(f.ledger.pressure(Some(10)), None, "below 90 %");
    f.queue.bytes.store(900, Ordering::Relaxed);
    assert_eq!(
        f.ledger.pressure(Some(10)),
        Some(56),
        "the older half of what it pins"
    );
    assert_eq!(f.ledger.pressure(None), None, "nothing open");
    // Unexported spans older than the open state: a backend is down, and
    // closing turns would not free the queue.
    f.ledger.settle(Some(5));
    f.ledger.sending(&batch(&[1]));
    assert_eq!(f.ledger.pressure(Some(10)), None);
}
