//! Settlement of the events of shims in fleet mode: the correlation stage
//! owns it, the receiver carries it to the shims
//! ([`hermes_receiver::Settlements`]).
//!
//! An event of a shim instance is *settled* when every span built from it
//! is exported (or lost for good and counted): it is in no open unit, no
//! event the sequencer holds, no trace the sampler holds, and no export
//! message the exporter stage has not finished. Such a shim keeps its
//! events until they are settled, so that another collector of its fleet
//! can rebuild the same spans when this one goes.
//!
//! Per instance, a [`Track`] keeps its batches in arrival order as
//! (lsn, last seq). At each settle, the batches below the lowest lsn the
//! instance's open state, held events and the sampler's held traces need
//! are *closed*: whatever spans they gave are sent, in export messages up
//! to the count sent so far. Once the exporter stage has finished that
//! message ([`Done`]), they are settled, and the last seq of the last
//! settled batch is published. The sampler's traces are not attributed to
//! instances: what it holds holds back every instance (exact, if late).
//!
//! A closed turn or subagent whose events span several batches
//! ([`Closure`]) is never split: the batches are closed up to a position
//! inside it only together with the rest of it. After a move the shim
//! sends every event above its settled seq to the next replica, which must
//! get all of a closed unit (and build the same spans) or none of it (and
//! never build a turn from the tail of one this replica exported).
//!
//! Lsns: the persistent queue's (`queue.kind: disk`); with the memory
//! queue the stage numbers the batches itself ([`Settlement::number`]).
//!
//! With `fleet.replicated` it also knows which instances went elsewhere:
//! at the end of the stage every fleet instance whose agent is not presumed
//! dead ([`Settlement::departed`]), and after a restart the instances whose
//! replayed state no live batch followed within the state TTL
//! ([`Settlement::take_orphans`]).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use hermes_correlator::{Closure, Correlation};
use hermes_proto::view::WireEvent;
use hermes_receiver::Settlements;

use crate::ledger::Done;

/// The batches of one instance not settled yet.
#[derive(Debug, Default)]
struct Track {
    /// (lsn, last seq) of batches whose events may still be open.
    open: VecDeque<(u64, u64)>,
    /// (export message, last seq) of closed batches: settled once the
    /// exporter stage finished that message.
    closing: VecDeque<(u64, u64)>,
    /// Closed units that reach past the open batches' front.
    closures: Vec<Closure>,
}

impl Track {
    /// How many of the open batches, from the front, close: each below
    /// `bound`, and no closure reaching from them past the last.
    fn closable(&self, bound: u64) -> usize {
        let mut reach = 0;
        let mut closable = 0;
        for (i, &(lsn, _)) in self.open.iter().enumerate() {
            if lsn >= bound {
                break;
            }
            for c in self.closures.iter().filter(|c| c.lo <= lsn) {
                reach = reach.max(c.hi);
            }
            if reach <= lsn {
                closable = i + 1;
            }
        }
        closable
    }
}

/// See the module docs.
pub struct Settlement {
    registry: Arc<Settlements>,
    done: Done,
    tracks: HashMap<String, Track>,
    /// Export messages sent (numbered as the exporter stage numbers them).
    sent: u64,
    /// Highest lsn given with the memory queue.
    numbered: u64,
    /// Highest lsn seen.
    last_lsn: u64,
    /// The lowest lsn open state or held traces needed at the last settle.
    low_water: u64,
    /// `fleet.replicated`: after how long (nanoseconds) replayed state
    /// whose instance did not come back is an orphan.
    replicated: Option<u64>,
    /// Instances that sent fleet batches, or whose batches the queue
    /// replayed, and may hold open state (with `fleet.replicated` only).
    /// Shared with the correlator ([`Settlement::movable`]), copied only
    /// when it changes after that.
    seen: Arc<HashSet<String>>,
    /// Instances replayed from the persistent queue, not back yet.
    replayed: HashSet<String>,
    /// When the replayed instances not back by then are orphans.
    orphan_deadline: Option<u64>,
    /// The newest fleet stream each instance started here (the receiver's
    /// stream numbers): what an older one brings is stale.
    streams: HashMap<String, u64>,
}

