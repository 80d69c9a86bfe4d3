//! Batches sent (or to be sent) but not yet acknowledged by the collector,
//! and in fleet mode acknowledged but not yet settled.
//!
//! Owns: the ordered buffer of unacknowledged batches and its bounds; with
//! retention on ([`UnackedBuffer::set_retain`], a fleet collector that
//! settles), the acknowledged batches kept until the collector says their
//! events are settled (their spans exported), to send them again to
//! another replica after a move.
//!
//! Invariants:
//! - Batches are kept in creation order, which is ascending seq order.
//! - The batches already written to the current connection form a prefix of
//!   the buffer (`sent` counts it); a new connection resets it to 0 so every
//!   unacknowledged batch is sent again, in order.
//! - Bounded by `max_batches` and `max_bytes` (encoded size): when a new batch
//!   takes the buffer over either bound, the oldest batches are evicted (and
//!   their events reported as evicted) until it fits again, except that the
//!   newest batch is always kept.
//! - An ack counts exactly the batches whose whole seq range it covers,
//!   once; without retention it removes them, with retention they stay
//!   until a `settled_seq` at or above their last seq removes them.
//! - An evicted batch is reported as unacknowledged (lost) or as
//!   acknowledged but unsettled (lost only if a move follows).
//! - [`UnackedBuffer::floor_seq`] (sent with every batch) only grows: every
//!   seq below it is acknowledged or evicted, never sent again.

use std::collections::VecDeque;

use hermes_proto::v1::EventBatch;
use prost::Message;

#[derive(Debug)]
struct Pending {
    batch: EventBatch,
    first_seq: u64,
    last_seq: u64,
    events: u64,
    bytes: usize,
    /// Acknowledged (kept only with retention).
    acked: bool,
}

/// Events evicted to make room for a batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Evicted {
    /// Never acknowledged: lost.
    pub unacked: u64,
    /// Acknowledged but not settled: lost only if a move follows.
    pub unsettled: u64,
}

/// The unacknowledged batches.
#[derive(Debug)]
pub struct UnackedBuffer {
    batches: VecDeque<Pending>,
    sent: usize,
    bytes: usize,
    max_batches: usize,
    max_bytes: usize,
    retain: bool,
}

impl UnackedBuffer {
    /// A buffer of at most `max_batches` batches and `max_bytes` bytes.
    pub fn new(max_batches: usize, max_bytes: usize) -> Self {
        UnackedBuffer {
            batches: VecDeque::new(),
            sent: 0,
            bytes: 0,
            max_batches: max_batches.max(1),
            max_bytes,
            retain: false,
        }
    }

    /// Keeps acknowledged batches until settled (`true`), or lets them go
    /// at the ack (`false`: the ones held now go at once).
    pub fn set_retain(&mut self, retain: bool) {
        self.retain = retain;
        if !retain {
            self.remove_where(|p| p.acked);
        }
    }

    /// Adds a batch (events in ascending seq order); returns the events
    /// evicted to make room.
    pub fn push(&mut self, batch: EventBatch) -> Evicted {
        let first_seq = batch.events.first().map_or(0, |e| e.seq);
        let last_seq = batch.events.last().map_or(0, |e| e.seq);
        let events = batch.events.len() as u64;
        let bytes = batch.encoded_len();
        self.bytes += bytes;
        self.batches.push_back(Pending {
            batch,
            first_seq,
            last_seq,
            events,
            bytes,
            acked: false,
        });
        let mut evicted = Evicted::default();
        while self.batches.len() > 1
            && (self.batches.len() > self.max_batches || self.bytes > self.max_bytes)
        {
            if let Some(old) = self.batches.pop_front() {
                self.bytes -= old.bytes;
                if old.acked {
                    evicted.unsettled += old.events;
                } else {
                    evicted.unacked += old.events;
                }
                self.sent = self.sent.saturating_sub(1);
            }
        }
        evicted
    }

    /// The first batch not yet written to the current connection.
    pub fn next_unsent(&self) -> Option<&EventBatch> {
        self.batches.get(self.sent).map(|p| &p.batch)
    }

    /// Marks the batch returned by [`Self::next_unsent`] as written.
    pub fn mark_next_sent(&mut self) {
        self.sent = (self.sent + 1).min(self.batches.len());
    }

    /// A new connection: every batch must be sent again.
    pub fn mark_all_unsent(&mut self) {
        self.sent = 0;
    }

    /// Whether some batch waits to be written to the current connection.
    pub fn has_unsent(&self) -> bool {
        self.sent < self.batches.len()
    }

