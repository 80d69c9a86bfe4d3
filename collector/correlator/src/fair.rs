//! Per-agent ownership and budgets of the correlation state.
//!
//! Owns what keeps one agent process (shim instance) from reaching into or
//! crowding out another's state:
//!
//! * every map of correlation state is keyed by [`key`] (instance, id), so
//!   an event only ever touches what its own instance opened;
//! * budgets on what each instance holds (`ledger.rs`): open turns,
//!   sessions (pending session starts and subagent links) and approximate
//!   bytes. An instance over its own budget loses its own oldest state;
//!   over a global budget, the instance holding the most loses its oldest,
//!   never a lighter one;
//! * the turns closed recently, and the owner of each turn id's plain
//!   (unscoped) trace id, so that no two spans ever share a trace id and
//!   span id: `closed.rs`.

use hermes_span::Str;

use crate::ledger::{Agent, Ledger, Measure};
use crate::oldest::ByAge;
use crate::{Correlator, FinishedSpan, Map, PendingSessionStart, SubagentLink, Turn};

/// Bytes a turn, attempt, tool, approval, event or session record costs
/// besides its strings (the maps' slots and the structs): an estimate, so
/// that a flood of empty ids still counts.
pub(crate) const RECORD_BYTES: usize = 128;
/// A turn's own struct and maps.
pub(crate) const TURN_BYTES: usize = 1024;

/// The key of an instance's state for `id`: the instance's length, so
/// that no pair of strings can make another pair's key.
pub(crate) fn key(instance: &str, id: &str) -> String {
    let mut k = String::with_capacity(instance.len() + id.len() + 8);
    write_key(&mut k, instance, id);
    k
}

/// A buffer the lookups of every event build their [`key`] in, so that a
/// lookup allocates nothing: an event is looked up two to three times, and
/// a key string per lookup would be a fifth of the collector's allocations
/// (`docs/BENCHMARKS.md`).
#[derive(Debug, Default)]
pub(crate) struct KeyBuf(String);

impl KeyBuf {
    /// [`key`]`(instance, id)`, in the buffer.
    pub(crate) fn of(&mut self, instance: &str, id: &str) -> &str {
        self.0.clear();
        write_key(&mut self.0, instance, id);
        &self.0
    }
}

fn write_key(k: &mut String, instance: &str, id: &str) {
    k.push_str(itoa::Buffer::new().format(instance.len()));
    k.push(':');
    k.push_str(instance);
    k.push_str(id);
}

/// A budget [`Correlator::enforce_budgets`] keeps: what it reads of a
/// usage (an instance's or the total), its limits, and how an instance's
/// oldest state goes (false: nothing left to evict).
struct Budget {
    measure: Measure,
    per_agent: usize,
    all: usize,
    evict: fn(&mut Correlator, &str, &mut Vec<FinishedSpan>) -> bool,
}

/// Which budget an eviction enforces (its counter).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Reason {
    Turns,
    Bytes,
}

impl Correlator {
    /// Enforces the session and byte budgets after an event of `instance`:
    /// the instance over its own budget loses its own oldest state; over a
    /// global one, the instance holding the most loses its oldest.
    pub(crate) fn enforce_budgets(&mut self, instance: &str, out: &mut Vec<FinishedSpan>) {
        let c = &self.config;
        let budgets = [
            Budget {
                measure: Measure::Sessions,
                per_agent: c.max_sessions_per_agent,
                all: c.max_sessions,
                evict: Self::evict_oldest_session,
            },
            Budget {
                measure: Measure::Bytes,
                per_agent: c.max_bytes_per_agent,
                all: c.max_bytes,
                evict: Self::evict_oldest_state,
            },
        ];
        for budget in &budgets {
            self.enforce(instance, budget, out);
        }
    }

