//! What a fleet of collector replicas needs of the correlator: the lowest
//! queue position each shim instance's open state needs (the driver's
//! settlement of events, see `hermes-pipeline`'s `settle.rs`), and
//! forgetting an instance's open state without exporting it (a handoff:
//! the instance sends the same events to another replica, which builds
//! the same spans from them).

use super::*;

/// Why an instance's open state is forgotten ([`Correlator::drop_instance`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Departure {
    /// It moved to another collector of its fleet (its handoff, or a
    /// replicated collector's drain): counted in [`Stats::turns_handed_off`].
    HandedOff,
    /// Replayed after a restart, it did not come back to this collector:
    /// counted in [`Stats::turns_orphaned`].
    Orphaned,
    /// It opened a new fleet stream, which sends again every event not
    /// settled: what it had built here is rebuilt from that resend, never
    /// mixed with it. Counted in [`Stats::turns_resent`].
    Resent,
}

/// The queue positions (lsns) a closed unit's events came from: a turn or
/// a subagent, or from 0 for a late event of a closed turn. A fleet
/// replica never settles an instance up to a position inside one: after a
/// move the shim sends again every event above its settled seq, and the
/// next replica must get all of a closed unit's events (it rebuilds the
/// same spans) or none of them (it never builds a turn from its tail).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closure {
    pub lo: u64,
    pub hi: u64,
}

/// Lowers `into[instance]` to `lsn`.
pub(crate) fn note_lsn<'a>(into: &mut HashMap<&'a str, u64>, instance: &'a str, lsn: u64) {
    let min = into.entry(instance).or_insert(lsn);
    *min = (*min).min(lsn);
}

impl Correlator {
    /// Records every closure from now on, until taken
    /// ([`Correlator::take_closures`]): the settlement of fleet shims'
    /// events takes them after every step.
    pub fn record_closures(&mut self) {
        self.closures.get_or_insert_with(Vec::new);
    }

    /// The closures recorded since the last call, by instance.
    pub fn take_closures(&mut self) -> Vec<(Str, Closure)> {
        self.closures
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// A unit of `instance` built from the events of positions `lo..=hi`
    /// closed (one position: nothing to record).
    pub(crate) fn closed_unit(&mut self, instance: &str, lo: u64, hi: u64) {
        if let Some(closures) = self.closures.as_mut()
            && lo < hi
        {
            closures.push((Str::from(instance), Closure { lo, hi }));
        }
    }

    /// For every instance holding open state, the lowest persistent-queue
    /// position (lsn) it needs, lowered into `into` ([`Correlator::min_lsn`]
    /// per instance).
    pub fn min_lsn_by_instance<'a>(&'a self, into: &mut HashMap<&'a str, u64>) {
        for turn in self.turns.values() {
            note_lsn(into, &turn.instance, turn.min_lsn);
        }
        for (child, sub) in &self.subagents {
            if let Some(link) = self.links.get(child) {
                note_lsn(into, &link.instance, sub.min_lsn);
            }
        }
        for start in self.pending_starts.values() {
            note_lsn(into, &start.instance, start.min_lsn);
        }
    }

    /// Forgets every open state of `instance` without emitting a span: its
    /// turns (with their attempts, tools and approvals), subagents, links
    /// and pending session starts. Not remembered as closed: the same
    /// turns may come back whole (the shim returns). The number of turns
    /// forgotten, counted by `why`.
    ///
    /// The turns it closed here are forgotten too: whatever the instance
    /// sends next comes on a new stream that starts with every event not
    /// settled, and is rebuilt from that alone (a copy of a turn exported
    /// here is the same spans). Taken as late, their events would each
    /// settle on their own, and the head of a turn resent in one batch
    /// could settle without its tail: the next replica would build the
    /// turn again from that tail, incomplete.
    pub fn drop_instance(&mut self, instance: &str, why: Departure) -> usize {
        let turns = sorted_keys(&self.turns, |_, t| t.instance.as_str() == instance);
        for k in &turns {
            if let Some(turn) = self.turns.remove(k) {
                self.session_turns.remove(&turn);
                self.ledger.sub(&turn.instance, 1, 0, turn.charged);
                if turn.plain {
                    self.closed.release(turn.turn_id.as_str(), &turn.instance);
                }
            }
        }
        self.closed.forget(instance);
        let prefix = key(instance, "");
        self.subagents.retain(|k, _| !k.starts_with(&prefix));
        for k in sorted_keys(&self.links, |k, _| k.starts_with(&prefix)) {
            self.remove_link(&k);
        }
        self.drop_pending_starts(|p| p.instance.as_str() == instance);
        let n = turns.len() as u64;
        match why {
            Departure::HandedOff => self.stats.turns_handed_off += n,
            Departure::Orphaned => self.stats.turns_orphaned += n,
            Departure::Resent => self.stats.turns_resent += n,
        }
        turns.len()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn note_keeps_the_lowest() {
        let mut m = HashMap::new();
        note_lsn(&mut m, "a", 7);
        note_lsn(&mut m, "a", 3);
        note_lsn(&mut m, "a", 9);
        note_lsn(&mut m, "b", 5);
        assert_eq!(m.get("a"), Some(&3));
        assert_eq!(m.get("b"), Some(&5));
    }
}