    /// Acknowledges the batches inside `[first_seq, last_seq]` (removed,
    /// or kept until settled with retention); returns how many events
    /// they held that were not acknowledged before.
    pub fn ack(&mut self, first_seq: u64, last_seq: u64) -> u64 {
        if first_seq == 0 && last_seq == 0 {
            return 0;
        }
        let mut acked = 0;
        for p in &mut self.batches {
            if p.first_seq >= first_seq && p.last_seq <= last_seq && !p.acked {
                p.acked = true;
                acked += p.events;
            }
        }
        if !self.retain {
            self.remove_where(|p| p.acked);
        }
        acked
    }

    /// Removes the batches whose events are all at or below
    /// `settled_seq`; returns how many events of them were not
    /// acknowledged before (settled implies acknowledged).
    pub fn settle(&mut self, settled_seq: u64) -> u64 {
        let mut acked = 0;
        for p in &mut self.batches {
            if p.last_seq <= settled_seq && !p.acked {
                p.acked = true;
                acked += p.events;
            }
        }
        self.remove_where(|p| p.last_seq <= settled_seq);
        acked
    }

    fn remove_where(&mut self, remove: impl Fn(&Pending) -> bool) {
        let mut index = 0;
        while index < self.batches.len() {
            if remove(&self.batches[index]) {
                if let Some(p) = self.batches.remove(index) {
                    self.bytes -= p.bytes;
                }
                if index < self.sent {
                    self.sent -= 1;
                }
            } else {
                index += 1;
            }
        }
    }

    /// Events held in acknowledged batches (waiting to be settled).
    pub fn acked_events(&self) -> u64 {
        self.batches
            .iter()
            .filter(|p| p.acked)
            .map(|p| p.events)
            .sum()
    }

    /// The first seq of the oldest batch held (0 when empty): every seq
    /// below it was acknowledged or evicted, and will never be sent again.
    pub fn floor_seq(&self) -> u64 {
        self.batches.front().map_or(0, |p| p.first_seq)
    }

    /// Number of batches held.
    pub fn len(&self) -> usize {
        self.batches.len()
    }

    /// Whether no batch is held.
    pub fn is_empty(&self) -> bool {
        self.batches.is_empty()
    }

    /// Events held.
    pub fn events(&self) -> u64 {
        self.batches.iter().map(|p| p.events).sum()
    }

    /// Encoded bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Removes and returns every batch held, oldest first (to spool them).
    pub fn take_all(&mut self) -> Vec<EventBatch> {
        self.sent = 0;
        self.bytes = 0;
        self.batches.drain(..).map(|p| p.batch).collect()
    }

    /// Removes the oldest batch; returns how many events it held (the
    /// spool's replay, which never retains).
    pub fn drop_oldest(&mut self) -> u64 {
        match self.batches.pop_front() {
            Some(p) => {
                self.bytes -= p.bytes;
                self.sent = self.sent.saturating_sub(1);
                p.events
            }
            None => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(seqs: std::ops::RangeInclusive<u64>) -> EventBatch {
        crate::sender::test_batch(None, seqs)
    }

    /// A buffer of at most 10 batches and 1 MiB holding one batch per range
    /// of `seqs`, none sent yet.
    fn holding(seqs: &[std::ops::RangeInclusive<u64>]) -> UnackedBuffer {
        let mut b = UnackedBuffer::new(10, 1 << 20);
        for range in seqs {
            b.push(batch(range.clone()));
        }
        b
    }

    #[test]
    fn send_ack_resend() {
        let mut b = holding(&[1..=3, 4..=5]);
        assert_eq!(b.next_unsent().unwrap().events[0].seq, 1);
        b.mark_next_sent();
        assert_eq!(b.next_unsent().unwrap().events[0].seq, 4);
        b.mark_next_sent();
        assert!(!b.has_unsent());
        assert_eq!(b.ack(1, 3), 3);
        assert_eq!(b.len(), 1);
        assert!(!b.has_unsent());
        // Reconnect: batch 4..=5 goes again.
        b.mark_all_unsent();
        assert_eq!(b.next_unsent().unwrap().events[0].seq, 4);
        assert_eq!(b.ack(4, 5), 2);
        assert!(b.is_empty());
        assert_eq!(b.bytes(), 0);
        assert_eq!(b.ack(4, 5), 0, "acked once");
    }

    #[test]
    fn out_of_order_ack() {
        let mut b = holding(&[1..=2, 3..=4, 5..=6]);
        b.mark_next_sent();
        b.mark_next_sent();
        assert_eq!(b.ack(3, 4), 2);
        assert_eq!(b.len(), 2);
        assert_eq!(b.next_unsent().unwrap().events[0].seq, 5);
    }

    #[test]
    fn evicts_oldest_over_count() {
        let mut b = UnackedBuffer::new(2, 1 << 20);
        assert_eq!(b.push(batch(1..=3)).unacked, 0);
        b.mark_next_sent();
        assert_eq!(b.push(batch(4..=4)).unacked, 0);
        assert_eq!(b.floor_seq(), 1);
        assert_eq!(b.push(batch(5..=6)).unacked, 3);
        assert_eq!(b.len(), 2);
        assert_eq!(b.next_unsent().unwrap().events[0].seq, 4);
        assert_eq!(b.floor_seq(), 4, "evicted seqs are below the floor");
        b.ack(4, 4);
        assert_eq!(b.floor_seq(), 5);
    }

    #[test]
    fn take_all_and_drop_oldest() {
        let mut b = holding(&[1..=2, 3..=5, 6..=6]);
        b.mark_next_sent();
        assert_eq!(b.drop_oldest(), 2);
        assert_eq!(b.floor_seq(), 3);
        assert_eq!(b.next_unsent().unwrap().events[0].seq, 3);
        let all = b.take_all();
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].events[0].seq, 3);
        assert!(b.is_empty());
        assert_eq!(b.bytes(), 0);
        assert!(!b.has_unsent());
        assert_eq!(b.drop_oldest(), 0);
    }

