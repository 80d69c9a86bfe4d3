//! Restores each shim's capture order and drops redeliveries, before the
//! correlator.
//!
//! A shim numbers the events it sends 1, 2, 3, ... without holes (a dropped
//! event never gets a number), so the sequencer knows exactly which event
//! comes next from every instance: it releases events in seq order, holds
//! the ones that arrive early, and drops every seq already released or held
//! (a redelivery after a reconnect). The correlator therefore sees the same
//! sequence of events whatever order and however often they arrived, which
//! makes its output independent of arrival order and delivery count.
//!
//! Batches carry `floor_seq`: every seq below it is acknowledged or lost for
//! good at the shim, so the sequencer never waits for it.
//!
//! Bounded: at most `max_held` events held per instance and `max_instances`
//! instances. A hole that is still open after `gap_timeout_nanos` (or when
//! the hold is full) is skipped: the held events are released in order and
//! the skipped seqs counted. The least recently active instance is forgotten
//! past `max_instances` (its held events are released first).
//!
//! Positions: with the persistent queue each event comes with the `lsn` of
//! the record it arrived in ([`Sequencer::push_batch`]). The sequencer tells
//! the lowest lsn among the events it still holds ([`Sequencer::min_held_lsn`])
//! and among the events it released since the last ask
//! ([`Sequencer::take_released_lsn`]): what the queue must keep for them.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::sync::Arc;

use hermes_proto::v1::{Event, ShimInfo};
use hermes_proto::view::Source;

use crate::{Map, sorted_keys};

/// Limits of the sequencer.
#[derive(Debug, Clone)]
pub struct SequencerConfig {
    /// Events held per instance while waiting for a missing seq.
    pub max_held: usize,
    /// Instances tracked.
    pub max_instances: usize,
    /// How long a hole may stay open before it is skipped.
    pub gap_timeout_nanos: u64,
}

impl Default for SequencerConfig {
    fn default() -> Self {
        Self {
            max_held: 100_000,
            max_instances: 65_536,
            gap_timeout_nanos: 5_000_000_000,
        }
    }
}

/// Counters of the sequencer; all monotonic.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SequencerStats {
    /// Events dropped as redeliveries.
    pub duplicates: u64,
    /// Seqs given up on (never arrived within the gap timeout or hold bound).
    pub skipped: u64,
    /// Events released to the correlator.
    pub released: u64,
}

/// Events ready for the correlator, in the order released, each with its
/// shim's identity. Consecutive events of one shim (a batch, usually) share
/// one reference to it: releasing an event costs no reference count of its
/// own.
pub struct Released<E = Event> {
    shims: Vec<Arc<ShimInfo>>,
    /// Each event with the index of its shim in `shims`.
    events: Vec<(usize, E)>,
}

impl<E> Default for Released<E> {
    fn default() -> Self {
        Self {
            shims: Vec::new(),
            events: Vec::new(),
        }
    }
}

impl<E> Released<E> {
    fn push(&mut self, shim: &Arc<ShimInfo>, event: E) {
        if !self
            .shims
            .last()
            .is_some_and(|last| Arc::ptr_eq(last, shim))
        {
            self.shims.push(Arc::clone(shim));
        }
        self.events.push((self.shims.len() - 1, event));
    }

    /// Whether no event is ready.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// The events in order, each with its shim.
    pub fn iter(&self) -> impl Iterator<Item = (&ShimInfo, &E)> {
        self.events
            .iter()
            .filter_map(|(at, event)| Some((&**self.shims.get(*at)?, event)))
    }

    /// Hands every event, in order, to `f` with its shim, and empties the
    /// list.
    pub fn drain(&mut self, mut f: impl FnMut(&ShimInfo, E)) {
        for (at, event) in self.events.drain(..) {
            if let Some(shim) = self.shims.get(at) {
                f(shim, event);
            }
        }
        self.shims.clear();
    }
}

struct Instance<E> {
    shim: Arc<ShimInfo>,
    /// The seq released next.
    next: u64,
    /// Early events by seq.
    held: BTreeMap<u64, Held<E>>,
    last_active: u64,
}

