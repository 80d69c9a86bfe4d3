//! Resources and turns: finding, opening (or synthesizing) and taking the
//! turn an event belongs to.

use std::hash::BuildHasher as _;

use hashbrown::hash_map::RawEntryMut;

use super::*;

/// What the handlers of one event read: the agent (shim instance) that
/// sent it, its ids, its time and the platform its body names ("" when
/// none); and the shim and schema version its agent's resource is found
/// by, taken only where state that holds it opens
/// ([`Correlator::resource`]): most events touch open state and need none.
#[derive(Clone, Copy)]
pub(crate) struct At<'a> {
    pub(crate) instance: &'a str,
    pub(crate) ids: &'a view::Ids<'a>,
    pub(crate) shim: &'a v1::ShimInfo,
    pub(crate) schema_version: &'a str,
    pub(crate) t: u64,
    pub(crate) platform: &'a str,
}

/// An open turn lent to an event's handler: what the handler changes in
/// its held bytes is charged to its agent's ledger when the loan ends, so
/// the event needs no second lookup of the turn to charge it.
pub(crate) struct TurnMut<'a> {
    turn: &'a mut Turn,
    ledger: &'a mut Ledger,
}

impl std::ops::Deref for TurnMut<'_> {
    type Target = Turn;

    fn deref(&self) -> &Turn {
        self.turn
    }
}

impl std::ops::DerefMut for TurnMut<'_> {
    fn deref_mut(&mut self) -> &mut Turn {
        self.turn
    }
}

impl Drop for TurnMut<'_> {
    fn drop(&mut self) {
        fair::charge(self.turn, self.ledger);
    }
}

impl Correlator {
    /// Makes the agent's resource on its first event (from that event's
    /// schema version, whichever later event opens state that holds it,
    /// so the resource does not depend on the order events arrive in),
    /// without taking a reference to it: most events hold none.
    pub(crate) fn note_resource(&mut self, shim: &v1::ShimInfo, schema_version: &str) {
        if self.last_resource(shim).is_none() {
            self.resource(shim, schema_version);
        }
    }

    /// The agent's resource, made on its first event.
    pub(crate) fn resource(&mut self, shim: &v1::ShimInfo, schema_version: &str) -> Arc<Resource> {
        if let Some(resource) = self.last_resource(shim) {
            return resource.clone();
        }
        let resource = self.resource_entry(shim, schema_version);
        match &mut self.last_resource {
            Some((instance, last)) => {
                instance.clone_from(&shim.instance_id);
                *last = resource.clone();
            }
            None => self.last_resource = Some((shim.instance_id.clone(), resource.clone())),
        }
        resource
    }

    /// The resource of the last event's agent, when `shim` is that agent.
    fn last_resource(&self, shim: &v1::ShimInfo) -> Option<&Arc<Resource>> {
        self.last_resource
            .as_ref()
            .filter(|(instance, _)| *instance == shim.instance_id)
            .map(|(_, resource)| resource)
    }

    /// The instance's resource from `resources`, made on its first event.
    fn resource_entry(&mut self, shim: &v1::ShimInfo, schema_version: &str) -> Arc<Resource> {
        if let Some(entry) = self.resources.get(&shim.instance_id) {
            return entry.resource.clone();
        }
        let mut a = Attrs::with_capacity(9);
        a.str(
            "service.name",
            if shim.service_name.is_empty() {
                "hermes-agent"
            } else {
                &shim.service_name
            },
        )
        .str("service.instance.id", &shim.instance_id)
        .str("host.name", &shim.host_name)
        .int("process.pid", i64::from(shim.pid))
        .str("telemetry.sdk.name", SCOPE_NAME)
        .fixed("telemetry.sdk.language", "rust")
        .str("telemetry.sdk.version", &self.config.sdk_version)
        .str("hermes.telemetry_schema_version", schema_version)
        .str("hermes.shim.version", &shim.shim_version)
        .str("hermes.capture", &shim.capture);
        let resource = Arc::new(Resource {
            attributes: a.0,
            dropped_attributes_count: 0,
        });
        self.resources.insert(
            shim.instance_id.clone(),
            ResourceEntry {
                resource: resource.clone(),
            },
        );
        resource
    }

