//! Which client identity may send events under which shim instance id.
//!
//! With mutual TLS every client presents a certificate, and that
//! certificate is its identity ([`Principal`]). The first identity to send
//! a batch under a shim instance id owns the id; a batch under the same id
//! from another identity is refused (`PERMISSION_DENIED`, counted in
//! `ReceiverStats::foreign_instance_refusals`), so an agent cannot write
//! into another agent's sequence or traces by claiming its instance id. A
//! shim that reconnects, or replays its spool from a later process, holds
//! the same certificate and keeps its ids.
//!
//! Without client certificates every client with the token (or every
//! client, without one) is the same identity, and nothing is bound: the
//! correlator still keeps each instance's state apart (docs/SECURITY.md).
//!
//! Bounded: at most [`InstanceBindings::capacity`] ids are remembered; past
//! it the oldest binding is forgotten (an id is a random 128-bit value a
//! process draws at start, so a forgotten one is most likely a process that
//! ended).

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher as _;
use std::sync::Mutex;

/// A client identity: a keyed hash of its certificate (the key is random
/// per process, so identities cannot be made to collide from outside).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Principal(u64);

/// The owners of shim instance ids; see the module docs.
#[derive(Debug)]
pub struct InstanceBindings {
    hasher: std::hash::RandomState,
    capacity: usize,
    inner: Mutex<Owners>,
}

#[derive(Debug, Default)]
struct Owners {
    by_instance: HashMap<String, Principal>,
    order: VecDeque<String>,
}

impl Default for InstanceBindings {
    fn default() -> Self {
        Self::with_capacity(65_536)
    }
}

impl InstanceBindings {
    /// Remembers at most `capacity` instance ids.
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            hasher: std::hash::RandomState::new(),
            capacity: capacity.max(1),
            inner: Mutex::default(),
        }
    }

    /// How many instance ids are remembered at most.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The identity of a client certificate (DER).
    pub fn principal(&self, certificate: &[u8]) -> Principal {
        Principal(self.hasher.hash_one(certificate))
    }

    /// Binds `instance` to `principal` if nobody owns it yet; false when
    /// another principal owns it.
    pub fn claim(&self, instance: &str, principal: Principal) -> bool {
        let mut owners = match self.inner.lock() {
            Ok(owners) => owners,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(owner) = owners.by_instance.get(instance) {
            return *owner == principal;
        }
        if owners.order.len() >= self.capacity
            && let Some(oldest) = owners.order.pop_front()
        {
            owners.by_instance.remove(&oldest);
        }
        owners.by_instance.insert(instance.to_owned(), principal);
        owners.order.push_back(instance.to_owned());
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instance_belongs_to_the_first_certificate_that_uses_it() {
        let bindings = InstanceBindings::default();
        let alice = bindings.principal(b"alice's certificate");
        let mallory = bindings.principal(b"mallory's certificate");
        assert_ne!(alice, mallory);
        assert!(bindings.claim("a1", alice));
        assert!(bindings.claim("a1", alice), "the owner keeps its id");
        assert!(!bindings.claim("a1", mallory), "nobody else gets it");
        assert!(bindings.claim("m1", mallory));
        assert!(!bindings.claim("m1", alice));
    }

    #[test]
    fn the_oldest_binding_is_forgotten_past_the_capacity() {
        let bindings = InstanceBindings::with_capacity(2);
        let alice = bindings.principal(b"alice");
        let bob = bindings.principal(b"bob");
        assert!(bindings.claim("a1", alice));
        assert!(bindings.claim("a2", alice));
        assert!(bindings.claim("a3", alice));
        assert!(bindings.claim("a1", bob), "a1 was forgotten");
        assert!(!bindings.claim("a3", bob));
    }
}
