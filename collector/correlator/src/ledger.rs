//! What each agent holds, and which agent holds the most.
//!
//! Owns the budgets' accounts ([`Ledger`]): per instance its open turns,
//! sessions (pending session starts and subagent links) and approximate
//! bytes, and their totals. Over a global budget the agent holding the most
//! loses its oldest state; found by visiting every agent, each new turn
//! (each event, for the bytes) of a collector at a global limit would cost
//! as much as it has agents. [`ByWeight`] orders the agents instead, kept
//! only while the collector is near that limit, so that a collector within
//! its budgets pays nothing for it.

use std::cmp::Reverse;
use std::collections::BTreeSet;

use hermes_span::Str;

use crate::Map;
use crate::oldest::ByAge;

/// What one instance holds.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Usage {
    pub turns: usize,
    pub sessions: usize,
    pub bytes: usize,
}

impl Usage {
    fn is_empty(&self) -> bool {
        self.turns == 0 && self.sessions == 0 && self.bytes == 0
    }

    fn add(&mut self, turns: usize, sessions: usize, bytes: usize) {
        self.turns += turns;
        self.sessions += sessions;
        self.bytes += bytes;
    }

    fn sub(&mut self, turns: usize, sessions: usize, bytes: usize) {
        self.turns = self.turns.saturating_sub(turns);
        self.sessions = self.sessions.saturating_sub(sessions);
        self.bytes = self.bytes.saturating_sub(bytes);
    }
}

/// What a budget reads of a [`Usage`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Measure {
    Turns,
    Sessions,
    Bytes,
}

impl Measure {
    pub(crate) fn of(self, usage: &Usage) -> usize {
        match self {
            Self::Turns => usage.turns,
            Self::Sessions => usage.sessions,
            Self::Bytes => usage.bytes,
        }
    }
}

/// What one instance holds, and its open records by how recently they
/// were active (the ones its budgets evict first): kept from the first
/// eviction of their kind on, built then from the open records, so that an
/// agent within its budgets costs nothing here; near a global limit, kept
/// for every agent ([`Ledger::all_by_age`]).
#[derive(Debug, Default)]
pub(crate) struct Agent {
    pub usage: Usage,
    pub turns: Option<ByAge>,
    pub starts: Option<ByAge>,
    pub links: Option<ByAge>,
    /// The instance id, shared by its entries in [`ByWeight`]: made when
    /// it first gets one.
    id: Option<Str>,
}

impl Agent {
    pub(crate) fn tracks(&self) -> bool {
        self.turns.is_some() || self.starts.is_some() || self.links.is_some()
    }

    /// Keeps the agent's records by age from here on, in empty heaps.
    pub(crate) fn keep_by_age(&mut self) {
        self.turns = Some(ByAge::default());
        self.starts = Some(ByAge::default());
        self.links = Some(ByAge::default());
    }

    fn id(&mut self, instance: &str) -> Str {
        self.id.get_or_insert_with(|| Str::from(instance)).clone()
    }
}

/// The usage of every instance holding something, and the totals.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    pub agents: Map<String, Agent>,
    /// What all instances hold together.
    pub total: Usage,
    /// How many agents keep records by age: while none does, opening a
    /// record looks nobody up (`Correlator::track`).
    pub tracking: usize,
    /// Whether every agent keeps its records by age, an agent new
    /// meanwhile from its first record on: set near a global limit
    /// (`Correlator::keep_all_by_age`), until no index is kept.
    pub all_by_age: bool,
    /// The agents by each measure (turns, sessions, bytes), while kept.
    heavy: [Option<ByWeight>; 3],
    /// Whether any of them is kept: while none is, a change of usage
    /// moves nothing.
    weighing: bool,
}

impl Ledger {
    pub fn of(&self, instance: &str) -> Usage {
        self.agents
            .get(instance)
            .map(|a| a.usage)
            .unwrap_or_default()
    }

