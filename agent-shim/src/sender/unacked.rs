//! Batches sent (or to be sent) but not yet acknowledged by the collector.
//!
//! Owns: the ordered buffer of unacknowledged batches and its bounds.
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
//! - An ack removes exactly the batches whose whole seq range it covers, once.
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
}

/// The unacknowledged batches.
#[derive(Debug)]
pub struct UnackedBuffer {
    batches: VecDeque<Pending>,
    sent: usize,
    bytes: usize,
    max_batches: usize,
    max_bytes: usize,
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
        }
    }

    /// Adds a batch (events in ascending seq order); returns the number of
    /// events evicted to make room.
    pub fn push(&mut self, batch: EventBatch) -> u64 {
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
        });
        let mut evicted = 0;
        while self.batches.len() > 1
            && (self.batches.len() > self.max_batches || self.bytes > self.max_bytes)
        {
            if let Some(old) = self.batches.pop_front() {
                self.bytes -= old.bytes;
                evicted += old.events;
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

    /// Removes the batches inside `[first_seq, last_seq]`; returns how many
    /// events they held.
    pub fn ack(&mut self, first_seq: u64, last_seq: u64) -> u64 {
        let mut acked = 0;
        let mut index = 0;
        while index < self.batches.len() {
            let p = &self.batches[index];
            if p.first_seq >= first_seq && p.last_seq <= last_seq {
                if let Some(p) = self.batches.remove(index) {
                    self.bytes -= p.bytes;
                    acked += p.events;
                }
                if index < self.sent {
                    self.sent -= 1;
                }
            } else {
                index += 1;
            }
        }
        acked
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

    /// Removes the oldest batch; returns how many events it held.
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
        assert_eq!(b.push(batch(1..=3)), 0);
        b.mark_next_sent();
        assert_eq!(b.push(batch(4..=4)), 0);
        assert_eq!(b.floor_seq(), 1);
        assert_eq!(b.push(batch(5..=6)), 3);
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
        assert_eq!(b.push(batch(21..=30)), 10);
        assert!(b.bytes() <= one * 2 + 16);
        let mut tiny = UnackedBuffer::new(100, 1);
        assert_eq!(tiny.push(batch(1..=10)), 0, "newest is kept");
        assert_eq!(tiny.push(batch(11..=20)), 10);
        assert_eq!(tiny.len(), 1);
    }
}