impl Settlement {
    /// Settles into `registry`, with `done` the exporter stage's finished
    /// messages.
    pub fn new(registry: Arc<Settlements>, done: Done) -> Self {
        Self {
            registry,
            done,
            tracks: HashMap::new(),
            sent: 0,
            numbered: 0,
            last_lsn: 0,
            low_water: 0,
            replicated: None,
            seen: Arc::default(),
            replayed: HashSet::new(),
            orphan_deadline: None,
            streams: HashMap::new(),
        }
    }

    /// One replica of a fleet (`fleet.replicated`): replayed state of an
    /// instance that sends no live batch within `state_ttl_nanos` is an
    /// orphan.
    pub fn replicated(mut self, state_ttl_nanos: u64) -> Self {
        self.replicated = Some(state_ttl_nanos);
        self
    }

    pub fn is_replicated(&self) -> bool {
        self.replicated.is_some()
    }

    /// A batch of `instance` at clock time `now`: replayed from the
    /// persistent queue, or live (it came back).
    pub fn arrived(&mut self, instance: &str, replayed: bool, now: u64) {
        let Some(ttl) = self.replicated else { return };
        if replayed {
            if !self.replayed.contains(instance) {
                self.replayed.insert(instance.to_owned());
                // Its agent moved on when this replica died: what the replay
                // rebuilds may be ended elsewhere, and waits like any state
                // of an agent that may move.
                if !self.seen.contains(instance) {
                    Arc::make_mut(&mut self.seen).insert(instance.to_owned());
                }
            }
            self.orphan_deadline
                .get_or_insert_with(|| now.saturating_add(ttl));
        } else if !self.replayed.is_empty() {
            self.replayed.remove(instance);
        }
    }

    /// When the replayed instances not back by then are orphans.
    pub fn orphan_deadline(&self) -> Option<u64> {
        self.orphan_deadline.filter(|_| !self.replayed.is_empty())
    }

    /// The replayed instances that did not come back, once their time is
    /// up at clock time `now` (or all of them with `now` = `u64::MAX`).
    pub fn take_orphans(&mut self, now: u64) -> Vec<String> {
        match self.orphan_deadline {
            Some(at) if at <= now => {
                self.orphan_deadline = None;
                let mut orphans: Vec<String> = self.replayed.drain().collect();
                orphans.sort();
                orphans
            }
            _ => Vec::new(),
        }
    }

    /// At the end of a replicated collector's stage: the fleet instances
    /// that moved, or will move, to another replica (every one but those
    /// whose agent is presumed dead), whose open state goes unexported.
    pub fn departed(&self) -> Vec<String> {
        let mut departed: Vec<String> = self
            .seen
            .iter()
            .filter(|i| !self.registry.is_abandoned(i))
            .cloned()
            .collect();
        departed.sort();
        departed
    }

    /// With `fleet.replicated`: the fleet instances seen here, which may
    /// move to another replica at any time
    /// ([`hermes_correlator::Correlator::set_movable`]); none otherwise.
    pub fn movable(&self) -> Arc<HashSet<String>> {
        Arc::clone(&self.seen)
    }

    /// The lsn of a batch that came without one (the memory queue).
    pub fn number(&mut self) -> u64 {
        self.numbered += 1;
        self.numbered
    }

    /// A batch of a fleet stream: `instance`'s events up to `last_seq`,
    /// stored at `lsn`.
    pub fn ingested(&mut self, instance: &str, lsn: u64, last_seq: u64) {
        self.last_lsn = self.last_lsn.max(lsn);
        if self.replicated.is_some() && !self.seen.contains(instance) {
            Arc::make_mut(&mut self.seen).insert(instance.to_owned());
        }
        let track = match self.tracks.get_mut(instance) {
            Some(track) => track,
            None => self.tracks.entry(instance.to_owned()).or_default(),
        };
        track.open.push_back((lsn, last_seq));
    }

