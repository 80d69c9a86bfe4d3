//! Deduplication of redelivered events by (shim instance, seq).
//!
//! A shim sends its events in strictly increasing `seq` order on one stream
//! and, after a reconnect, resends its unacknowledged batches in the same
//! order before anything new. So every event at or below the highest `seq`
//! already seen from an instance is a redelivery. Gaps (events the shim
//! dropped) are allowed.
//!
//! The table is bounded: past `max_instances` the least recently seen
//! instance is forgotten (a redelivery from it would then be correlated
//! again, which the deterministic span ids make idempotent at the backend).

use std::collections::HashMap;

/// High-water marks of `seq` per shim instance.
#[derive(Debug)]
pub struct SeqFilter {
    max_instances: usize,
    clock: u64,
    seen: HashMap<String, (u64, u64)>,
    duplicates: u64,
}

impl SeqFilter {
    pub fn new(max_instances: usize) -> Self {
        Self {
            max_instances: max_instances.max(1),
            clock: 0,
            seen: HashMap::new(),
            duplicates: 0,
        }
    }

    /// True when `seq` from `instance` is new; false for a redelivery.
    pub fn admit(&mut self, instance: &str, seq: u64) -> bool {
        self.clock += 1;
        if let Some((high, used)) = self.seen.get_mut(instance) {
            *used = self.clock;
            if seq <= *high {
                self.duplicates += 1;
                return false;
            }
            *high = seq;
            return true;
        }
        if self.seen.len() >= self.max_instances {
            let oldest = self
                .seen
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                self.seen.remove(&k);
            }
        }
        self.seen.insert(instance.to_owned(), (seq, self.clock));
        true
    }

    /// Events refused as redeliveries so far.
    pub fn duplicates(&self) -> u64 {
        self.duplicates
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redeliveries_are_refused_and_gaps_allowed() {
        let mut f = SeqFilter::new(8);
        assert!(f.admit("a", 1));
        assert!(f.admit("a", 2));
        assert!(f.admit("a", 5));
        assert!(!f.admit("a", 2));
        assert!(!f.admit("a", 5));
        assert!(f.admit("b", 1));
        assert!(f.admit("a", 6));
        assert_eq!(f.duplicates(), 2);
    }

    #[test]
    fn table_is_bounded() {
        let mut f = SeqFilter::new(2);
        assert!(f.admit("a", 1));
        assert!(f.admit("b", 1));
        assert!(f.admit("c", 1));
        assert_eq!(f.seen.len(), 2);
        assert!(!f.seen.contains_key("a"));
    }
}
