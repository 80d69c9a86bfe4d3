//! Fleet mode: the back channel between the correlation stage and the
//! streams of shims that run in a fleet of collector replicas
//! (docs/PROTOCOL.md, "Fleet mode").
//!
//! A shim announces fleet mode with the request metadata `hermes-fleet: 1`
//! and keeps every event until this collector says it is *settled* (its
//! spans exported, or lost for good and counted). The correlation stage
//! owns settlement and publishes each instance's settled seq here
//! ([`Settlements::publish`]); every fleet stream of that instance watches
//! its value (a `tokio::sync::watch`: the latest value wins, no
//! backpressure) and sends an `Ack {first_seq: 0, last_seq: 0,
//! settled_seq}` when it advances. At the drain, [`Settlements::leave`]
//! asks every fleet stream to hand its instance off to another replica.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Request metadata with which a shim announces fleet mode.
pub const FLEET_METADATA: &str = "hermes-fleet";
/// Response header with which this collector says it settles.
pub const SETTLES_HEADER: &str = "hermes-settles";

/// The settled seq of every shim instance with a fleet stream open, and
/// the drain's request to leave. Shared by the receiver and the
/// correlation stage.
#[derive(Debug, Default)]
pub struct Settlements {
    instances: Mutex<HashMap<String, watch::Sender<u64>>>,
    leave: CancellationToken,
    /// Fleet streams open now (the drain waits for them to hand off).
    streams: AtomicU64,
    /// Handoffs received (every stream that sent one).
    handoffs: AtomicU64,
    /// Instances whose last fleet stream ended without a handoff, not by
    /// this collector's shutdown: their agent is presumed dead (until it
    /// comes back).
    abandoned: Mutex<HashSet<String>>,
}

impl Settlements {
    fn map(&self) -> MutexGuard<'_, HashMap<String, watch::Sender<u64>>> {
        self.instances
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether any fleet stream of `instance` is open.
    pub fn is_connected(&self, instance: &str) -> bool {
        self.map().contains_key(instance)
    }

    /// The instances with a fleet stream open.
    pub fn connected(&self) -> Vec<String> {
        self.map().keys().cloned().collect()
    }

    /// Records that every event of `instance` with seq <= `settled` is
    /// settled; its fleet streams send it if it is new. Without a fleet
    /// stream of the instance nothing is kept (a shim that reconnects
    /// learns the next value).
    pub fn publish(&self, instance: &str, settled: u64) {
        if let Some(tx) = self.map().get(instance) {
            tx.send_if_modified(|value| {
                let advanced = settled > *value;
                *value = (*value).max(settled);
                advanced
            });
        }
    }

    /// Whether `instance`'s last fleet stream ended without a handoff
    /// before the shutdown (its agent is presumed dead: nobody replays its
    /// open turns).
    pub fn is_abandoned(&self, instance: &str) -> bool {
        self.abandoned_set().contains(instance)
    }

    fn abandoned_set(&self) -> MutexGuard<'_, HashSet<String>> {
        self.abandoned
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The drain: every fleet stream sends `leave`; the shims hand off.
    pub fn leave(&self) {
        self.leave.cancel();
    }

    /// Whether [`Settlements::leave`] was called.
    pub fn is_leaving(&self) -> bool {
        self.leave.is_cancelled()
    }

    /// Fleet streams open now.
    pub fn streams(&self) -> u64 {
        self.streams.load(Ordering::Acquire)
    }

    /// Handoffs received so far.
    pub fn handoffs(&self) -> u64 {
        self.handoffs.load(Ordering::Relaxed)
    }

    /// A fleet stream opened (before its first batch names its instance);
    /// the receiver's stream task calls it, and [`Settlements::stream_closed`]
    /// when the stream ends.
    pub fn stream_opened(&self) {
        self.streams.fetch_add(1, Ordering::AcqRel);
    }

    /// The fleet stream's instance: the receiver of its settled seq. A
    /// second stream of an instance (it reconnected before its old stream
    /// was gone) is told the current value at once: it may resend events
    /// settled already, whose settlement would not advance the value.
    pub fn subscribe(&self, instance: &str) -> watch::Receiver<u64> {
        self.abandoned_set().remove(instance);
        let mut map = self.map();
        match map.get(instance) {
            Some(tx) => {
                let mut rx = tx.subscribe();
                if *rx.borrow() > 0 {
                    rx.mark_changed();
                }
                rx
            }
            None => {
                let (tx, rx) = watch::channel(0);
                map.insert(instance.to_owned(), tx);
                rx
            }
        }
    }

    /// A fleet stream ended (`abandoned`: without a handoff, not by the
    /// shutdown); its instance is forgotten with its last one.
    pub fn stream_closed(
        &self,
        subscription: Option<(String, watch::Receiver<u64>)>,
        abandoned: bool,
    ) {
        if let Some((instance, rx)) = subscription {
            let mut map = self.map();
            drop(rx);
            if map
                .get(&instance)
                .is_some_and(|tx| tx.receiver_count() == 0)
            {
                map.remove(&instance);
                drop(map);
                if abandoned {
                    self.abandoned_set().insert(instance);
                }
            }
        }
        self.streams.fetch_sub(1, Ordering::AcqRel);
    }

    pub(crate) fn handed_off(&self) {
        self.handoffs.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn leaving(&self) -> &CancellationToken {
        &self.leave
    }
}