    fn enforce(&mut self, instance: &str, budget: &Budget, out: &mut Vec<FinishedSpan>) {
        // No agent holds more than all of them together: within the
        // per-agent limit in total, nobody's usage needs looking up.
        let measure = budget.measure;
        while measure.of(&self.ledger.total) > budget.per_agent
            && measure.of(&self.ledger.of(instance)) > budget.per_agent
        {
            if !(budget.evict)(self, instance, out) {
                break;
            }
        }
        while measure.of(&self.ledger.total) > budget.all {
            let Some(heaviest) = self.ledger.heaviest(measure, budget.all) else {
                break;
            };
            if !(budget.evict)(self, &heaviest, out) {
                break;
            }
        }
    }

    /// Makes room for one more turn of `instance`: its own oldest when it is
    /// at its limit; at the global limit, the oldest of the instance with
    /// the most open turns.
    pub(crate) fn make_room_for_turn(&mut self, instance: &str, out: &mut Vec<FinishedSpan>) {
        if self.ledger.of(instance).turns >= self.config.max_open_turns_per_agent {
            self.evict_oldest_turn(instance, Reason::Turns, out);
        }
        let limit = self.config.max_open_turns;
        if self.turns.len() >= limit
            && let Some(heaviest) = self.ledger.heaviest(Measure::Turns, limit)
        {
            self.evict_oldest_turn(&heaviest, Reason::Turns, out);
        }
    }

    /// Evicts `instance`'s least recently active turn, else its oldest
    /// session record. False when it holds neither.
    fn evict_oldest_state(&mut self, instance: &str, out: &mut Vec<FinishedSpan>) -> bool {
        self.evict_oldest_turn(instance, Reason::Bytes, out)
            || self.evict_oldest_session(instance, out)
    }

    /// Records that `instance` opens the record `id` of `kind` at `t`
    /// (before storing it), once its records of that kind are kept by age;
    /// `id` becomes a [`Str`] only then.
    pub(crate) fn track(&mut self, kind: Kind, instance: &str, t: u64, id: impl Into<Str>) {
        if self.ledger.tracking == 0 {
            return;
        }
        let Some(agent) = self.ledger.agents.get_mut(instance) else {
            return;
        };
        let (keys, usage) = (&mut self.keys, agent.usage);
        match kind {
            Kind::Turn => {
                if let Some(by_age) = &mut agent.turns {
                    let now = seen(&self.turns, keys, instance);
                    by_age.push(t, id.into(), usage.turns, now);
                }
            }
            Kind::Start => {
                if let Some(by_age) = &mut agent.starts {
                    let now = seen(&self.pending_starts, keys, instance);
                    by_age.push(t, id.into(), usage.sessions, now);
                }
            }
            Kind::Link => {
                if let Some(by_age) = &mut agent.links {
                    let now = seen(&self.links, keys, instance);
                    by_age.push(t, id.into(), usage.sessions, now);
                }
            }
        }
    }

    /// Near a global limit (a global budget keeps the agents by weight),
    /// every agent keeps its open records by age: the agents evicted are
    /// then many, often each holding one record, and building each one's
    /// heaps at its first eviction would visit every open record for each
    /// of them. Built here in one visit of all open records; an agent new
    /// meanwhile starts with empty heaps (`Ledger::add`).
    fn keep_all_by_age(&mut self) {
        let ledger = &mut self.ledger;
        if !ledger.weighing() || ledger.all_by_age {
            return;
        }
        ledger.all_by_age = true;
        for agent in ledger.agents.values_mut() {
            ledger.tracking += usize::from(!agent.tracks());
            agent.keep_by_age();
        }
        let agents = &mut ledger.agents;
        fill(agents, &self.turns, |a| &mut a.turns);
        fill(agents, &self.pending_starts, |a| &mut a.starts);
        fill(agents, &self.links, |a| &mut a.links);
    }

