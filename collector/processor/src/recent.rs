//! A direct-mapped cache in front of the redaction's memos by address.
//!
//! Owns [`Recent`]: one slot per hash of an address, holding the last
//! address (and length) seen there and what the memo said of it. Every
//! attribute of every span asks the memos twice (its key's verdict, whether
//! its value is known clean), and the correlator's spans bring the same few
//! dozen static keys and shared values again and again: a hit here is a
//! multiply, a load and a compare, where the hash maps behind it hash the
//! address and probe a group. A miss, or another address in the slot, asks
//! the map, which stays the memo of record.

/// A string's address and length: what the memos key on.
pub(crate) type Id = (usize, usize);

/// The last [`Id`] seen per slot, with its value.
#[derive(Debug, Clone)]
pub(crate) struct Recent<V: Copy> {
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
    pub(crate) fn get(&self, id: Id) -> Option<V> {
        match self.slots[slot(id)] {
            Some((held, value)) if held == id => Some(value),
            _ => None,
        }
    }

    /// The value for `id`: this cache's, else `memo`'s (then kept here).
    pub(crate) fn get_or(&mut self, id: Id, memo: impl FnOnce() -> Option<V>) -> Option<V> {
        if let Some(value) = self.get(id) {
            return Some(value);
        }
        let value = memo()?;
        self.put(id, value);
        Some(value)
    }

    /// Empties every slot.
    pub(crate) fn clear(&mut self) {
        self.slots.fill(None);
    }

    /// Puts `value` for `id`, in place of whatever held its slot.
    pub(crate) fn put(&mut self, id: Id, value: V) {
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
        let b = (1..1_000_000usize)
            .map(|i| (0x1000 + 8 * i, 4))
            .find(|&b| slot(b) == slot(a))
            .unwrap_or_default();
        assert_ne!(b, (0, 0), "some address shares the slot");
        assert_eq!(recent.get(b), None);
        recent.put(b, 9);
        assert_eq!(recent.get(b), Some(9));
        assert_eq!(recent.get(a), None);
        recent.clear();
        assert_eq!(recent.get(b), None);
    }
}