    /// An export message is about to be sent.
    pub fn sending(&mut self) {
        self.sent += 1;
    }

    /// Forgets `instance`'s batches (it handed off: nothing of them will
    /// be settled here).
    pub fn forget(&mut self, instance: &str) {
        self.tracks.remove(instance);
        if self.seen.contains(instance) {
            Arc::make_mut(&mut self.seen).remove(instance);
        }
        self.streams.remove(instance);
    }

    /// `instance` started fleet stream `stream` here (its first batch).
    pub fn stream_started(&mut self, instance: &str, stream: u64) {
        self.streams.insert(instance.to_owned(), stream);
    }

    /// Whether `stream` is `instance`'s newest stream here (or no newer
    /// one started since): its batches, a handoff among them, apply.
    pub fn is_current(&self, instance: &str, stream: u64) -> bool {
        self.streams
            .get(instance)
            .is_none_or(|&newest| stream >= newest)
    }

    /// A lower bound of the lsns of the events any span finished from now
    /// on was built from (the memory queue's low water for the sampler).
    pub fn low_water(&self) -> u64 {
        self.low_water
    }

    /// Whether batches wait to be settled (the stage keeps ticking).
    pub fn is_pending(&self) -> bool {
        !self.tracks.is_empty()
    }

    /// Takes the units the correlator closed since the last call; keeps
    /// those of instances with batches to settle (the rest can split
    /// nothing). Called after every step of the stage, so that what
    /// non-fleet shims close never piles up.
    pub fn take_closures(&mut self, correlation: &mut Correlation<WireEvent>) {
        for (instance, closure) in correlation.take_closures() {
            if let Some(track) = self.tracks.get_mut(&*instance) {
                track.closures.push(closure);
            }
        }
    }

    /// Closes and settles what it can (see the module docs); `held` is the
    /// lowest lsn the sampler's held traces need. Publishes each instance
    /// whose settled seq advanced.
    pub fn settle(&mut self, correlation: &Correlation<WireEvent>, held: Option<u64>) {
        let next = self.last_lsn + 1;
        let open_all = [correlation.min_open_lsn(), held]
            .into_iter()
            .flatten()
            .min();
        self.low_water = open_all.unwrap_or(next).min(next);
        if self.tracks.is_empty() && self.seen.is_empty() && self.streams.is_empty() {
            return;
        }
        let open = correlation.min_open_lsn_by_instance();
        let registry = &self.registry;
        let holds = |i: &String| open.contains_key(i.as_str()) || registry.is_connected(i);
        if !self.seen.iter().all(holds) {
            Arc::make_mut(&mut self.seen).retain(holds);
        }
        self.streams
            .retain(|i, _| open.contains_key(i.as_str()) || registry.is_connected(i));
        let done = (self.done)();
        let sent = self.sent;
        self.tracks.retain(|instance, track| {
            let bound = [open.get(instance.as_str()).copied(), held]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(u64::MAX);
            let closable = track.closable(bound);
            if let Some(&(last, _)) = closable.checked_sub(1).and_then(|i| track.open.get(i)) {
                track.closures.retain(|c| c.hi > last);
            }
            for (_, seq) in track.open.drain(..closable) {
                track.closing.push_back((sent, seq));
            }
            let mut settled = None;
            while let Some(&(message, seq)) = track.closing.front() {
                if message > done {
                    break;
                }
                track.closing.pop_front();
                settled = Some(seq);
            }
            if let Some(seq) = settled {
                tracing::debug!(%instance, seq, "settled");
                self.registry.publish(instance, seq);
            }
            !(track.open.is_empty() && track.closing.is_empty())
        });
    }
}
