//! What the persistent queue may delete, and what a restart must not export
//! again: the [`Ledger`] owns the log sequence numbers (lsns) of the
//! correlation stage, so that neither the correlator nor the exporters know
//! about the queue.
//!
//! - [`Ledger::Memory`]: events live in memory only; nothing to record, and
//!   at the end of the stage everything open is closed and exported.
//! - [`Ledger::Disk`] ([`DiskLedger`]): every export message remembers a
//!   lower bound of the lsns it was built from; once the exporter stage has
//!   finished a message (its `done_through`), its span keys become export
//!   markers, and the watermark, the lowest lsn that open state, held
//!   events or unfinished messages still need, is sent to the queue writer
//!   as a [`Settle`]. After a restart, replayed spans whose keys have a
//!   marker are not exported again, and what was open stays open: its
//!   records are replayed at the next start, so a turn that spans a restart
//!   is exported once, whole.
//!
//! The correlator only tags each open unit with the lowest lsn it was
//! built from (`Correlation::min_open_lsn`), which the ledger reads as
//! `open`.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use hermes_correlator::FinishedSpan;
use hermes_queue::{SPAN_KEY_BYTES, SpanKey};
use hermes_span::trace::v1::{ResourceSpans, Span};
use tokio::sync::mpsc;

use crate::writer::{QueueStats, Recovered, Settle};

/// Where the correlation stage's input is kept until its spans are
/// exported; see the module docs.
pub enum Ledger {
    Memory,
    Disk(Box<DiskLedger>),
}

/// How far the exporter stage got: every span of export messages
/// `1..=done()` is finished at every sink.
pub type Done = Box<dyn Fn() -> u64 + Send>;

/// The persistent queue's side of the correlation stage.
pub struct Durable {
    /// To the queue writer.
    pub settle: mpsc::Sender<Settle>,
    /// Which export messages are finished (the exporter's `done_through`).
    pub done: Done,
    pub recovered: Recovered,
    /// The queue's fill level.
    pub queue: Arc<QueueStats>,
}

impl Ledger {
    /// A ledger for the persistent queue.
    pub fn disk(durable: Durable) -> Self {
        Self::Disk(Box::new(DiskLedger::new(durable)))
    }

    /// Whether open state outlives the stage (its records are replayed at
    /// the next start) instead of being closed at its end.
    pub fn keeps_open_state(&self) -> bool {
        matches!(self, Self::Disk(_))
    }

    /// The `floor_seq` for a batch of `instance` at `lsn`; see
    /// [`DiskLedger::floor`].
    pub fn floor(&mut self, instance: &str, lsn: u64, floor_seq: u64) -> u64 {
        match self {
            Self::Memory => floor_seq,
            Self::Disk(disk) => disk.floor(instance, lsn, floor_seq),
        }
    }

    /// Whether the batch at `lsn` is one the persistent queue replayed at
    /// the start.
    pub fn is_replayed(&self, lsn: u64) -> bool {
        match self {
            Self::Memory => false,
            Self::Disk(disk) => lsn <= disk.durable.recovered.replay_end,
        }
    }

    /// Drops spans a backend already has (replayed after a restart).
    pub fn suppress_exported(&mut self, spans: &mut Vec<FinishedSpan>) {
        if let Self::Disk(disk) = self {
            disk.suppress_exported(spans);
        }
    }

    /// The position below which open state must be closed to make room in
    /// the queue, if it must; see [`DiskLedger::pressure`].
    pub fn pressure(&self, open: Option<u64>) -> Option<u64> {
        match self {
            Self::Memory => None,
            Self::Disk(disk) => disk.pressure(open),
        }
    }

    /// A lower bound of the lsns of the events any span finished from now
    /// on was built from: the watermark of the last settle (0 in memory).
    /// What the sampler holds keeps it, so that the queue keeps its records.
    pub fn low_water(&self) -> u64 {
        match self {
            Self::Memory => 0,
            Self::Disk(disk) => disk.watermark,
        }
    }

    /// Records an export message about to be sent.
    pub fn sending(&mut self, batch: &[ResourceSpans]) {
        if let Self::Disk(disk) = self {
            disk.sending(batch);
        }
    }

    /// Whether a settle would say nothing new (the stage may sleep).
    pub fn is_settled(&self, open: Option<u64>) -> bool {
        match self {
            Self::Memory => true,
            Self::Disk(disk) => disk.is_settled(open),
        }
    }

    /// Hands what is settled to the writer when it has room; never blocks.
    pub fn settle(&mut self, open: Option<u64>) {
        if let Self::Disk(disk) = self {
            disk.settle(open);
        }
    }

    /// After the exporter stage ended: the final settle, waiting for room.
    pub async fn finish(self, open: Option<u64>) {
        if let Self::Disk(mut disk) = self
            && let Some(settle) = disk.prepare(open)
        {
            let _ = disk.durable.settle.send(settle).await;
        }
    }
}

/// One export message not finished yet.
struct Pending {
    /// Its number at the exporter stage (1, 2, 3, ...).
    index: u64,
    /// No event it was built from has a lower lsn.
    first_lsn: u64,
    /// No event it was built from has a higher lsn.
    last_lsn: u64,
    /// Span keys, [`SPAN_KEY_BYTES`] each.
    keys: Vec<u8>,
}

/// The ledger of the persistent queue; see the module docs.
pub struct DiskLedger {
    durable: Durable,
    /// Messages sent to the exporter stage.
    sent: u64,
    pending: VecDeque<Pending>,
    /// Highest lsn ingested.
    last_lsn: u64,
    /// Lowest lsn open state or held events needed at the last tick.
    watermark: u64,
    /// Markers of finished messages not yet handed to the writer.
    markers: Vec<(u64, Vec<u8>)>,
    /// Watermark last handed to the writer.
    settled: u64,
}