struct Held<E> {
    event: E,
    /// Arrival time.
    arrived: u64,
    /// Position in the persistent queue (0 without one).
    lsn: u64,
}

/// Where released events go, and the lowest lsn among them.
struct Out<'a, E> {
    ready: &'a mut Released<E>,
    stats: &'a mut SequencerStats,
    min_lsn: &'a mut u64,
}

impl<E> Out<'_, E> {
    fn release(&mut self, shim: &Arc<ShimInfo>, held: Held<E>) {
        self.stats.released += 1;
        *self.min_lsn = (*self.min_lsn).min(held.lsn);
        self.ready.push(shim, held.event);
    }
}

/// See the module docs.
pub struct Sequencer<E = Event> {
    config: SequencerConfig,
    instances: Map<String, Instance<E>>,
    stats: SequencerStats,
    /// Lowest lsn released since [`Sequencer::take_released_lsn`]
    /// (`u64::MAX`: none).
    released_lsn: u64,
}

impl<E: Source> Sequencer<E> {
    pub fn new(config: SequencerConfig) -> Self {
        Self {
            config,
            instances: Map::default(),
            stats: SequencerStats::default(),
            released_lsn: u64::MAX,
        }
    }

    pub fn stats(&self) -> &SequencerStats {
        &self.stats
    }

    /// Events held, over all instances.
    pub fn held(&self) -> usize {
        self.instances.values().map(|i| i.held.len()).sum()
    }

    /// Lowest lsn among the held events, if any.
    pub fn min_held_lsn(&self) -> Option<u64> {
        self.instances
            .values()
            .flat_map(|i| i.held.values().map(|h| h.lsn))
            .min()
    }

