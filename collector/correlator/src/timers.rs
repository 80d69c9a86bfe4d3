//! The correlator's timers: TTLs and end graces ([`Correlator::expire`]),
//! closing by queue position ([`Correlator::evict_below_lsn`]) and at
//! shutdown ([`Correlator::flush_all`]).

use super::*;

impl Correlator {
    /// Closes what has outlived its timers at wall-clock time `now`. The
    /// TTL counts both ways: state stamped further than the TTL in the
    /// future (a hostile or broken clock) is closed too, never kept forever.
    pub fn expire(&mut self, now: u64, out: &mut Vec<FinishedSpan>) {
        self.clock = self.clock.max(now);
        let before = out.len();
        let ttl = self.config.state_ttl_nanos;
        let grace = self.config.turn_end_grace_nanos;
        let movable = &self.movable;
        let mut ended: Vec<(String, bool)> = self
            .turns
            .iter()
            .filter_map(|(id, turn)| match turn.end {
                Some(_)
                    if now.saturating_sub(turn.end_seen) >= grace
                        && !movable.contains(turn.instance.as_str()) =>
                {
                    Some((id.clone(), false))
                }
                _ if now.abs_diff(turn.active_seen) >= ttl => Some((id.clone(), true)),
                _ => None,
            })
            .collect();
        ended.sort();
        for (id, incomplete) in ended {
            if let Some(turn) = self.take_turn(&id) {
                if incomplete {
                    self.stats.expired += 1;
                }
                let end = turn.end.unwrap_or(turn.last_seen);
                self.emit_turn(turn, end, incomplete, out);
            }
        }
        let stale = sorted_keys(&self.subagents, |_, s| now.abs_diff(s.start) >= ttl);
        for child in stale {
            self.stats.expired += 1;
            let end = self.subagent_end(&child);
            self.subagent_stop_at(&child, &view::Subagent::default(), end, true, out);
        }
        // A link lives as long as its subagent is open (its span needs it).
        let open = &self.subagents;
        let stale = sorted_keys(&self.links, |child, l| {
            !open.contains_key(child) && now.abs_diff(l.last_seen) >= ttl
        });
        for k in stale {
            self.remove_link(&k);
        }
        self.drop_pending_starts(|p| now.abs_diff(p.at) >= ttl);
        self.last_resource = None;
        self.resources
            .retain(|_, r| Arc::strong_count(&r.resource) > 1);
        self.stats.spans += (out.len() - before) as u64;
    }

    /// The fleet instances of a replicated collector (its settlement knows
    /// them): agents that may move to another replica between any two
    /// events. A moved agent sends its next replica every event not
    /// settled here, and that replica ends the turn whole; the handoff
    /// that tells this replica comes behind the batches sent before it, as
    /// late as the stream is backed up, or never (the agent's stream broke).
    /// Closing an ended turn here at the end grace would then export a
    /// second copy of it without its end event, so their ended turns wait
    /// like any open state: for `on_session_end`, the next turn of the
    /// session (which supersedes it), the handoff or the drain (which
    /// forget it), or the TTL (which closes it incomplete).
    pub fn set_movable(&mut self, movable: Arc<std::collections::HashSet<String>>) {
        self.movable = movable;
    }

    /// Closes, as incomplete, every open state that depends on a position
    /// below `lsn` (the persistent queue is full and must let those records
    /// go); counted as evictions.
    pub fn evict_below_lsn(&mut self, lsn: u64, out: &mut Vec<FinishedSpan>) {
        let before = out.len();
        let ids = sorted_keys(&self.turns, |_, t| t.min_lsn < lsn);
        for id in ids {
            if let Some(turn) = self.take_turn(&id) {
                self.stats.turns_evicted += 1;
                let end = turn.end.unwrap_or(turn.last_seen);
                self.emit_turn(turn, end, true, out);
            }
        }
        let subs = sorted_keys(&self.subagents, |_, s| s.min_lsn < lsn);
        for child in subs {
            let end = self.subagent_end(&child);
            self.subagent_stop_at(&child, &view::Subagent::default(), end, true, out);
        }
        self.drop_pending_starts(|p| p.min_lsn < lsn);
        self.stats.spans += (out.len() - before) as u64;
    }

    /// Closes everything still open (shutdown), as incomplete.
    pub fn flush_all(&mut self, out: &mut Vec<FinishedSpan>) {
        let before = out.len();
        let ids = sorted_keys(&self.turns, |_, _| true);
        for id in ids {
            if let Some(turn) = self.take_turn(&id) {
                let end = turn.end.unwrap_or(turn.last_seen);
                let incomplete = turn.end.is_none();
                self.emit_turn(turn, end, incomplete, out);
            }
        }
        let subs = sorted_keys(&self.subagents, |_, _| true);
        for child in subs {
            let end = self.subagent_end(&child);
            self.subagent_stop_at(&child, &view::Subagent::default(), end, true, out);
        }
        self.stats.spans += (out.len() - before) as u64;
    }
}