impl DiskLedger {
    fn new(durable: Durable) -> Self {
        Self {
            durable,
            sent: 0,
            pending: VecDeque::new(),
            last_lsn: 0,
            watermark: 0,
            markers: Vec::new(),
            settled: 0,
        }
    }

    /// The `floor_seq` for a batch of `instance` at `lsn`. The first batch
    /// an instance sends after a restart, when none of its records was
    /// replayed, gets a floor above every seq it ever had persisted: a
    /// batch it resends because the acknowledgement was lost with the
    /// process is a duplicate, even when its records are gone.
    fn floor(&mut self, instance: &str, lsn: u64, floor_seq: u64) -> u64 {
        self.last_lsn = self.last_lsn.max(lsn);
        let seqs = &mut self.durable.recovered.seqs;
        if seqs.is_empty() {
            return floor_seq;
        }
        match seqs.remove(instance) {
            // A replayed record: the replay rebuilds the sequencer's state.
            Some(_) if lsn <= self.durable.recovered.replay_end => floor_seq,
            Some(persisted) => floor_seq.max(persisted + 1),
            None => floor_seq,
        }
    }

    fn suppress_exported(&mut self, spans: &mut Vec<FinishedSpan>) {
        let exported = &mut self.durable.recovered.exported;
        if exported.is_empty() {
            return;
        }
        spans.retain(|f| !exported.contains(&key_of(&f.span)));
        if self.settled > self.durable.recovered.replay_end {
            // Every replayed record is settled: no replayed span comes back.
            *exported = HashSet::new();
        }
    }

    /// With the queue 90 % full because of open state (`open`, its lowest
    /// position, holds the watermark back, not unexported spans), the
    /// position below which open state is closed as incomplete so that its
    /// records can go: the older half of what it pins. Without it a turn
    /// that never ends would keep the queue full until its TTL, and the
    /// queue would stop taking the very events that could end it. A backend
    /// that is down fills the queue with unexported spans instead: nothing
    /// is closed for that, the shims buffer.
    fn pressure(&self, open: Option<u64>) -> Option<u64> {
        let bytes = self.durable.queue.bytes.load(Ordering::Relaxed);
        let capacity = self.durable.queue.capacity_bytes.load(Ordering::Relaxed);
        let open = open?;
        let unexported = self.pending.front().map_or(u64::MAX, |p| p.first_lsn);
        if bytes.saturating_mul(10) < capacity.saturating_mul(9)
            || open > unexported
            || open >= self.last_lsn
        {
            return None;
        }
        Some(open + (self.last_lsn - open) / 2 + 1)
    }

    fn sending(&mut self, batch: &[ResourceSpans]) {
        self.sent += 1;
        let keys: Vec<u8> = batch
            .iter()
            .flat_map(|rs| rs.scope_spans.iter())
            .flat_map(|ss| ss.spans.iter())
            .flat_map(key_of)
            .collect();
        self.pending.push_back(Pending {
            index: self.sent,
            first_lsn: self.watermark,
            last_lsn: self.last_lsn,
            keys,
        });
    }

    /// Moves finished messages to markers and computes the watermark from
    /// `open` (the lowest lsn open state and held events need); the settle
    /// to hand to the writer, if there is anything to say.
    fn prepare(&mut self, open: Option<u64>) -> Option<Settle> {
        let done = (self.durable.done)();
        while self.pending.front().is_some_and(|p| p.index <= done) {
            if let Some(p) = self.pending.pop_front() {
                self.markers.push((p.last_lsn, p.keys));
            }
        }
        let next = self.last_lsn + 1;
        let unfinished = self.pending.front().map(|p| p.first_lsn);
        // `first_lsn` of the messages sent before the next tick.
        self.watermark = open.unwrap_or(next).min(next);
        let below = unfinished.map_or(self.watermark, |u| u.min(self.watermark));
        if below <= self.settled && self.markers.is_empty() {
            return None;
        }
        Some(Settle {
            exported: std::mem::take(&mut self.markers),
            below,
        })
    }

    /// Whether a settle would say nothing new: every message sent is
    /// finished and handed over, and the watermark is as far as `open` (as
    /// in [`DiskLedger::prepare`]) lets it go.
    fn is_settled(&self, open: Option<u64>) -> bool {
        let next = self.last_lsn + 1;
        self.pending.is_empty()
            && self.markers.is_empty()
            && self.settled >= open.unwrap_or(next).min(next)
    }

    fn settle(&mut self, open: Option<u64>) {
        let Some(settle) = self.prepare(open) else {
            return;
        };
        let below = settle.below;
        match self.durable.settle.try_send(settle) {
            Ok(()) => self.settled = self.settled.max(below),
            Err(
                mpsc::error::TrySendError::Full(settle) | mpsc::error::TrySendError::Closed(settle),
            ) => self.markers = settle.exported,
        }
    }
}

/// The queue's key of a span: its trace id, then its span id.
pub fn key_of(span: &Span) -> SpanKey {
    let mut key = [0u8; SPAN_KEY_BYTES];
    let trace = span.trace_id.len().min(16);
    key[..trace].copy_from_slice(&span.trace_id[..trace]);
    let id = span.span_id.len().min(8);
    key[16..16 + id].copy_from_slice(&span.span_id[..id]);
    key
}

#[cfg(test)]
#[path = "ledger_tests.rs"]
mod tests;