    /// The open turn of the event's turn id of its agent, opened
    /// (synthesized) if unknown, recording the platform the event names.
    /// `None` when the event carries no turn id, or when that turn was
    /// closed already (the event is counted as late).
    pub(crate) fn turn(&mut self, at: At<'_>, out: &mut Vec<FinishedSpan>) -> Option<TurnMut<'_>> {
        self.turn_and_values(at, out).map(|(turn, _)| turn)
    }

    /// As [`Self::turn`], with the correlator's shared values for the span
    /// that the event closes.
    pub(crate) fn turn_and_values(
        &mut self,
        at: At<'_>,
        out: &mut Vec<FinishedSpan>,
    ) -> Option<(TurnMut<'_>, &mut Interner)> {
        let At {
            instance,
            ids,
            t,
            platform,
            ..
        } = at;
        if ids.turn_id.is_empty() {
            return None;
        }
        // The key is built and hashed once: nearly every event finds its
        // turn open, and its key (instance and turn id, 60-100 bytes) is the
        // longest the correlator hashes.
        let k = self.keys.of(instance, ids.turn_id);
        let hash = self.turns.hasher().hash_one(k);
        let open = self
            .turns
            .raw_entry()
            .from_key_hashed_nocheck(hash, k)
            .is_some();
        let turn = if open {
            match self.turns.raw_entry_mut().from_key_hashed_nocheck(hash, k) {
                RawEntryMut::Occupied(turn) => turn.into_mut(),
                RawEntryMut::Vacant(_) => return None,
            }
        } else {
            let k = key(instance, ids.turn_id);
            if self.closed.contains(&k) {
                self.stats.late_events_dropped += 1;
                self.closed_unit(instance, 0, self.max_lsn);
                return None;
            }
            self.make_room_for_turn(instance, out);
            let turn = self.new_turn(at);
            self.ledger.add(instance, 1, 0, turn.charged);
            self.session_turns.add(&turn);
            self.track(Kind::Turn, instance, turn.last_seen, &turn.turn_id);
            self.turns
                .raw_entry_mut()
                .from_key_hashed_nocheck(hash, &k)
                .insert(k, turn)
                .into_mut()
        };
        let (lsn, max_lsn) = (self.lsn, self.max_lsn);
        let clock = self.clock;
        turn.last_seen = turn.last_seen.max(t);
        turn.active_seen = turn.active_seen.max(t).max(clock);
        turn.min_lsn = turn.min_lsn.min(lsn);
        turn.max_lsn = turn.max_lsn.max(max_lsn);
        if turn.platform.is_empty() && !platform.is_empty() {
            turn.platform = self.values.get(platform);
            turn.held += platform.len();
        }
        if turn.task_id.is_empty() && !ids.task_id.is_empty() {
            turn.task_id = ids.task_id.into();
            turn.held += ids.task_id.len();
        }
        if t < turn.start && !turn.started {
            turn.start = t;
        }
        let turn = TurnMut {
            turn,
            ledger: &mut self.ledger,
        };
        Some((turn, &mut self.values))
    }

    pub(crate) fn new_turn(&mut self, at: At<'_>) -> Turn {
        let At {
            instance, ids, t, ..
        } = at;
        let resource = self.resource(at.shim, at.schema_version);
        let link = self
            .links
            .get_mut(self.keys.of(instance, ids.session_id))
            .map(|l| {
                l.last_seen = l.last_seen.max(t);
                l.clone()
            });
        // Shared: an agent's turns all hold its instance id.
        let instance = self.values.get(instance);
        let session_id: Str = ids.session_id.into();
        let mut plain = false;
        let (trace, parent, root_session, agent_name) = match &link {
            Some(l) => (
                l.trace_id,
                Some(l.span_id),
                l.root_session_id.clone(),
                l.role.clone(),
            ),
            None => {
                // The first instance to open a turn id gets its plain trace
                // id; another one, a trace id of its own.
                plain = self.closed.claim(ids.turn_id, &instance);
                let trace = if plain {
                    trace_id(ids.turn_id)
                } else {
                    self.stats.cross_instance_turns += 1;
                    scoped_trace_id(&instance, ids.turn_id)
                };
                (trace, None, session_id.clone(), Str::from_static("hermes"))
            }
        };
        let held = TURN_BYTES + 2 * ids.turn_id.len() + ids.session_id.len() + ids.task_id.len();
        Turn {
            trace_id: trace,
            span_id: span_id(SpanKey::Turn {
                turn_id: ids.turn_id,
            }),
            parent,
            resource,
            instance,
            plain,
            held,
            charged: held,
            turn_id: ids.turn_id.into(),
            task_id: ids.task_id.into(),
            session_id,
            root_session_id: root_session,
            platform: Str::default(),
            agent_name,
            model: Str::default(),
            start: t,
            started: false,
            end: None,
            end_seen: 0,
            max_child_end: 0,
            last_seen: t,
            active_seen: t.max(self.clock),
            clock_adjusted: false,
            completed: None,
            interrupted: None,
            end_reason: String::new(),
            api_attempts: 0,
            tool_calls: 0,
            input_tokens: 0,
            output_tokens: 0,
            events: Vec::new(),
            last_attempt_error: None,
            shared: SharedAttributes::default(),
            user_message: None,
            final_answer: None,
            requests: Map::default(),
            tools: Map::default(),
            approvals: Map::default(),
            min_lsn: self.lsn,
            max_lsn: self.max_lsn,
        }
    }

    /// [`Correlator::take_turn`] of `instance`'s turn `turn_id`, its key
    /// built in the lookup buffer.
    pub(crate) fn take_turn_of(&mut self, instance: &str, turn_id: &str) -> Option<Turn> {
        let mut keys = std::mem::take(&mut self.keys);
        let turn = self.take_turn(keys.of(instance, turn_id));
        self.keys = keys;
        turn
    }

    /// Removes an open turn by its key: its instance is refunded, and the
    /// turn is remembered as closed.
    pub(crate) fn take_turn(&mut self, k: &str) -> Option<Turn> {
        let turn = self.turns.remove(k)?;
        self.session_turns.remove(&turn);
        self.ledger.sub(&turn.instance, 1, 0, turn.charged);
        self.closed_unit(&turn.instance, turn.min_lsn, turn.max_lsn);
        let plain = turn.plain.then_some(turn.turn_id.as_str());
        self.closed.push(
            k,
            &turn.instance,
            plain,
            self.config.remembered_closed_turns,
        );
        Some(turn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_turn_an_event_changes_is_charged_for_it_before_the_next() {
        let shim = hermes_e2e::events::shim("inst-1");
        for name in hermes_e2e::ingest::FIXTURES {
            for events in hermes_e2e::ingest::fixture_events_both_levels(name) {
                let mut c = Correlator::new(Config::default());
                let mut out = Vec::new();
                for e in &events {
                    c.ingest(&shim, e, &mut out);
                    for (k, turn) in &c.turns {
                        assert_eq!(turn.charged, turn.held, "{name}, {}: {k}", e.hook);
                    }
                }
                assert!(!out.is_empty(), "{name}");
            }
        }
    }

    #[test]
    fn the_session_index_holds_every_open_turn_of_a_session() {
        let shims = [
            hermes_e2e::events::shim("inst-1"),
            hermes_e2e::events::shim("inst-2"),
        ];
        for name in hermes_e2e::ingest::FIXTURES {
            for events in hermes_e2e::ingest::fixture_events_both_levels(name) {
                let mut c = Correlator::new(Config::default());
                let mut out = Vec::new();
                // Two agents interleaved: the same ids, separate state.
                for e in &events {
                    for shim in &shims {
                        c.ingest(shim, e, &mut out);
                        for (k, turn) in &c.turns {
                            if turn.session_id.is_empty() {
                                continue;
                            }
                            let indexed =
                                c.session_turns.turn_keys(&turn.instance, &turn.session_id);
                            assert!(indexed.contains(k), "{name}, {}: {k}", e.hook);
                        }
                        let with_session = c
                            .turns
                            .values()
                            .filter(|t| !t.session_id.is_empty())
                            .count();
                        assert_eq!(c.session_turns.len(), with_session, "{name}, {}", e.hook);
                    }
                }
                c.drop_instance("inst-1", Departure::HandedOff);
                c.flush_all(&mut out);
                assert_eq!(c.session_turns.len(), 0, "{name}");
            }
        }
    }
}
