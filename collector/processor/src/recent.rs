//! The redaction's memos by address, with a direct-mapped cache in front.
//!
//! Owns [`AddressMemo`]: a hash map from a string's address and length to
//! what the rules said of it, the memo of record, behind a [`Recent`]
//! cache of one slot per hash of an address, holding the last address seen
//! there. Every attribute of every span asks the memos twice (its key's
//! verdict, whether its value is known clean), and the correlator's spans
//! bring the same few dozen static keys and shared values again and again:
//! a hit in the cache is a multiply, a load and a compare, where the map
//! hashes the address and probes a group. A miss, or another address in
//! the slot, asks the map.

use std::collections::HashMap;

/// A string's address and length: what the memos key on.
pub(crate) type Id = (usize, usize);

/// What was said of each [`Id`] remembered, looked up in a [`Recent`]
/// cache first.
#[derive(Debug, Default)]
pub(crate) struct AddressMemo<V: Copy> {
    map: HashMap<Id, V, foldhash::fast::RandomState>,
    recent: Recent<V>,
}

impl<V: Copy> AddressMemo<V> {
    /// What was remembered for `id`.
    pub(crate) fn get(&mut self, id: Id) -> Option<V> {
        if let Some(value) = self.recent.get(id) {
            return Some(value);
        }
        let value = *self.map.get(&id)?;
        self.recent.put(id, value);
        Some(value)
    }

    /// Remembers `value` for `id`.
    pub(crate) fn insert(&mut self, id: Id, value: V) {
        self.map.insert(id, value);
        self.recent.put(id, value);
    }

    /// Number of ids remembered.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Forgets every id, keeping the map's size.
    pub(crate) fn clear(&mut self) {
        self.map.clear();
        self.recent.slots.fill(None);
    }
}

/// The last [`Id`] seen per slot, with its value.
#[derive(Debug, Clone)]
struct Recent<V: Copy> {
    slots: Box<[Option<(Id, V)>; SLOTS]>,
}

/// Slots: a power of two, indexed by the top bits of the address's hash.
const SLOTS: usize = 256;

impl<V: Copy> Default for Recent<V> {
    fn default() -> Self {
        Self {
            slots: Box::new([None; SLOTS]),
        }
    }
}

impl<V: Copy> Recent<V> {
    /// The value last put for `id`, when its slot still holds it.
    fn get(&self, id: Id) -> Option<V> {
        match self.slots[slot(id)] {
            Some((held, value)) if held == id => Some(value),
            _ => None,
        }
    }

    /// Puts `value` for `id`, in place of whatever held its slot.
    fn put(&mut self, id: Id, value: V) {
        self.slots[slot(id)] = Some((id, value));
    }
}

/// Fibonacci hashing: the top 8 bits of the address times 2^64 / φ, which
/// spreads addresses that differ in any bit (strings 8 or 16 bytes apart).
fn slot(id: Id) -> usize {
    ((id.0 as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An address other than `a`'s that shares its slot.
    fn slot_mate(a: Id) -> Id {
        (1..1_000_000usize)
            .map(|i| (a.0 + 8 * i, a.1))
            .find(|&b| slot(b) == slot(a))
            .expect("some address shares the slot")
    }

    #[test]
    fn a_slot_answers_only_for_the_id_it_holds() {
        let mut recent = Recent::default();
        let a = (0x1000, 4);
        assert_eq!(recent.get(a), None);
        recent.put(a, 7u8);
        assert_eq!(recent.get(a), Some(7));
        // The same address with another length is another string.
        assert_eq!(recent.get((0x1000, 5)), None);
        // Another address in the same slot takes it over.
        let b = slot_mate(a);
        assert_eq!(recent.get(b), None);
        recent.put(b, 9);
        assert_eq!(recent.get(b), Some(9));
        assert_eq!(recent.get(a), None);
    }

    #[test]
    fn the_memo_answers_past_the_cache_until_cleared() {
        let mut memo = AddressMemo::default();
        let a = (0x1000, 4);
        let b = slot_mate(a);
        memo.insert(a, 7u8);
        memo.insert(b, 9);
        // `b` took the slot; `a` is still remembered by the map.
        assert_eq!(memo.get(a), Some(7));
        assert_eq!(memo.get(b), Some(9));
        assert_eq!(memo.get((0x1000, 5)), None);
        assert_eq!(memo.len(), 2);
        memo.clear();
        assert_eq!(memo.get(a), None);
        assert_eq!(memo.get(b), None);
        assert_eq!(memo.len(), 0);
    }
}