    pub fn add(&mut self, instance: &str, turns: usize, sessions: usize, bytes: usize) {
        let agent = match self.agents.get_mut(instance) {
            Some(agent) => agent,
            None => {
                let mut agent = Agent::default();
                if self.all_by_age {
                    agent.keep_by_age();
                    self.tracking += 1;
                }
                self.agents.entry(instance.to_owned()).or_insert(agent)
            }
        };
        let before = agent.usage;
        agent.usage.add(turns, sessions, bytes);
        self.total.add(turns, sessions, bytes);
        if self.weighing {
            self.weighing = reweigh(&mut self.heavy, &self.total, instance, agent, before);
            self.all_by_age &= self.weighing;
        }
    }

    /// Takes back what `instance` held, at most all of it: the total stays
    /// the sum of the agents' usage, which
    /// `Correlator::enforce_budgets` relies on.
    pub fn sub(&mut self, instance: &str, turns: usize, sessions: usize, bytes: usize) {
        let Some(agent) = self.agents.get_mut(instance) else {
            return;
        };
        let before = agent.usage;
        agent.usage.sub(turns, sessions, bytes);
        let u = agent.usage;
        self.total.sub(
            before.turns - u.turns,
            before.sessions - u.sessions,
            before.bytes - u.bytes,
        );
        if self.weighing {
            self.weighing = reweigh(&mut self.heavy, &self.total, instance, agent, before);
            self.all_by_age &= self.weighing;
        }
        if u.is_empty() && self.agents.remove(instance).is_some_and(|a| a.tracks()) {
            self.tracking -= 1;
        }
    }

    /// Whether a global budget keeps the agents by weight: the collector
    /// is near a global limit.
    pub fn weighing(&self) -> bool {
        self.weighing
    }

    /// The instance holding the most by `measure` (ties: the smallest id,
    /// so that the choice does not depend on the map's order), asked by a
    /// budget of `limit` that the total is over. The agents are ordered by
    /// `measure` from the first call on, until the total falls to half the
    /// limit.
    pub fn heaviest(&mut self, measure: Measure, limit: usize) -> Option<Str> {
        self.weighing = true;
        let index = &mut self.heavy[measure as usize];
        let by = match index {
            Some(by) => by,
            None => index.insert(ByWeight::of(
                measure,
                limit / 2,
                self.agents
                    .iter_mut()
                    .map(|(instance, agent)| (measure.of(&agent.usage), agent.id(instance))),
            )),
        };
        by.first()
    }
}

/// Moves `agent`'s entries in the kept indexes from what it held
/// (`before`) to what it holds, and drops an index whose measure's total
/// fell to its release point. Whether any index is still kept.
fn reweigh(
    heavy: &mut [Option<ByWeight>; 3],
    total: &Usage,
    instance: &str,
    agent: &mut Agent,
    before: Usage,
) -> bool {
    let after = agent.usage;
    for index in heavy.iter_mut() {
        let Some(by) = index else { continue };
        if by.measure.of(total) <= by.release {
            *index = None;
        } else {
            by.moved(|| agent.id(instance), &before, &after);
        }
    }
    heavy.iter().any(Option::is_some)
}

/// The agents holding any of one measure, the most first (ties: the
/// smallest id): exact, each change of an agent's usage moving its entry.
#[derive(Debug)]
struct ByWeight {
    measure: Measure,
    /// The total at or below which the index is no longer kept: half the
    /// limit it was built for, so that a collector hovering at its limit
    /// does not build it again and again.
    release: usize,
    order: BTreeSet<(Reverse<usize>, Str)>,
}

impl ByWeight {
    fn of(measure: Measure, release: usize, agents: impl Iterator<Item = (usize, Str)>) -> Self {
        let order = agents
            .filter(|(weight, _)| *weight > 0)
            .map(|(weight, id)| (Reverse(weight), id))
            .collect();
        Self {
            measure,
            release,
            order,
        }
    }

    fn first(&self) -> Option<Str> {
        self.order.first().map(|(_, id)| id.clone())
    }