    /// Closes `instance`'s least recently active turn as incomplete.
    pub(crate) fn evict_oldest_turn(
        &mut self,
        instance: &str,
        reason: Reason,
        out: &mut Vec<FinishedSpan>,
    ) -> bool {
        self.keep_all_by_age();
        let Some(agent) = self.ledger.agents.get_mut(instance) else {
            return false;
        };
        self.ledger.tracking += usize::from(!agent.tracks());
        let turns = &self.turns;
        let oldest = agent
            .turns
            .get_or_insert_with(|| by_age(turns, instance))
            .oldest(seen(turns, &mut self.keys, instance));
        let Some(turn) = oldest.and_then(|(_, id)| self.take_turn_of(instance, &id)) else {
            return false;
        };
        self.stats.turns_evicted += 1;
        if reason == Reason::Bytes {
            self.stats.turns_evicted_for_bytes += 1;
        }
        let end = turn.end.unwrap_or(turn.last_seen);
        self.emit_turn(turn, end, true, out);
        true
    }

    /// Forgets `instance`'s oldest session record: a session start not
    /// attached yet, or a subagent link (its subagent, when still open, is
    /// closed as incomplete first, so its span is emitted).
    fn evict_oldest_session(&mut self, instance: &str, out: &mut Vec<FinishedSpan>) -> bool {
        self.keep_all_by_age();
        let Some(agent) = self.ledger.agents.get_mut(instance) else {
            return false;
        };
        self.ledger.tracking += usize::from(!agent.tracks());
        let (starts, links, keys) = (&self.pending_starts, &self.links, &mut self.keys);
        let start = agent
            .starts
            .get_or_insert_with(|| by_age(starts, instance))
            .oldest(seen(starts, keys, instance));
        let link = agent
            .links
            .get_or_insert_with(|| by_age(links, instance))
            .oldest(seen(links, keys, instance));
        let taken = match (start, link) {
            (Some(s), Some(l)) if l < s => self.drop_link(&key(instance, &l.1), out),
            (Some(s), _) => self.drop_pending_start(&key(instance, &s.1)),
            (None, Some(l)) => self.drop_link(&key(instance, &l.1), out),
            (None, None) => false,
        };
        if taken {
            self.stats.sessions_evicted += 1;
        }
        taken
    }

    fn drop_link(&mut self, key: &str, out: &mut Vec<FinishedSpan>) -> bool {
        if let Some(end) = self.subagents.get(key).map(|s| s.start) {
            self.subagent_stop_at(key, &Default::default(), end, true, out);
        }
        self.remove_link(key)
    }

    pub(crate) fn drop_pending_start(&mut self, key: &str) -> bool {
        let held = self
            .pending_starts
            .remove(key)
            .map(|p| (p.instance, p.bytes));
        self.release_session(held)
    }

    pub(crate) fn remove_link(&mut self, key: &str) -> bool {
        let held = self.links.remove(key).map(|l| (l.instance, l.bytes));
        self.release_session(held)
    }

    /// Gives back to the ledger what a removed session entry (a pending
    /// start or a subagent link) of an instance held; false without one.
    fn release_session(&mut self, held: Option<(Str, usize)>) -> bool {
        let Some((instance, bytes)) = held else {
            return false;
        };
        self.ledger.sub(&instance, 0, 1, bytes);
        true
    }

    /// Charges the turn under `key` for what it grew by since it was last
    /// charged.
    pub(crate) fn charge_key(&mut self, key: &str) {
        if let Some(turn) = self.turns.get_mut(key) {
            charge(turn, &mut self.ledger);
        }
    }
}

/// Charges `turn`'s agent for what the turn grew (or shrank) by since it
/// was last charged.
pub(crate) fn charge(turn: &mut Turn, ledger: &mut Ledger) {
    if turn.held > turn.charged {
        ledger.add(&turn.instance, 0, 0, turn.held - turn.charged);
    } else if turn.held < turn.charged {
        ledger.sub(&turn.instance, 0, 0, turn.charged - turn.held);
    }
    turn.charged = turn.held;
}