    /// For every instance holding events, the lowest lsn among them,
    /// lowered into `into`.
    pub fn min_held_lsn_by_instance<'a>(
        &'a self,
        into: &mut std::collections::HashMap<&'a str, u64>,
    ) {
        for (id, instance) in &self.instances {
            if let Some(lsn) = instance.held.values().map(|h| h.lsn).min() {
                crate::fleet::note_lsn(into, id, lsn);
            }
        }
    }

    /// Forgets `instance`: its held events are dropped and its next seq
    /// forgotten, so that it can come back with the same events (a fleet's
    /// handoff). The number of held events dropped.
    pub fn forget(&mut self, instance: &str) -> usize {
        self.instances.remove(instance).map_or(0, |i| i.held.len())
    }

    /// Lowest lsn among the events released since the last call, if any.
    pub fn take_released_lsn(&mut self) -> Option<u64> {
        let lsn = std::mem::replace(&mut self.released_lsn, u64::MAX);
        (lsn != u64::MAX).then_some(lsn)
    }

    fn out<'a>(
        stats: &'a mut SequencerStats,
        released_lsn: &'a mut u64,
        ready: &'a mut Released<E>,
    ) -> Out<'a, E> {
        Out {
            ready,
            stats,
            min_lsn: released_lsn,
        }
    }

    /// Takes one event of `shim`'s stream that arrived at `now` in a batch
    /// with `floor_seq`; appends what became ready, in order, to `ready`.
    pub fn push(
        &mut self,
        shim: &ShimInfo,
        floor_seq: u64,
        event: E,
        now: u64,
        ready: &mut Released<E>,
    ) {
        self.push_batch(shim, floor_seq, [event], 0, now, ready);
    }

    /// As [`Sequencer::push`], for the events of one batch (in the batch's
    /// order), stored at `lsn` in the persistent queue (0 without one). The
    /// shim's instance is looked up once per batch. A batch without events
    /// changes nothing, its floor included.
    pub fn push_batch(
        &mut self,
        shim: &ShimInfo,
        floor_seq: u64,
        events: impl IntoIterator<Item = E>,
        lsn: u64,
        now: u64,
        ready: &mut Released<E>,
    ) {
        let mut events = events.into_iter();
        let Some(first) = events.next() else {
            return;
        };
        let mut out = Self::out(&mut self.stats, &mut self.released_lsn, ready);
        let max = self.config.max_instances;
        let Some(instance) = enter(&mut self.instances, max, shim, floor_seq, now, &mut out) else {
            return;
        };
        let max_held = self.config.max_held;
        take(instance, first, now, lsn, max_held, &mut out);
        for event in events {
            take(instance, event, now, lsn, max_held, &mut out);
        }
    }

    /// As [`Sequencer::push_batch`] for a batch whose events are `seqs`, in
    /// order and without a gap, when they are exactly the ones `shim`'s
    /// instance releases next and it holds none (nearly every batch): they
    /// are counted as released at once, and the caller hands them to the
    /// correlator itself, after the events in `ready`. Returns whether it
    /// took them; if not, the batch goes through [`Sequencer::push_batch`],
    /// which finds the instance made and the floor applied already.
    pub fn take_run(
        &mut self,
        shim: &ShimInfo,
        floor_seq: u64,
        seqs: RangeInclusive<u64>,
        lsn: u64,
        now: u64,
        ready: &mut Released<E>,
    ) -> bool {
        if seqs.is_empty() {
            return false;
        }
        let mut out = Self::out(&mut self.stats, &mut self.released_lsn, ready);
        let max = self.config.max_instances;
        let Some(instance) = enter(&mut self.instances, max, shim, floor_seq, now, &mut out) else {
            return false;
        };
        let (first, last) = seqs.into_inner();
        if first != instance.next || !instance.held.is_empty() {
            return false;
        }
        instance.next = last.saturating_add(1);
        out.stats.released += last - first + 1;
        *out.min_lsn = (*out.min_lsn).min(lsn);
        true
    }

    /// Skips holes older than the gap timeout at wall-clock `now`.
    pub fn expire(&mut self, now: u64, ready: &mut Released<E>) {
        let timeout = self.config.gap_timeout_nanos;
        let ids = sorted_keys(&self.instances, |_, _| true);
        let mut out = Self::out(&mut self.stats, &mut self.released_lsn, ready);
        for id in ids {
            if let Some(instance) = self.instances.get_mut(&id)
                && let Some((&first, held)) = instance.held.iter().next()
                && now.saturating_sub(held.arrived) >= timeout
            {
                skip_to(instance, first, &mut out);
            }
        }
    }

    /// Releases everything held (shutdown), in order, skipping the holes.
    pub fn flush_all(&mut self, ready: &mut Released<E>) {
        let ids = sorted_keys(&self.instances, |_, _| true);
        let mut out = Self::out(&mut self.stats, &mut self.released_lsn, ready);
        for id in ids {
            if let Some(instance) = self.instances.get_mut(&id) {
                while let Some(first) = instance.held.keys().next().copied() {
                    skip_to(instance, first, &mut out);
                }
            }
        }
    }
}

/// `shim`'s instance, made if new (the least recently active one forgotten
/// past `max_instances`), marked active at `now`, every seq below
/// `floor_seq` given up on. Looked up by reference: the id is only cloned
/// for a new instance.
fn enter<'a, E>(
    instances: &'a mut Map<String, Instance<E>>,
    max_instances: usize,
    shim: &ShimInfo,
    floor_seq: u64,
    now: u64,
    out: &mut Out<'_, E>,
) -> Option<&'a mut Instance<E>> {
    if !instances.contains_key(&shim.instance_id) {
        if instances.len() >= max_instances {
            forget_least_active(instances, out);
        }
        instances.insert(
            shim.instance_id.clone(),
            Instance {
                shim: Arc::new(shim.clone()),
                next: 1,
                held: BTreeMap::new(),
                last_active: now,
            },
        );
    }
    let instance = instances.get_mut(&shim.instance_id)?;
    instance.last_active = now;
    if *instance.shim != *shim {
        instance.shim = Arc::new(shim.clone());
    }
    if floor_seq > instance.next {
        // Everything below the floor is settled at the shim: stop waiting.
        skip_to(instance, floor_seq, out);
    }
    Some(instance)
}

