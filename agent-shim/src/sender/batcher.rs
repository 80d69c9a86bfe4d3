//! The state of the sender that outlives one run of its loop.
//!
//! Owns: [`Parts`], what a restarted sender takes over from the one that
//! died (the queue's consumer side, the converter, the stream's numbering
//! and API attempts, the unacknowledged batches and the items taken but not
//! yet cut), and [`Batcher`], which turns queued items into numbered
//! batches.
//!
//! Invariants: the stream seq keeps counting across restarts (the
//! collector never sees a seq twice); every item taken from the queue is,
//! at any point between two calls, in `buf`, in an unacknowledged batch, or
//! counted in [`SenderShared::settled_events`], so what a death loses is
//! `taken - settled - held` ([`Parts::held_events`]).

use std::sync::atomic::Ordering;

use hermes_proto::v1::{EventBatch, ShimInfo};

use super::spool::{self, SpoolConfig};
use super::unacked::UnackedBuffer;
use super::{Convert, SenderConfig, SenderShared};
use crate::attempts::AttemptTracker;
use crate::queue::{QueueCounters, QueueRx};

/// What one run of the sender loop works on.
pub(crate) struct Parts<C: Convert> {
    pub(crate) rx: QueueRx<C::Item>,
    pub(crate) batcher: Batcher<C>,
    pub(crate) pending: UnackedBuffer,
    /// Items taken from the queue, not yet cut into a batch.
    pub(crate) buf: Vec<C::Item>,
}

impl<C: Convert> Parts<C> {
    /// The state of a sender that has sent nothing yet.
    pub(crate) fn new(rx: QueueRx<C::Item>, converter: C, config: &SenderConfig) -> Self {
        Parts {
            rx,
            batcher: Batcher {
                converter,
                attempts: AttemptTracker::default(),
                shim: config.shim.clone(),
                next_seq: 1,
            },
            pending: UnackedBuffer::new(config.max_unacked_batches, config.max_unacked_bytes),
            buf: Vec::with_capacity(config.max_batch_events.max(1)),
        }
    }

    /// Events held: in unacknowledged batches or taken and not yet cut.
    pub(crate) fn held_events(&self) -> u64 {
        self.pending.events() + self.buf.len() as u64
    }
}

/// The batch cutter: converts items and files the batch as unacknowledged.
pub(crate) struct Batcher<C> {
    pub(crate) converter: C,
    attempts: AttemptTracker,
    shim: ShimInfo,
    /// The stream seq of the next event (from 1).
    next_seq: u64,
}

impl<C: Convert> Batcher<C> {
    /// Cuts every item in `buf` and (at most as many as were queued when it
    /// started) in `rx` into batches, then writes everything `pending` holds
    /// to the spool (without a spool: nothing happens).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn spool_all(
        &mut self,
        rx: &mut QueueRx<C::Item>,
        buf: &mut Vec<C::Item>,
        pending: &mut UnackedBuffer,
        shared: &SenderShared,
        queue: &QueueCounters,
        spool: Option<&SpoolConfig>,
        max_batch: usize,
    ) {
        let Some(spool) = spool else {
            return;
        };
        // Bounded: events captured meanwhile wait for the next round.
        let mut budget = rx.len();
        loop {
            let room = max_batch.saturating_sub(buf.len()).min(budget);
            budget -= rx.drain_into(buf, room);
            if buf.is_empty() {
                break;
            }
            let items = std::mem::replace(buf, Vec::with_capacity(max_batch));
            self.cut(items, pending, shared, queue);
        }
        let batches = pending.take_all();
        let events: u64 = batches.iter().map(|b| b.events.len() as u64).sum();
        if events == 0 {
            return;
        }
        match spool::write(spool, &self.shim.instance_id, batches, max_batch) {
            Ok(written) => {
                shared
                    .spooled_events
                    .fetch_add(written.events, Ordering::AcqRel);
                shared
                    .spool_dropped_events
                    .fetch_add(written.dropped_events, Ordering::AcqRel);
            }
            Err(e) => {
                shared
                    .spool_dropped_events
                    .fetch_add(events, Ordering::AcqRel);
                shared.set_error(&format_args!("spool: {e}"));
            }
        }
    }

    pub(crate) fn cut(
        &mut self,
        items: Vec<C::Item>,
        pending: &mut UnackedBuffer,
        shared: &SenderShared,
        queue: &QueueCounters,
    ) {
        let taken = items.len() as u64;
        let mut events = self.converter.convert(items);
        let converted = events.len() as u64;
        if converted < taken {
            shared.add_discarded(taken - converted);
        }
        if events.is_empty() {
            return;
        }
        // Capture order, then the stream's own numbering: 1, 2, 3, ... with
        // no hole for events dropped or discarded before this point, so the
        // collector can tell a missing event from a dropped one.
        events.sort_by_key(|e| e.seq);
        for event in &mut events {
            event.seq = self.next_seq;
            self.next_seq += 1;
            self.attempts.stamp(event);
        }
        let batch = EventBatch {
            shim: Some(self.shim.clone()),
            events,
            // Everything lost before this batch: dropped by the queue,
            // evicted from the full buffer, lost with a dying sender.
            dropped_events: queue.dropped()
                + shared.evicted_events.load(Ordering::Acquire)
                + shared.lost_events.load(Ordering::Acquire),
            // Set when sent (the floor moves with acks and evictions).
            floor_seq: 0,
            ..Default::default()
        };
        let evicted = pending.push(batch);
        if evicted > 0 {
            shared.evicted_events.fetch_add(evicted, Ordering::AcqRel);
        }
    }
}
