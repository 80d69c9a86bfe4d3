//! Work cut off by the agent process' exit, and the end of a subagent
//! whose stop never came.
//!
//! Owns: what the shim's last event ([`hooks::PROCESS_EXIT`]) does to the
//! state of its instance, and [`Correlator::subagent_end`], the end of a
//! subagent span closed without its `subagent_stop` (exit, TTL, eviction,
//! shutdown).
//!
//! Rules (`docs/TRACE_MODEL.md`, "Work cut off by the exit"):
//! - The marker is the instance's last event: every hook it captured comes
//!   before it in capture order, so whatever of the instance is still open
//!   will never get its end event.
//! - A turn that had ended (`post_llm_call` seen) closes as it would have.
//!   Any other turn closes with `hermes.incomplete=true`,
//!   `hermes.turn.completed=false` and `hermes.turn.end_reason=process_exit`
//!   (values the agent sent itself are kept). It was `interrupted`, like
//!   Hermes' own interrupt (not an error, end time = the exit: its work ran
//!   until then), unless its last API attempt failed: then Hermes had given
//!   up on it, `interrupted=false`, status ERROR with that error, end time =
//!   its last event.
//! - An open subagent closes at the exit time, incomplete: its child ran
//!   until then.
//! - A subagent closed without its stop otherwise ends at its child's last
//!   activity, never before its start: a span of the work seen, never a
//!   zero-length one while the child did something.
//! - Only the marker's own instance is touched.

use hermes_proto::view;

use crate::{Correlator, FinishedSpan, sorted_keys};

/// `hermes.turn.end_reason` of a turn cut off by the exit.
pub const PROCESS_EXIT_REASON: &str = "process_exit";

impl Correlator {
    /// The shim of `instance` is gone (its exit marker, captured at `t`).
    pub(crate) fn process_exit(&mut self, instance: &str, t: u64, out: &mut Vec<FinishedSpan>) {
        let ids = sorted_keys(&self.turns, |_, turn| turn.instance == instance);
        for id in ids {
            let Some(mut turn) = self.take_turn(&id) else {
                continue;
            };
            if let Some(end) = turn.end {
                self.emit_turn(turn, end, false, out);
                continue;
            }
            self.stats.cut_off_at_exit += 1;
            let gave_up = turn.last_attempt_error.is_some();
            turn.completed.get_or_insert(false);
            turn.interrupted.get_or_insert(!gave_up);
            if turn.end_reason.is_empty() {
                turn.end_reason = PROCESS_EXIT_REASON.to_owned();
            }
            let end = if gave_up { turn.last_seen } else { t };
            self.emit_turn(turn, end, true, out);
        }
        let subs = sorted_keys(&self.subagents, |child, _| {
            self.links
                .get(child)
                .is_some_and(|l| l.instance == instance)
        });
        for child in subs {
            self.subagent_stop_at(&child, &view::Subagent::default(), t, true, out);
        }
        // Nothing of this instance can arrive any more.
        let links = sorted_keys(&self.links, |_, l| l.instance == instance);
        for k in links {
            self.remove_link(&k);
        }
        self.drop_pending_starts(|p| p.instance == instance);
    }

    /// Where a subagent closed without its `subagent_stop` ends: its
    /// child's latest activity (closed child turns and open ones), not
    /// before its start.
    pub(crate) fn subagent_end(&self, child: &str) -> u64 {
        let Some(open) = self.subagents.get(child) else {
            return 0;
        };
        let instance = self.links.get(child).map(|l| l.instance.clone());
        let open_turns = self
            .turns
            .values()
            .filter(|t| {
                t.session_id == open.child_session_id.as_str()
                    && instance.as_ref().is_some_and(|i| *i == t.instance)
            })
            .map(|t| t.end.unwrap_or(t.last_seen).max(t.max_child_end));
        open_turns
            .chain(std::iter::once(open.child_seen))
            .fold(open.start, u64::max)
    }

    /// A turn of a child session closed at `end`: its subagent's work went
    /// on at least until then.
    pub(crate) fn note_child_end(&mut self, instance: &str, session_id: &str, end: u64) {
        if let Some(open) = self.subagents.get_mut(self.keys.of(instance, session_id)) {
            open.child_seen = open.child_seen.max(end);
        }
    }
}
