//! The turns closed recently, and the owners of plain trace ids.
//!
//! Owns [`Closed`]: a later event of a turn closed here is dropped and
//! counted, so a turn is never exported twice with different content; and
//! the owner of each turn id's plain (unscoped) trace id while its turn is
//! open or remembered here, so that a second instance opening a turn with
//! the same id gets a trace id scoped by its instance
//! ([`crate::ids::scoped_trace_id`]).
//!
//! Both remember a turn by a 128-bit fingerprint of its key (and of its
//! turn id), not by a copy of the text: closing a turn allocates nothing,
//! and remembering and forgetting one touches a compact table rather than
//! a 60-100-byte key written long before (a cache miss on a lookup, on
//! the eviction of the oldest and on freeing it). The fingerprint is
//! SipHash-1-3 under keys drawn at random for each correlator: two
//! different keys share one with probability 2^-128, and nobody without
//! the keys can choose texts that do.

use std::collections::VecDeque;
use std::hash::{BuildHasher, Hasher};

use hermes_span::Str;
use siphasher::sip128::{Hasher128, SipHasher13};

use crate::Map;

/// A text's fingerprint.
type Fingerprint = u128;

/// One closed turn, oldest first in [`Closed::order`].
#[derive(Debug)]
struct ClosedTurn {
    key: Fingerprint,
    instance: Str,
    /// The fingerprint of the turn id whose plain ids the turn held.
    plain: Option<Fingerprint>,
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Closed {
    keys: (u64, u64),
    order: VecDeque<ClosedTurn>,
    closed: Map<Fingerprint, ()>,
    owners: Map<Fingerprint, Str>,
}

impl Default for Closed {
    fn default() -> Self {
        // Two draws of std's per-process random keys.
        let draw = || {
            std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish()
        };
        Self {
            keys: (draw(), draw()),
            order: VecDeque::new(),
            closed: Map::default(),
            owners: Map::default(),
        }
    }
}

impl Closed {
    fn fingerprint(&self, text: &str) -> Fingerprint {
        let mut h = SipHasher13::new_with_keys(self.keys.0, self.keys.1);
        h.write(text.as_bytes());
        h.finish128().as_u128()
    }

    /// Whether the turn of `key` ([`crate::fair::key`]) was closed.
    pub fn contains(&self, key: &str) -> bool {
        self.closed.contains_key(&self.fingerprint(key))
    }

    /// Whether `instance` may use `turn_id`'s plain ids, claiming them when
    /// nobody holds them.
    pub fn claim(&mut self, turn_id: &str, instance: &Str) -> bool {
        let id = self.fingerprint(turn_id);
        match self.owners.get(&id) {
            Some(owner) => owner == instance,
            None => {
                self.owners.insert(id, instance.clone());
                true
            }
        }
    }

    /// Remembers `instance`'s turn of `key` as closed; forgets the oldest
    /// past `cap`. `plain`: the turn id whose plain ids the turn held.
    pub fn push(&mut self, key: &str, instance: &Str, plain: Option<&str>, cap: usize) {
        let key = self.fingerprint(key);
        let plain = plain.map(|turn_id| self.fingerprint(turn_id));
        if self.closed.insert(key, ()).is_none() {
            self.order.push_back(ClosedTurn {
                key,
                instance: instance.clone(),
                plain,
            });
        }
        while self.order.len() > cap {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            self.closed.remove(&old.key);
            release(&mut self.owners, old.plain, &old.instance);
        }
    }

    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Forgets the closed turns of `instance`, and their claims on plain
    /// ids: that instance sends them again and they are rebuilt.
    pub fn forget(&mut self, instance: &str) {
        let Self {
            order,
            closed,
            owners,
            ..
        } = self;
        order.retain(|turn| {
            if turn.instance.as_str() != instance {
                return true;
            }
            closed.remove(&turn.key);
            release(owners, turn.plain, instance);
            false
        });
    }

    /// Gives up `instance`'s claim on `turn_id`'s plain ids (its open turn
    /// was forgotten, not closed).
    pub fn release(&mut self, turn_id: &str, instance: &str) {
        let id = self.fingerprint(turn_id);
        release(&mut self.owners, Some(id), instance);
    }
}

/// Gives up `instance`'s claim on the plain ids of turn id `id`, if it
/// holds it.
fn release(owners: &mut Map<Fingerprint, Str>, id: Option<Fingerprint>, instance: &str) {
    if let Some(id) = id
        && owners
            .get(&id)
            .is_some_and(|owner| owner.as_str() == instance)
    {
        owners.remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turns_are_remembered_until_the_cap_and_forgotten_per_instance() {
        let (a, b): (Str, Str) = ("a".into(), "b".into());
        let mut closed = Closed::default();
        for turn in 0..4 {
            closed.push(&format!("a{turn}"), &a, None, 3);
        }
        assert!(!closed.contains("a0"), "the oldest past the cap");
        assert!(closed.contains("a1") && closed.contains("a3"));
        assert_eq!(closed.len(), 3);
        closed.push("b1", &b, None, 3);
        assert!(!closed.contains("a1") && closed.contains("b1"));
        closed.forget("a");
        assert!(!closed.contains("a3") && closed.contains("b1"));
        assert_eq!(closed.len(), 1);
    }

    #[test]
    fn a_plain_id_belongs_to_its_first_claimant_until_released() {
        let (a, b): (Str, Str) = ("a".into(), "b".into());
        let mut closed = Closed::default();
        assert!(closed.claim("t1", &a));
        assert!(closed.claim("t1", &a), "its owner again");
        assert!(!closed.claim("t1", &b));
        // Remembered with the closed turn, released with its eviction.
        closed.push("a-t1", &a, Some("t1"), 1);
        assert!(!closed.claim("t1", &b));
        closed.push("a-t2", &a, None, 1);
        assert!(
            closed.claim("t1", &b),
            "released when its turn is forgotten"
        );
        // Another instance's release leaves the claim alone.
        closed.release("t1", &a);
        assert!(!closed.claim("t1", &a));
        closed.release("t1", &b);
        assert!(closed.claim("t1", &a));
    }
}
