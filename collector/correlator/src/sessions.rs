//! Sessions: session starts waiting for their turn, superseded turns, and
//! closing a session's turns.

use super::*;

impl Correlator {
    pub(crate) fn session_start(
        &mut self,
        instance: &str,
        session_id: &str,
        t: u64,
        model: Str,
        platform: Str,
    ) {
        if session_id.is_empty() {
            return;
        }
        let k = key(instance, session_id);
        self.drop_pending_start(&k);
        let bytes = RECORD_BYTES + k.len() + model.len() + platform.len();
        self.ledger.add(instance, 0, 1, bytes);
        self.pending_starts.insert(
            k,
            PendingSessionStart {
                instance: self.values.get(instance),
                bytes,
                at: t,
                model,
                platform,
                min_lsn: self.lsn,
            },
        );
        self.attach_session_start(instance, session_id);
    }

    /// Forgets the pending session starts `stale` picks.
    pub(crate) fn drop_pending_starts(&mut self, stale: impl Fn(&PendingSessionStart) -> bool) {
        let keys = sorted_keys(&self.pending_starts, |_, p| stale(p));
        for k in keys {
            self.drop_pending_start(&k);
        }
    }

    /// Attaches a pending `on_session_start` as an event on the session's
    /// earliest open turn of the same instance.
    pub(crate) fn attach_session_start(&mut self, instance: &str, session_id: &str) {
        let k = self.keys.of(instance, session_id);
        if !self.pending_starts.contains_key(k) {
            return;
        }
        let first = self
            .turns
            .iter_mut()
            .filter(|(_, t)| t.session_id == session_id && t.instance == instance)
            .min_by(|a, b| (a.1.start, a.0).cmp(&(b.1.start, b.0)));
        let Some((_, turn)) = first else {
            return;
        };
        let Some(p) = self.pending_starts.remove(k) else {
            return;
        };
        self.ledger.sub(instance, 0, 1, p.bytes);
        turn.held += RECORD_BYTES + p.model.len() + p.platform.len();
        let mut a = Attrs::with_capacity(2);
        a.shared("gen_ai.request.model", &p.model)
            .shared("hermes.platform", &p.platform);
        turn.events.push(span::Event {
            time_unix_nano: p.at,
            name: Str::from_static("hermes.session.start"),
            attributes: a.0,
            dropped_attributes_count: 0,
        });
        turn.start = turn.start.min(p.at);
        // The turn now holds the start's event: it needs its record.
        turn.min_lsn = turn.min_lsn.min(p.min_lsn);
        fair::charge(turn, &mut self.ledger);
    }

    /// A new turn of a session starts: an agent runs its turns one after the
    /// other, so a turn of the same session and agent process still open
    /// ended without `on_session_end` (Hermes' failure paths fire none).
    pub(crate) fn close_superseded(
        &mut self,
        ids: &view::Ids<'_>,
        instance_id: &str,
        out: &mut Vec<FinishedSpan>,
    ) {
        if ids.session_id.is_empty() {
            return;
        }
        let k = self.keys.of(instance_id, ids.turn_id);
        if self.turns.contains_key(k) || self.closed.contains(k) {
            return;
        }
        let ended = sorted_keys(&self.turns, |_, turn| {
            turn.session_id == ids.session_id && turn.instance == instance_id
        });
        for id in ended {
            if let Some(turn) = self.take_turn(&id) {
                let incomplete = turn.end.is_none();
                let end = turn.end.unwrap_or(turn.last_seen);
                self.emit_turn(turn, end, incomplete, out);
            }
        }
    }

    /// `on_session_finalize`/`reset` (or the shutdown `on_session_end`): closes
    /// every open turn of the session of the shim instance (every turn of
    /// the instance when the session id is absent).
    pub(crate) fn close_session(
        &mut self,
        session_id: &str,
        instance_id: &str,
        t: u64,
        out: &mut Vec<FinishedSpan>,
    ) {
        let ids = sorted_keys(&self.turns, |_, turn| {
            turn.instance == instance_id && (session_id.is_empty() || turn.session_id == session_id)
        });
        for id in ids {
            if let Some(turn) = self.take_turn(&id) {
                let incomplete = turn.end.is_none();
                let end = turn.end.unwrap_or(t);
                self.emit_turn(turn, end, incomplete, out);
            }
        }
    }
}