/// The kinds of records an agent's budgets evict, each by age.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Kind {
    Turn,
    Start,
    Link,
}

/// An open record an agent's budgets evict by age: a turn, a session
/// start or a subagent link.
trait Aged {
    /// The instance that opened it.
    fn instance(&self) -> &Str;
    /// Its time in [`ByAge`]: when it was last active.
    fn time(&self) -> u64;
}

impl Aged for Turn {
    fn instance(&self) -> &Str {
        &self.instance
    }
    fn time(&self) -> u64 {
        self.last_seen
    }
}

impl Aged for PendingSessionStart {
    fn instance(&self) -> &Str {
        &self.instance
    }
    fn time(&self) -> u64 {
        self.at
    }
}

impl Aged for SubagentLink {
    fn instance(&self) -> &Str {
        &self.instance
    }
    fn time(&self) -> u64 {
        self.last_seen
    }
}

/// `instance`'s open records in `records` (keyed by [`key`]) by age.
fn by_age<V: Aged>(records: &Map<String, V>, instance: &str) -> ByAge {
    ByAge::of(
        records
            .iter()
            .filter(|(_, v)| v.instance().as_str() == instance)
            .map(|(k, v)| (v.time(), id_in(k, instance))),
    )
}

/// Adds every open record in `records` (keyed by [`key`]) to its agent's
/// heap of that kind (`heap`).
fn fill<V: Aged>(
    agents: &mut Map<String, Agent>,
    records: &Map<String, V>,
    heap: fn(&mut Agent) -> &mut Option<ByAge>,
) {
    for (k, v) in records {
        let instance = v.instance();
        if let Some(by_age) = agents
            .get_mut(instance.as_str())
            .and_then(|a| heap(a).as_mut())
        {
            by_age.insert(v.time(), id_in(k, instance));
        }
    }
}

/// The id in `instance`'s [`key`] `k`.
fn id_in(k: &str, instance: &str) -> Str {
    // A key is the instance's length, `:`, the instance, then the id.
    let prefix = itoa::Buffer::new().format(instance.len()).len() + 1 + instance.len();
    Str::from(k.get(prefix..).unwrap_or_default())
}

/// The time of `instance`'s open record by its id in `records` (keyed by
/// [`key`]): what [`ByAge`] checks its entries against.
fn seen<'a, V: Aged>(
    records: &'a Map<String, V>,
    keys: &'a mut KeyBuf,
    instance: &'a str,
) -> impl FnMut(&str) -> Option<u64> + 'a {
    move |id| records.get(keys.of(instance, id)).map(V::time)
}

#[cfg(test)]
mod tests {
    use hermes_e2e::events::{event, ids, session_ids, shim, turn_body};
    use hermes_proto::v1::ShimInfo as Shim;

    use super::{KeyBuf, key};
    use crate::oldest::ByAge;
    use crate::{Config, Correlator, Departure, FinishedSpan};

    /// A session of `agent`'s and its turn, opened at `t_ms`.
    fn open(
        c: &mut Correlator,
        out: &mut Vec<FinishedSpan>,
        agent: &Shim,
        session: &str,
        t_ms: u64,
    ) {
        let start = event("on_session_start", t_ms, session_ids(session), None);
        c.ingest(agent, &start, out);
        let turn = ids(session, "task", &format!("{session}:t"));
        c.ingest(agent, &event("pre_llm_call", t_ms, turn, turn_body()), out);
    }

