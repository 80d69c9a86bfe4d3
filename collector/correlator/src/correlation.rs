//! [`Correlation`]: the sequencer and the correlator as one unit, the way
//! every driver runs them (the collector's stage, the fuzz target, benches,
//! replay tests and the load generator): a batch is put in capture order,
//! the events it releases are correlated, and finished spans come out.
//!
//! Like its parts it does no I/O and reads no clock: the caller passes the
//! wall-clock time of each call.

use hermes_proto::v1::{Event, ShimInfo};
use hermes_proto::view::{Source, WireEvent};
use hermes_proto::wire::WireBatch;

use crate::sequencer::{Released, Sequencer};
use crate::{Correlator, Expiry, FinishedSpan};

/// The sequencer feeding the correlator, with events of type `E`: the
/// collector's stage sequences each event as the bytes it came in
/// ([`hermes_proto::view::WireEvent`]) and decodes it when it is
/// correlated; tests and tools pass prost's [`Event`]s.
pub struct Correlation<E = Event> {
    sequencer: Sequencer<E>,
    correlator: Correlator,
    /// Events the sequencer released, until the correlator takes them.
    ready: Released<E>,
}

impl<E: Source> Correlation<E> {
    /// Joins a sequencer and a correlator.
    pub fn new(sequencer: Sequencer<E>, correlator: Correlator) -> Self {
        Self {
            sequencer,
            correlator,
            ready: Released::default(),
        }
    }

    /// The sessions ended since the last call ([`Correlator::take_session_ends`]).
    pub fn take_session_ends(&mut self) -> Vec<crate::SessionEnded> {
        self.correlator.take_session_ends()
    }

    /// Takes the events of one batch of `shim` (acknowledged below
    /// `floor_seq` at the shim, stored at `lsn` in the persistent queue, 0
    /// without one) at wall-clock `now`, and correlates what is in capture
    /// order; finished spans are appended to `out`.
    pub fn push_batch(
        &mut self,
        shim: &ShimInfo,
        floor_seq: u64,
        events: impl IntoIterator<Item = E>,
        lsn: u64,
        now: u64,
        out: &mut Vec<FinishedSpan>,
    ) {
        self.correlator.saw_lsn(lsn);
        self.sequencer
            .push_batch(shim, floor_seq, events, lsn, now, &mut self.ready);
        self.correlate(out);
    }

    /// See [`Correlator::set_movable`].
    pub fn set_movable(&mut self, movable: std::sync::Arc<std::collections::HashSet<String>>) {
        self.correlator.set_movable(movable);
    }

    /// The timers at wall-clock `now`: holes older than the gap timeout are
    /// skipped, turns past their TTL closed.
    pub fn tick(&mut self, now: u64, out: &mut Vec<FinishedSpan>) {
        self.sequencer.expire(now, &mut self.ready);
        self.correlator.expire(now, out);
        self.correlate(out);
    }

    /// Before a batch that arrives while the timer slept: sets the
    /// correlator's clock to `now` and closes only what is due, so the batch
    /// never meets state its TTL should have closed.
    pub fn catch_up(&mut self, now: u64, out: &mut Vec<FinishedSpan>) {
        self.correlator.expire(now, out);
    }

    /// At shutdown: releases everything held, whatever the holes, and
    /// closes everything open.
    pub fn flush_all(&mut self, out: &mut Vec<FinishedSpan>) {
        self.sequencer.flush_all(&mut self.ready);
        self.correlate(out);
        self.correlator.flush_all(out);
    }

    /// When the timers next have something to do: every tick while events
    /// are held or anything is open.
    pub fn expiry(&self) -> Expiry {
        match self.correlator.expiry() {
            Expiry::EveryTick => Expiry::EveryTick,
            _ if self.sequencer.held() > 0 => Expiry::EveryTick,
            expiry => expiry,
        }
    }

    /// The lowest persistent-queue lsn that held events or open state still
    /// need, if any.
    pub fn min_open_lsn(&self) -> Option<u64> {
        [self.sequencer.min_held_lsn(), self.correlator.min_lsn()]
            .into_iter()
            .flatten()
            .min()
    }

    /// For every instance with held events or open state, the lowest lsn
    /// they need.
    pub fn min_open_lsn_by_instance(&self) -> std::collections::HashMap<&str, u64> {
        let mut lsns = std::collections::HashMap::new();
        self.sequencer.min_held_lsn_by_instance(&mut lsns);
        self.correlator.min_lsn_by_instance(&mut lsns);
        lsns
    }

    /// Forgets `instance`'s held events and open state without exporting
    /// anything (it moved to another collector of its fleet, which gets the
    /// same events, or replayed them there); the number of open turns
    /// forgotten.
    pub fn drop_instance(&mut self, instance: &str, why: crate::Departure) -> usize {
        self.sequencer.forget(instance);
        self.correlator.drop_instance(instance, why)
    }

    /// Closes, as incomplete, open state that needs records below `lsn`.
    pub fn evict_below_lsn(&mut self, lsn: u64, out: &mut Vec<FinishedSpan>) {
        self.correlator.evict_below_lsn(lsn, out);
    }

    /// Records closed units for a fleet replica's settlement
    /// ([`Correlator::record_closures`]).
    pub fn record_closures(&mut self) {
        self.correlator.record_closures();
    }

    /// The closures recorded since the last call ([`Correlator::take_closures`]).
    pub fn take_closures(&mut self) -> Vec<(hermes_span::Str, crate::Closure)> {
        self.correlator.take_closures()
    }

    /// The sequencer (its counters and held events).
    pub fn sequencer(&self) -> &Sequencer<E> {
        &self.sequencer
    }

    /// The correlator (its counters and gauges).
    pub fn correlator(&self) -> &Correlator {
        &self.correlator
    }

    /// Hands the released events to the correlator, each with the lsn of
    /// the batch it came in.
    fn correlate(&mut self, out: &mut Vec<FinishedSpan>) {
        if let Some(lsn) = self.sequencer.take_released_lsn() {
            self.correlator.set_lsn(lsn);
        }
        let correlator = &mut self.correlator;
        self.ready
            .drain(|shim, event| correlator.ingest(shim, &event, out));
    }
}

impl Correlation<WireEvent> {
    /// [`Self::push_batch`] for a batch as it came on the wire. A batch
    /// whose events are the next ones of their instance, in order and
    /// without a gap (nearly every batch), is correlated straight from its
    /// views: no event handle is made, each a reference to the batch (an
    /// atomic count taken and dropped per event).
    pub fn push_wire_batch(
        &mut self,
        shim: &ShimInfo,
        floor_seq: u64,
        batch: &WireBatch,
        lsn: u64,
        now: u64,
        out: &mut Vec<FinishedSpan>,
    ) {
        let taken = batch.run().is_some_and(|seqs| {
            self.sequencer
                .take_run(shim, floor_seq, seqs, lsn, now, &mut self.ready)
        });
        if !taken {
            self.push_batch(shim, floor_seq, batch.wire_events(), lsn, now, out);
            return;
        }
        self.correlator.saw_lsn(lsn);
        self.correlate(out);
        for event in batch.views() {
            self.correlator.ingest_view(shim, event, out);
        }
    }
}