    #[test]
    fn evicts_oldest_over_bytes_but_keeps_newest() {
        let one = batch(1..=10).encoded_len();
        let mut b = UnackedBuffer::new(100, one * 2);
        b.push(batch(1..=10));
        b.push(batch(11..=20));
        assert_eq!(b.push(batch(21..=30)).unacked, 10);
        assert!(b.bytes() <= one * 2 + 16);
        let mut tiny = UnackedBuffer::new(100, 1);
        assert_eq!(tiny.push(batch(1..=10)).unacked, 0, "newest is kept");
        assert_eq!(tiny.push(batch(11..=20)).unacked, 10);
        assert_eq!(tiny.len(), 1);
    }

    #[test]
    fn retention_keeps_acked_batches_until_settled() {
        let mut b = holding(&[1..=3, 4..=5, 6..=9]);
        b.set_retain(true);
        for _ in 0..3 {
            b.mark_next_sent();
        }
        assert_eq!(b.ack(1, 5), 5);
        assert_eq!(b.ack(1, 5), 0, "counted once");
        assert_eq!(b.len(), 3, "kept until settled");
        assert_eq!(b.acked_events(), 5);
        assert_eq!(b.ack(0, 0), 0, "a settlement-only ack acknowledges nothing");
        // Settled up to 4: only the batch wholly at or below goes.
        assert_eq!(b.settle(4), 0);
        assert_eq!(b.floor_seq(), 4);
        assert_eq!(b.len(), 2);
        // A move: everything unsettled goes again, the lowest first.
        b.mark_all_unsent();
        assert_eq!(b.next_unsent().unwrap().events[0].seq, 4);
        // Settled past an unacknowledged batch: counted as acknowledged.
        assert_eq!(b.settle(9), 4);
        assert!(b.is_empty());
        assert_eq!(b.bytes(), 0);
    }

    #[test]
    fn evicting_an_unsettled_batch_is_counted_apart() {
        let mut b = UnackedBuffer::new(2, 1 << 20);
        b.set_retain(true);
        b.push(batch(1..=3));
        b.push(batch(4..=4));
        b.ack(1, 3);
        assert_eq!(
            b.push(batch(5..=6)),
            Evicted {
                unacked: 0,
                unsettled: 3
            }
        );
        assert_eq!(b.floor_seq(), 4, "the floor moves past it");
        assert_eq!(
            b.push(batch(7..=7)),
            Evicted {
                unacked: 1,
                unsettled: 0
            }
        );
    }

    #[test]
    fn retention_off_lets_the_acked_batches_go() {
        let mut b = holding(&[1..=2, 3..=4]);
        b.set_retain(true);
        b.ack(1, 2);
        assert_eq!(b.len(), 2);
        b.set_retain(false);
        assert_eq!(b.len(), 1);
        assert_eq!(b.floor_seq(), 3);
        assert_eq!(b.ack(3, 4), 2);
        assert!(b.is_empty());
    }
}
