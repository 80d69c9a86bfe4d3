//! Where the sender's next stream goes: the one collector of a plain
//! endpoint, or the best replica of a fleet endpoint (`dns:///NAME:PORT`,
//! [`super::fleet`]).
//!
//! Owns: building the [`Target`] of each attempt, which replica the open
//! stream talks to, when a replica is skipped (a failed stream: for the
//! backoff; a collector that leaves: for [`LEAVE_SKIP`]) and when the name
//! is resolved again.
//!
//! Invariants: a plain endpoint always gives the same target (or none, if
//! it cannot be built: the error is kept); a fleet endpoint gives the best
//! replica not skipped, resolving the name when due and after every failed
//! stream; all of it on the sender's thread.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use hermes_proto::v1::EventBatch;

use tokio::time::Instant;

use super::conn::{self, Conn, ConnOptions, Target, TargetError};
use super::fleet::{Fleet, FleetName, FleetOptions, LEAVE_SKIP, ranked, resolve};
use super::unacked::UnackedBuffer;
use super::{SenderConfig, SenderShared};
use crate::config::CollectorEndpoint;
use crate::queue::QueueCounters;

/// The targets of a fleet endpoint, for streams under any instance id (the
/// replay of spool files left by other processes).
#[derive(Debug, Clone)]
pub struct FleetTargets {
    endpoint: CollectorEndpoint,
    conn: ConnOptions,
    name: FleetName,
    options: FleetOptions,
}

impl FleetTargets {
    /// The target of attempt `attempt` (0, 1, ...) for `instance_id`: the
    /// replicas ranked for it, in turn from the best.
    pub fn target_for(&self, instance_id: &str, attempt: usize) -> Result<Target, String> {
        let addrs = resolve(&self.name, self.options.hosts_file.as_deref())?;
        let ranked = ranked(instance_id, addrs);
        let addr = ranked[attempt % ranked.len()];
        conn::fleet_target(&self.endpoint, &self.conn, &self.name, addr).map_err(|e| e.to_string())
    }
}

/// Where the streams of a replay go.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant, reason = "one per sender, built once")]
pub enum ReplayRoute {
    /// The one collector.
    Fixed(Target),
    /// The replica each file's instance id ranks first.
    Fleet(FleetTargets),
}

/// Where the sender's streams go.
#[derive(Debug)]
#[allow(clippy::large_enum_variant, reason = "one per sender, built once")]
pub enum Route {
    /// A plain endpoint, or none when its target cannot be built.
    Fixed(Option<Target>),
    /// A fleet endpoint.
    Fleet {
        /// The replicas.
        fleet: Fleet,
        /// Builds the target of a replica.
        targets: FleetTargets,
        /// The replica of the stream open now.
        current: Option<SocketAddr>,
    },
}

impl Route {
    /// The route of `endpoint` for `instance_id`.
    pub fn new(
        endpoint: &CollectorEndpoint,
        conn: &ConnOptions,
        options: &FleetOptions,
        instance_id: &str,
        now: Instant,
    ) -> Result<Route, TargetError> {
        match FleetName::parse(&endpoint.url) {
            Some(Ok(name)) => {
                // Checks the settings once (TLS material, token).
                conn::fleet_target(endpoint, conn, &name, SocketAddr::from(([127, 0, 0, 1], 1)))?;
                Ok(Route::Fleet {
                    fleet: Fleet::new(name.clone(), options.clone(), instance_id, now),
                    targets: FleetTargets {
                        endpoint: endpoint.clone(),
                        conn: conn.clone(),
                        name,
                        options: options.clone(),
                    },
                    current: None,
                })
            }
            Some(Err(why)) => Err(TargetError::FleetName(why)),
            None => conn::target(endpoint, conn).map(|t| Route::Fixed(Some(t))),
        }
    }

    /// Whether this is a fleet endpoint.
    pub fn is_fleet(&self) -> bool {
        matches!(self, Route::Fleet { .. })
    }

    /// Whether a stream can ever be opened.
    pub fn usable(&self) -> bool {
        !matches!(self, Route::Fixed(None))
    }

    /// Where spool files are replayed.
    pub fn replay(&self) -> Option<ReplayRoute> {
        match self {
            Route::Fixed(target) => target.clone().map(ReplayRoute::Fixed),
            Route::Fleet { targets, .. } => Some(ReplayRoute::Fleet(targets.clone())),
        }
    }

