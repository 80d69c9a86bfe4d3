//! Sessions: session starts waiting for their turn, superseded turns,
//! closing a session's turns, and the index of open turns by session.

use std::hash::{Hash, Hasher};

use smallvec::SmallVec;

use super::*;

/// The ids of the open turns of each agent's session that has any, by
/// instance and session id. A new turn supersedes its session's open
/// turns, a session's end closes them and its start attaches to the
/// earliest: found here, such an event costs what its session holds, not a
/// visit of every open turn of every agent (a central collector holds
/// thousands). Kept by [`Correlator::take_turn`] and the turn's opening
/// (`turns.rs`), and by [`Correlator::drop_instance`]. An entry holds the
/// turn's own shared ids, and a session's one open turn inline: keeping
/// it allocates nothing per turn.
#[derive(Debug, Default)]
pub(crate) struct SessionTurns(Map<SessionKey, SmallVec<[Str; 1]>>);

/// An agent's session: its instance and session id, shared with its turns.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct SessionKey {
    instance: Str,
    session_id: Str,
}

impl Hash for SessionKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        SessionRef(&self.instance, &self.session_id).hash(state);
    }
}

/// A [`SessionKey`] looked up by borrowed texts.
#[derive(Hash)]
struct SessionRef<'a>(&'a str, &'a str);

impl hashbrown::Equivalent<SessionKey> for SessionRef<'_> {
    fn equivalent(&self, key: &SessionKey) -> bool {
        self.0 == key.instance.as_str() && self.1 == key.session_id.as_str()
    }
}

impl SessionTurns {
    /// Records an open turn (a turn without a session id is not indexed).
    pub(crate) fn add(&mut self, turn: &Turn) {
        if turn.session_id.is_empty() {
            return;
        }
        let at = SessionRef(&turn.instance, &turn.session_id);
        match self.0.get_mut(&at) {
            Some(ids) => ids.push(turn.turn_id.clone()),
            None => {
                let key = SessionKey {
                    instance: turn.instance.clone(),
                    session_id: turn.session_id.clone(),
                };
                self.0
                    .insert(key, SmallVec::from_elem(turn.turn_id.clone(), 1));
            }
        }
    }

    /// Forgets a turn that is no longer open.
    pub(crate) fn remove(&mut self, turn: &Turn) {
        let at = SessionRef(&turn.instance, &turn.session_id);
        if let Some(ids) = self.0.get_mut(&at) {
            if let Some(i) = ids.iter().position(|id| *id == turn.turn_id) {
                ids.swap_remove(i);
            }
            if ids.is_empty() {
                self.0.remove(&at);
            }
        }
    }

    /// The ids of the open turns of `instance`'s session `session_id`.
    pub(crate) fn turn_ids(&self, instance: &str, session_id: &str) -> &[Str] {
        self.0
            .get(&SessionRef(instance, session_id))
            .map_or(&[], |ids| ids.as_slice())
    }

    /// The keys of the open turns of `instance`'s session `session_id`,
    /// sorted (the order the correlator closes them in).
    pub(crate) fn turn_keys(&self, instance: &str, session_id: &str) -> Vec<String> {
        let mut keys: Vec<String> = self
            .turn_ids(instance, session_id)
            .iter()
            .map(|id| key(instance, id))
            .collect();
        keys.sort();
        keys
    }

    /// How many turns are indexed.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.0.values().map(|ids| ids.len()).sum()
    }
}

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
        self.track(Kind::Start, instance, t, session_id);
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
        // The earliest by start, then by key: an agent's keys differ only
        // in their turn ids, which order them alike.
        let first = self
            .session_turns
            .turn_ids(instance, session_id)
            .iter()
            .filter_map(|id| {
                let turn = self.turns.get(self.keys.of(instance, id))?;
                Some((turn.start, id))
            })
            .min();
        let Some((_, first)) = first else {
            return;
        };
        let first = first.clone();
        let Some(p) = self
            .pending_starts
            .remove(self.keys.of(instance, session_id))
        else {
            return;
        };
        let Some(turn) = self.turns.get_mut(self.keys.of(instance, &first)) else {
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
        let ended = self.session_turns.turn_keys(instance_id, ids.session_id);
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
        let ids = if session_id.is_empty() {
            sorted_keys(&self.turns, |_, turn| turn.instance == instance_id)
        } else {
            self.session_turns.turn_keys(instance_id, session_id)
        };
        for id in ids {
            if let Some(turn) = self.take_turn(&id) {
                let incomplete = turn.end.is_none();
                let end = turn.end.unwrap_or(t);
                self.emit_turn(turn, end, incomplete, out);
            }
        }
    }
}