    /// Moves the entry of the agent `id` from what it held to what it
    /// holds.
    fn moved(&mut self, id: impl FnOnce() -> Str, before: &Usage, after: &Usage) {
        let (was, is) = (self.measure.of(before), self.measure.of(after));
        if was == is {
            return;
        }
        let id = id();
        if was > 0 {
            self.order.remove(&(Reverse(was), id.clone()));
        }
        if is > 0 {
            self.order.insert((Reverse(is), id));
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn the_total_stays_the_sum_of_the_agents() {
        // Budgets skip looking an agent up while the total is within the
        // per-agent limit: taking back more than an agent held must not
        // take the rest from the others' share of the total.
        let mut ledger = Ledger::default();
        ledger.add("a", 1, 1, 10);
        ledger.add("b", 0, 0, 5);
        ledger.sub("a", 2, 1, 25);
        ledger.sub("gone", 1, 1, 1);
        assert_eq!(
            (
                ledger.total.turns,
                ledger.total.sessions,
                ledger.total.bytes
            ),
            (0, 0, 5)
        );
        assert_eq!(ledger.of("b").bytes, 5);
        assert_eq!(ledger.of("a").bytes, 0);
    }

    /// The heaviest agent by a visit of every agent.
    fn by_visit(ledger: &Ledger, measure: Measure) -> Option<String> {
        ledger
            .agents
            .iter()
            .filter(|(_, a)| measure.of(&a.usage) > 0)
            .max_by(|a, b| {
                measure
                    .of(&a.1.usage)
                    .cmp(&measure.of(&b.1.usage))
                    .then_with(|| b.0.cmp(a.0))
            })
            .map(|(i, _)| i.clone())
    }

    #[derive(Debug, Clone)]
    enum Step {
        Add(u8, usize, usize, usize),
        Sub(u8, usize, usize, usize),
        Heaviest(u8, usize),
    }

    fn step() -> impl Strategy<Value = Step> {
        let agent = 0u8..6;
        prop_oneof![
            (agent.clone(), 0usize..3, 0usize..3, 0usize..300)
                .prop_map(|(a, t, s, b)| Step::Add(a, t, s, b)),
            (agent, 0usize..3, 0usize..3, 0usize..300)
                .prop_map(|(a, t, s, b)| Step::Sub(a, t, s, b)),
            (0u8..3, 0usize..20).prop_map(|(m, limit)| Step::Heaviest(m, limit)),
        ]
    }

    proptest! {
        #[test]
        fn the_heaviest_is_what_a_visit_of_every_agent_finds(
            steps in proptest::collection::vec(step(), 0..300),
        ) {
            let measures = [Measure::Turns, Measure::Sessions, Measure::Bytes];
            let mut ledger = Ledger::default();
            for step in steps {
                match step {
                    Step::Add(a, t, s, b) => ledger.add(&format!("agent-{a}"), t, s, b),
                    Step::Sub(a, t, s, b) => ledger.sub(&format!("agent-{a}"), t, s, b),
                    Step::Heaviest(m, limit) => {
                        let measure = measures[usize::from(m)];
                        let visit = by_visit(&ledger, measure);
                        let found = ledger.heaviest(measure, limit);
                        prop_assert_eq!(found.as_ref().map(Str::as_str), visit.as_deref());
                    }
                }
            }
        }
    }

    #[test]
    fn an_index_is_kept_until_its_total_falls_to_half_the_limit() {
        let mut ledger = Ledger::default();
        for agent in ["a", "b", "c"] {
            ledger.add(agent, 2, 0, 0);
        }
        let kept = |l: &Ledger| l.heavy[Measure::Turns as usize].is_some();
        assert!(!kept(&ledger), "built only when a budget asks");
        assert_eq!(ledger.heaviest(Measure::Turns, 5).as_deref(), Some("a"));
        assert!(kept(&ledger));
        ledger.sub("a", 2, 0, 0);
        assert_eq!(ledger.heaviest(Measure::Turns, 5).as_deref(), Some("b"));
        ledger.sub("b", 1, 0, 0);
        assert!(kept(&ledger), "3 open turns are above half of 5");
        ledger.sub("c", 1, 0, 0);
        assert!(!kept(&ledger), "2 are not");
        assert!(!ledger.weighing);
        assert_eq!(ledger.heaviest(Measure::Turns, 5).as_deref(), Some("b"));
    }
}