/// Forgets the least recently active instance, releasing what it held.
fn forget_least_active<E>(instances: &mut Map<String, Instance<E>>, out: &mut Out<'_, E>) {
    let oldest = instances
        .iter()
        .min_by(|a, b| (a.1.last_active, a.0).cmp(&(b.1.last_active, b.0)))
        .map(|(k, _)| k.clone());
    if let Some(mut instance) = oldest.and_then(|k| instances.remove(&k)) {
        while let Some(first) = instance.held.keys().next().copied() {
            skip_to(&mut instance, first, out);
        }
    }
}

/// Gives up on every seq below `seq`, then releases what is contiguous.
fn skip_to<E>(instance: &mut Instance<E>, seq: u64, out: &mut Out<'_, E>) {
    if seq > instance.next {
        // Held events below the floor are still released, in order.
        let below: Vec<u64> = instance.held.range(..seq).map(|(k, _)| *k).collect();
        out.stats.skipped += (seq - instance.next) - below.len() as u64;
        for k in below {
            if let Some(held) = instance.held.remove(&k) {
                out.release(&instance.shim, held);
            }
        }
        instance.next = seq;
    }
    release(instance, out);
}

/// Releases the contiguous run starting at `next`.
/// Takes one event of `instance`'s stream: dropped as a redelivery,
/// released, or held until the seqs before it arrive.
#[inline]
fn take<E: Source>(
    instance: &mut Instance<E>,
    event: E,
    now: u64,
    lsn: u64,
    max_held: usize,
    out: &mut Out<'_, E>,
) {
    let seq = event.seq();
    if seq < instance.next || instance.held.contains_key(&seq) {
        out.stats.duplicates += 1;
        return;
    }
    if seq == instance.next && instance.held.is_empty() {
        // In order with nothing held (the common case): released at once,
        // without a round trip through the hold.
        instance.next += 1;
        out.release(
            &instance.shim,
            Held {
                event,
                arrived: now,
                lsn,
            },
        );
        return;
    }
    instance.held.insert(
        seq,
        Held {
            event,
            arrived: now,
            lsn,
        },
    );
    release(instance, out);
    if instance.held.len() > max_held
        && let Some(first) = instance.held.keys().next().copied()
    {
        skip_to(instance, first, out);
    }
}