    #[test]
    fn agents_keep_records_by_age_from_their_first_eviction_until_they_hold_nothing() {
        let mut c = Correlator::new(Config {
            max_open_turns_per_agent: 2,
            max_sessions_per_agent: 2,
            ..Config::default()
        });
        let mut out = Vec::new();
        let agents = [shim("inst-1"), shim("inst-2"), shim("inst-3")];
        for (n, agent) in agents.iter().enumerate() {
            // Within the budgets: nothing kept, nobody looked up.
            for i in 0..2 {
                open(&mut c, &mut out, agent, &format!("s{n}-{i}"), i);
            }
            assert_eq!(c.ledger.tracking, 0, "agent {n}");
        }
        for agent in &agents[..2] {
            for i in 2..5 {
                open(
                    &mut c,
                    &mut out,
                    agent,
                    &format!("{}-{i}", agent.instance_id),
                    i,
                );
            }
        }
        assert_eq!(c.stats().turns_evicted, 6);
        assert_eq!(c.ledger.tracking, 2, "the agents that evicted");
        let tracked = |c: &Correlator| c.ledger.agents.values().filter(|a| a.tracks()).count();
        assert_eq!(tracked(&c), 2);
        c.drop_instance("inst-1", Departure::HandedOff);
        assert_eq!((c.ledger.tracking, tracked(&c)), (1, 1));
        c.flush_all(&mut out);
        assert!(c.ledger.agents.is_empty());
        assert_eq!(c.ledger.tracking, 0);
    }

    #[test]
    fn near_a_global_limit_every_agent_keeps_records_by_age() {
        let mut c = Correlator::new(Config {
            max_open_turns: 4,
            ..Config::default()
        });
        let mut out = Vec::new();
        let agents: Vec<Shim> = (0..6).map(|n| shim(&format!("inst-{n}"))).collect();
        for (n, agent) in agents[..4].iter().enumerate() {
            open(&mut c, &mut out, agent, &format!("s{n}"), n as u64);
        }
        assert_eq!(c.ledger.tracking, 0, "at the limit, nothing evicted yet");
        // One turn each: the heaviest by the smallest id loses its turn,
        // and every agent keeps its records from then on, the new one too.
        open(&mut c, &mut out, &agents[4], "s4", 4);
        assert_eq!(c.stats().turns_evicted, 1);
        assert_eq!(c.ledger.of("inst-0").turns, 0);
        assert!(c.ledger.all_by_age);
        let tracked = |c: &Correlator| c.ledger.agents.values().filter(|a| a.tracks()).count();
        assert_eq!(
            (c.ledger.tracking, tracked(&c)),
            (4, 4),
            "inst-0 went empty"
        );
        let kept =
            |c: &Correlator, agent: &str| c.ledger.agents[agent].turns.as_ref().map(ByAge::len);
        assert_eq!(kept(&c, "inst-1"), Some(1), "built from its open turns");
        assert_eq!(kept(&c, "inst-4"), Some(1), "from its first turn");
        open(&mut c, &mut out, &agents[5], "s5", 5);
        assert_eq!(c.ledger.of("inst-1").turns, 0, "the next by id");
        assert_eq!(c.stats().turns_evicted, 2);
        // Under half the limit, a new agent keeps nothing until it evicts.
        c.flush_all(&mut out);
        assert!(!c.ledger.all_by_age);
        assert_eq!(c.ledger.tracking, 0);
        open(&mut c, &mut out, &agents[0], "s6", 6);
        assert_eq!(tracked(&c), 0);
    }

    #[test]
    fn a_key_is_the_instances_length_then_both_strings() {
        assert_eq!(key("ab", "c"), "2:abc");
        assert_eq!(key("a", "bc"), "1:abc");
        assert_eq!(key("", ""), "0:");
        let long = "i".repeat(1234);
        assert_eq!(key(&long, "t"), format!("1234:{long}t"));
    }

    #[test]
    fn the_buffer_builds_the_same_key_each_time() {
        let mut keys = KeyBuf::default();
        let long = "é".repeat(600);
        for (instance, id) in [
            ("instance", "turn"),
            ("", "x"),
            (long.as_str(), "t"),
            ("i", ""),
        ] {
            assert_eq!(keys.of(instance, id), key(instance, id));
        }
    }
}
