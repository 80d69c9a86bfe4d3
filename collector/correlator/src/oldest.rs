//! The least recently active of an agent's open records, found without
//! visiting the others.
//!
//! An agent at one of its limits loses its oldest open turn (or session
//! record) to every new one it opens. Found by visiting every open record
//! of every agent, an agent that keeps opening turns at its limit would
//! make each of its events cost what the whole collector holds; found
//! here, it costs a heap operation.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use hermes_span::Str;

/// Entries a heap may hold beyond twice its open records before the
/// closed records' entries are dropped: an agent with one open turn at a
/// time compacts every few turns, not on each.
const SLACK: usize = 16;

/// One agent's open records of one kind (turns, session starts or
/// subagent links) by (time, id), least recent first: a min-heap kept
/// lazily while the agent keeps it (`Agent`). A record is pushed whenever
/// it opens; afterwards its time only grows, and nothing is done when it
/// grows or when the record closes.
/// [`ByAge::oldest`] checks the top against the record itself: a closed
/// record's entry goes, an entry older than its record's time goes back
/// with the record's time. Every open record keeps an entry no later than
/// its time, so the first entry that matches its record is the oldest open
/// record, ties going to the smaller id.
#[derive(Debug, Default)]
pub(crate) struct ByAge(BinaryHeap<Reverse<(u64, Str)>>);

impl ByAge {
    /// The heap of the open records `(time, id)`.
    pub(crate) fn of(records: impl IntoIterator<Item = (u64, Str)>) -> Self {
        Self(records.into_iter().map(Reverse).collect())
    }

    /// Adds the open record `id` at `t`, as [`ByAge::of`] does.
    pub(crate) fn insert(&mut self, t: u64, id: Str) {
        self.0.push(Reverse((t, id)));
    }

    /// Records that the record `id` opens (or is replaced) at `t`, before
    /// it is stored; first drops the entries of closed records when they
    /// outnumber the `open` ones (this one included), `now` giving a stored
    /// open record's time (`None`: closed).
    pub(crate) fn push(
        &mut self,
        t: u64,
        id: Str,
        open: usize,
        now: impl FnMut(&str) -> Option<u64>,
    ) {
        if self.0.len() >= 2 * open + SLACK {
            self.compact(now);
        }
        self.0.push(Reverse((t, id)));
    }

    /// The time and id of the least recently active open record, `now`
    /// giving an open record's time (`None`: closed). Its entry stays:
    /// once the caller closes the record, the next call drops it.
    pub(crate) fn oldest(
        &mut self,
        mut now: impl FnMut(&str) -> Option<u64>,
    ) -> Option<(u64, Str)> {
        while let Some(Reverse((t, id))) = self.0.peek() {
            match now(id) {
                Some(current) if current == *t => return Some((current, id.clone())),
                Some(current) => {
                    if let Some(Reverse((_, id))) = self.0.pop() {
                        self.0.push(Reverse((current, id)));
                    }
                }
                None => {
                    self.0.pop();
                }
            }
        }
        None
    }

    /// Keeps one entry per open record, at its time: a record closed and
    /// opened again under the same id leaves one entry, not two.
    fn compact(&mut self, mut now: impl FnMut(&str) -> Option<u64>) {
        let mut entries: Vec<_> = std::mem::take(&mut self.0)
            .into_iter()
            .filter_map(|Reverse((_, id))| now(&id).map(|t| Reverse((t, id))))
            .collect();
        entries.sort_unstable();
        entries.dedup();
        self.0 = BinaryHeap::from(entries);
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    /// What the heap answers must be what a visit of every open record
    /// answers, whatever the records do in between.
    #[derive(Debug, Clone)]
    enum Step {
        Open(u8, u64),
        Touch(u8, u64),
        Close(u8),
        EvictOldest,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0u8..12, 0u64..50).prop_map(|(id, t)| Step::Open(id, t)),
            (0u8..12, 0u64..50).prop_map(|(id, t)| Step::Touch(id, t)),
            (0u8..12).prop_map(Step::Close),
            Just(Step::EvictOldest),
        ]
    }

    proptest! {
        #[test]
        fn the_oldest_is_what_a_visit_of_every_record_finds(
            steps in proptest::collection::vec(step(), 0..200),
        ) {
            // Kept from the first eviction on, as the correlator keeps it.
            let mut open: BTreeMap<String, u64> = BTreeMap::new();
            let mut heap: Option<ByAge> = None;
            for step in steps {
                match step {
                    Step::Open(id, t) => {
                        let id = format!("r{id}");
                        let records = &open;
                        if let Some(heap) = &mut heap {
                            heap.push(t, Str::from(id.as_str()), records.len() + 1, |id| {
                                records.get(id).copied()
                            });
                            prop_assert!(heap.len() <= 2 * (records.len() + 1) + SLACK);
                        }
                        open.insert(id, t);
                    }
                    Step::Touch(id, t) => {
                        if let Some(seen) = open.get_mut(&format!("r{id}")) {
                            *seen = (*seen).max(t);
                        }
                    }
                    Step::Close(id) => {
                        open.remove(&format!("r{id}"));
                    }
                    Step::EvictOldest => {
                        let visit = open.iter().map(|(id, t)| (*t, id.clone())).min();
                        let records = &open;
                        let found = heap
                            .get_or_insert_with(|| {
                                ByAge::of(records.iter().map(|(id, t)| (*t, Str::from(id.as_str()))))
                            })
                            .oldest(|id| records.get(id).copied())
                            .map(|(t, id)| (t, id.as_str().to_owned()));
                        prop_assert_eq!(&found, &visit);
                        if let Some((_, id)) = found {
                            open.remove(&id);
                        }
                    }
                }
            }
        }
    }
}