fn release<E>(instance: &mut Instance<E>, out: &mut Out<'_, E>) {
    while let Some(held) = instance.held.remove(&instance.next) {
        instance.next += 1;
        out.release(&instance.shim, held);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hermes_e2e::events::shim;

    fn ev(seq: u64) -> Event {
        Event {
            seq,
            hook: format!("h{seq}"),
            ..Default::default()
        }
    }

    fn seqs(ready: &Released) -> Vec<u64> {
        ready.iter().map(|(_, e)| e.seq).collect()
    }

    /// A sequencer and the events it released.
    struct Fixture {
        s: Sequencer,
        out: Released,
    }

    impl Fixture {
        /// With the default configuration changed by `set`.
        fn new(set: impl FnOnce(&mut SequencerConfig)) -> Self {
            let mut config = SequencerConfig::default();
            set(&mut config);
            Self {
                s: Sequencer::new(config),
                out: Released::default(),
            }
        }

        /// Event `seq` of agent `instance` (nothing settled below it at the
        /// shim) at wall-clock `now`.
        fn push(&mut self, instance: &str, seq: u64, now: u64) {
            self.s.push(&shim(instance), 0, ev(seq), now, &mut self.out);
        }

        /// The sequence numbers released so far, in order.
        fn released(&self) -> Vec<u64> {
            seqs(&self.out)
        }
    }

    #[test]
    fn releases_in_order_and_drops_redeliveries() {
        let mut f = Fixture::new(|_| {});
        for seq in [3, 1, 1, 2, 3, 5, 4, 2] {
            f.push("a", seq, 0);
        }
        assert_eq!(f.released(), vec![1, 2, 3, 4, 5]);
        assert_eq!(f.s.stats().duplicates, 3);
        assert_eq!(f.s.held(), 0);
    }

    #[test]
    fn instances_are_independent() {
        let mut f = Fixture::new(|_| {});
        f.push("a", 2, 0);
        f.push("b", 1, 0);
        assert_eq!(f.released(), vec![1]);
        assert_eq!(
            f.out.iter().next().map(|(s, _)| s.instance_id.as_str()),
            Some("b")
        );
    }

    #[test]
    fn floor_skips_what_the_shim_will_never_send() {
        let mut f = Fixture::new(|_| {});
        // A restarted collector first sees seq 501; the shim says 1..=500 are settled.
        f.s.push(&shim("a"), 501, ev(502), 0, &mut f.out);
        assert!(f.out.is_empty());
        f.s.push(&shim("a"), 501, ev(501), 0, &mut f.out);
        assert_eq!(f.released(), vec![501, 502]);
        assert_eq!(f.s.stats().skipped, 500);
    }

    #[test]
    fn holes_are_skipped_after_the_gap_timeout() {
        let mut f = Fixture::new(|c| c.gap_timeout_nanos = 100);
        f.push("a", 1, 0);
        f.push("a", 3, 10);
        f.s.expire(50, &mut f.out);
        assert_eq!(f.released(), vec![1]);
        f.s.expire(110, &mut f.out);
        assert_eq!(f.released(), vec![1, 3]);
        assert_eq!(f.s.stats().skipped, 1);
        f.push("a", 2, 120);
        assert_eq!(
            f.s.stats().duplicates,
            1,
            "a skipped seq arriving late is not replayed out of order"
        );
    }

    #[test]
    fn hold_is_bounded() {
        let mut f = Fixture::new(|c| c.max_held = 3);
        for seq in 2..=5 {
            f.push("a", seq, 0);
        }
        assert_eq!(f.released(), vec![2, 3, 4, 5]);
        assert!(f.s.held() <= 3);
        assert_eq!(f.s.stats().skipped, 1);
    }

    proptest::proptest! {
        /// A batch pushed at once gives what its events pushed one by one
        /// give: the same releases, in the same order, and the same counts.
        #[test]
        fn a_batch_is_its_events_one_by_one(
            batches in proptest::collection::vec(
                (0u64..12, proptest::collection::vec(1u64..16, 0..8)),
                1..6,
            ),
            max_held in 1usize..6,
        ) {
            let config = SequencerConfig { max_held, ..Default::default() };
            let mut whole = Sequencer::new(config.clone());
            let mut single = Sequencer::new(config);
            let (mut whole_out, mut single_out) = (Released::default(), Released::default());
            for (floor, batch) in batches {
                whole.push_batch(&shim("a"), floor, batch.iter().map(|&seq| ev(seq)), 0, 0, &mut whole_out);
                for seq in batch {
                    single.push(&shim("a"), floor, ev(seq), 0, &mut single_out);
                }
            }
            proptest::prop_assert_eq!(seqs(&whole_out), seqs(&single_out));
            proptest::prop_assert_eq!(whole.stats(), single.stats());
            proptest::prop_assert_eq!(whole.held(), single.held());
        }

        /// A gapless batch taken whole when it runs on from what was
        /// released (`take_run`, its events then handed over after the
        /// released ones) gives what pushing it gives: the same releases, in
        /// the same order, the same counts and the same lsn; a batch it does
        /// not take changes nothing that the push then does differently.
        #[test]
        fn a_run_taken_whole_is_its_batch_pushed(
            batches in proptest::collection::vec((0u64..12, 1u64..16, 0u64..6, 1u64..9), 1..12),
            max_held in 1usize..6,
        ) {
            let config = SequencerConfig { max_held, ..Default::default() };
            let (mut pushed, mut runs) = (Sequencer::new(config.clone()), Sequencer::new(config));
            let (mut pushed_out, mut runs_out) = (Released::default(), Released::default());
            let (mut pushed_seqs, mut runs_seqs) = (Vec::new(), Vec::new());
            for (floor, first, len, lsn) in batches {
                let batch = first..first + len;
                pushed.push_batch(&shim("a"), floor, batch.clone().map(ev), lsn, 0, &mut pushed_out);
                pushed_seqs.extend(seqs(&pushed_out));
                pushed_out = Released::default();
                let whole = !batch.is_empty()
                    && runs.take_run(&shim("a"), floor, first..=first + len - 1, lsn, 0, &mut runs_out);
                runs_seqs.extend(seqs(&runs_out));
                runs_out = Released::default();
                if whole {
                    runs_seqs.extend(batch);
                } else {
                    runs.push_batch(&shim("a"), floor, batch.map(ev), lsn, 0, &mut runs_out);
                    runs_seqs.extend(seqs(&runs_out));
                    runs_out = Released::default();
                }
                proptest::prop_assert_eq!(pushed.take_released_lsn(), runs.take_released_lsn());
            }
            proptest::prop_assert_eq!(&pushed_seqs, &runs_seqs);
            proptest::prop_assert_eq!(pushed.stats(), runs.stats());
            proptest::prop_assert_eq!(pushed.held(), runs.held());
        }
    }

    /// `take_run` takes only the run that comes next, with nothing held.
    #[test]
    fn only_the_next_run_is_taken_whole() {
        let mut f = Fixture::new(|_| {});
        assert!(f.s.take_run(&shim("a"), 0, 1..=3, 5, 0, &mut f.out));
        assert!(
            !f.s.take_run(&shim("a"), 0, 5..=6, 6, 0, &mut f.out),
            "a gap"
        );
        assert!(
            !f.s.take_run(&shim("a"), 0, 2..=4, 7, 0, &mut f.out),
            "seen"
        );
        f.s.push(&shim("a"), 0, ev(6), 0, &mut f.out);
        assert!(
            !f.s.take_run(&shim("a"), 0, 4..=5, 8, 0, &mut f.out),
            "one is held"
        );
        assert!(f.out.is_empty());
        assert_eq!(f.s.stats().released, 3);
        assert_eq!(f.s.take_released_lsn(), Some(5));
        // A floor past the next seq gives the hole up, then takes the run.
        assert!(f.s.take_run(&shim("b"), 4, 4..=4, 9, 0, &mut f.out));
        assert_eq!(f.s.stats().skipped, 3);
    }

    #[test]
    fn instances_are_bounded() {
        let mut f = Fixture::new(|c| c.max_instances = 2);
        f.push("a", 2, 0);
        f.push("b", 1, 1);
        f.push("c", 1, 2);
        assert_eq!(f.s.instances.len(), 2);
        assert_eq!(
            f.released(),
            vec![1, 2, 1],
            "a's held event is released when a is forgotten"
        );
    }

    #[test]
    fn lsns_of_held_and_released_events() {
        let Fixture { mut s, mut out } = Fixture::new(|_| {});
        s.push_batch(&shim("a"), 0, [ev(2)], 7, 0, &mut out);
        s.push_batch(&shim("b"), 0, [ev(1)], 8, 0, &mut out);
        assert_eq!(s.min_held_lsn(), Some(7));
        assert_eq!(s.take_released_lsn(), Some(8));
        assert_eq!(s.take_released_lsn(), None);
        // seq 1 of a arrives later (lsn 9) and releases seq 2 (lsn 7).
        s.push_batch(&shim("a"), 0, [ev(1)], 9, 0, &mut out);
        assert_eq!(seqs(&out), vec![1, 1, 2]);
        assert_eq!(s.take_released_lsn(), Some(7));
        assert_eq!(s.min_held_lsn(), None);
    }

    #[test]
    fn flush_all_releases_everything_held() {
        let mut f = Fixture::new(|_| {});
        f.push("a", 4, 0);
        f.push("a", 2, 0);
        f.s.flush_all(&mut f.out);
        assert_eq!(f.released(), vec![2, 4]);
        assert_eq!(f.s.held(), 0);
    }
}