    /// The target of the next stream, and its replica, or why there is
    /// none now (fleet: no address known, or all skipped).
    pub fn open(&mut self, now: Instant) -> Result<(Target, Option<SocketAddr>), String> {
        match self {
            Route::Fixed(Some(target)) => Ok((Target::clone(target), None)),
            Route::Fixed(None) => Err("no usable endpoint".to_owned()),
            Route::Fleet {
                fleet,
                targets,
                current,
            } => {
                let resolved = if now >= fleet.resolve_at() {
                    fleet.resolve(now)
                } else {
                    Ok(())
                };
                let Some(addr) = fleet.best(now) else {
                    let why = resolved.err().unwrap_or_else(|| {
                        format!("no replica of {} can be tried now", fleet.name().host)
                    });
                    return Err(why);
                };
                let target =
                    conn::fleet_target(&targets.endpoint, &targets.conn, &targets.name, addr)
                        .map_err(|e| e.to_string())?;
                *current = Some(addr);
                Ok((target, Some(addr)))
            }
        }
    }

    /// The stream open now ended or failed: its replica is skipped until
    /// `until`, and the name resolved again before the next attempt.
    /// Returns when to try next: at once if another replica can be tried
    /// (an unplanned move), else `until` or the first skip's end.
    pub fn failed(&mut self, now: Instant, until: Instant) -> Instant {
        match self {
            Route::Fixed(_) => until,
            Route::Fleet { fleet, current, .. } => {
                if let Some(addr) = current.take() {
                    fleet.skip(addr, until);
                }
                fleet.resolve_soon(now);
                if fleet.best(now).is_some() {
                    now
                } else {
                    fleet.next_unskip(now).unwrap_or(until).min(until)
                }
            }
        }
    }

    /// The replica of the open stream says it leaves the fleet: skipped
    /// for [`LEAVE_SKIP`].
    pub fn leaving(&mut self, now: Instant) {
        if let Route::Fleet { fleet, current, .. } = self
            && let Some(addr) = current.take()
        {
            fleet.skip(addr, now + LEAVE_SKIP);
        }
    }

    /// The stream was ended on purpose (a planned move).
    pub fn left(&mut self) {
        if let Route::Fleet { current, .. } = self {
            *current = None;
        }
    }

    /// When the name is resolved next (None: not a fleet).
    pub fn resolve_at(&self) -> Option<Instant> {
        match self {
            Route::Fixed(_) => None,
            Route::Fleet { fleet, .. } => Some(fleet.resolve_at()),
        }
    }

    /// Resolves the name; returns whether the open stream's replica is no
    /// longer the best one (a planned move is due). A failed resolution
    /// keeps the addresses known and moves nothing.
    pub fn resolve(&mut self, now: Instant) -> Result<bool, String> {
        match self {
            Route::Fixed(_) => Ok(false),
            Route::Fleet { fleet, current, .. } => {
                fleet.resolve(now)?;
                Ok(current.is_some_and(|c| fleet.best(now) != Some(c)))
            }
        }
    }
}

/// A planned move: ends the open stream after its `handoff` batch (sent
/// only to a collector that settles: an older one would take an empty
/// batch for an invalid one), so everything held goes again to the next
/// replica, from the lowest unsettled seq. The ended stream counts in
/// `leaving_streams` until its task ends (the sender's stop and the
/// process's exit wait for it, bounded).
pub(super) fn move_off(
    conn: &mut Option<Conn>,
    settles: bool,
    pending: &mut UnackedBuffer,
    config: &SenderConfig,
    shared: &Arc<SenderShared>,
    queue: &QueueCounters,
) {
    let Some(old) = conn.take() else {
        return;
    };
    let handoff = settles.then(|| EventBatch {
        shim: Some(config.shim.clone()),
        events: Vec::new(),
        dropped_events: queue.dropped()
            + shared.evicted_events.load(Ordering::Acquire)
            + shared.lost_events.load(Ordering::Acquire),
        floor_seq: pending.floor_seq(),
        handoff: true,
    });
    if let Some(task) = old.finish(handoff) {
        let leaving = Leaving::new(shared);
        tokio::spawn(async move {
            let _ = task.await;
            drop(leaving);
        });
    }
    shared.connected.store(false, Ordering::Release);
    pending.mark_all_unsent();
}

/// One stream a planned move ended, counted in `leaving_streams` until it
/// is dropped: when its task ended, or with the sender's runtime.
struct Leaving(Arc<SenderShared>);

impl Leaving {
    fn new(shared: &Arc<SenderShared>) -> Leaving {
        shared.leaving_streams.fetch_add(1, Ordering::AcqRel);
        Leaving(Arc::clone(shared))
    }
}

impl Drop for Leaving {
    fn drop(&mut self) {
        self.0.leaving_streams.fetch_sub(1, Ordering::AcqRel);
    }
}
