//! The sender thread: from the hook queue to the collector.
//!
//! Owns: draining the queue in batches, converting them (through a
//! [`Convert`] implementation: the Python extension attaches the GIL once per
//! batch), numbering API attempts, the buffer of unacknowledged batches, the
//! gRPC stream with reconnect and resend, and the counters that `flush()` and
//! `stats()` read.
//!
//! Invariants:
//! - Runs on one dedicated thread named [`THREAD_NAME`] with its own tokio
//!   current-thread runtime; nothing here blocks a hook thread, and nothing
//!   here logs: the diagnostics are [`SenderShared`] counters, the last
//!   error text and the [`reach::Notice`]s handed to [`Convert::notice`]
//!   (an outage once it lasted `report_unreachable_after`, its end, and at
//!   exit what was not delivered).
//! - A batch holds at most `max_batch_events` events, in ascending seq order.
//! - The sender looks at the queue on its own timer, not because an event
//!   was queued (so the hook path makes no system call): every `linger` while
//!   events come, backing off to `idle_poll_max` while none do. A producer's
//!   `push_and_wake` (the end of a turn), a flush or the queue's close make
//!   it look at once. After `idle_sleep_after` without events it stops the
//!   timer ([`QueueRx::fall_asleep`]); the next push then wakes it (and it
//!   looks `linger` later), so an idle agent's sender costs nothing and only
//!   the first hook after a pause makes a system call.
//! - Every event taken from the queue ends up exactly once in
//!   `acked_events + evicted_events + discarded_events + spooled_events +
//!   spool_dropped_events + lost_events` once the collector has acknowledged
//!   it, it was evicted from the full unacknowledged buffer, its conversion
//!   was impossible (interpreter shutting down), it was written to (or did
//!   not fit in) the disk spool, or it was lost with a dying sender. `flush` waits on that sum, and on the replay of
//!   spool files claimed at start.
//! - On a lost stream every unacknowledged batch is sent again, in order, on
//!   the next connection; connection attempts are spaced by a jittered
//!   exponential backoff (`backoff_min` .. `backoff_max`).
//! - While disconnected the sender keeps draining the queue into the bounded
//!   unacknowledged buffer (oldest evicted first), so the hook path only drops
//!   when the agent produces faster than conversion can follow.
//! - The thread is supervised ([`supervise`]): a panic or an early return
//!   is counted, said once, and followed by a restart that takes over the
//!   queue and the unacknowledged batches, a bounded number of times.
//! - With a spool ([`spool`], optional): on request ([`SenderShared::spool_and_wait`],
//!   the exit path) or when the queue is closed and `close_grace` passed,
//!   everything held (queued and unacknowledged) is written to a spool file
//!   and no longer sent; at start, a replay task sends the spool files other
//!   (ended) processes left, each on its own stream under its original
//!   instance id and seqs.
//! - Fleet mode (a `dns:///NAME:PORT` endpoint, [`route`], [`fleet`]): the
//!   stream goes to the replica the instance id ranks first; a collector
//!   that settles makes the buffer keep acknowledged batches until their
//!   `settled_seq`. A move, planned (the best replica changed after a
//!   resolution, or the collector said `leave`: the old stream gets the
//!   `handoff` batch and ends) or not (the stream failed: the next
//!   replica at once), sends everything held again from the lowest
//!   unsettled seq. A sender that stops gives the streams its planned
//!   moves ended what is left of `close_grace` to deliver their handoff;
//!   the interpreter's exit, what is left of its flush
//!   ([`SenderShared::wait_handoffs`]).

pub mod backoff;
mod batcher;
pub mod conn;
pub mod fleet;
pub mod reach;
pub mod route;
pub mod spool;
pub mod supervise;
pub mod unacked;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hermes_proto::v1::{Event, ShimInfo};
use tokio::sync::Notify;
use tokio::sync::mpsc::error::TrySendError;
use tokio::time::Instant;

use crate::config::CollectorEndpoint;
use crate::queue::{QueueCounters, QueueTx, event_queue};
use backoff::Backoff;
use batcher::Parts;
use conn::{Conn, ConnError, ConnEvent, ConnOptions};
use fleet::FleetOptions;
use reach::{Holding, Notice, Reach};
use route::Route;
use spool::SpoolConfig;
pub use supervise::{RestartPolicy, spawn};

/// Name of the sender thread.
pub const THREAD_NAME: &str = "hermes-collector-sender";

/// Largest number of batches cut per wake-up before acks are looked at again.
const MAX_BATCHES_PER_WAKE: usize = 16;
/// Retry interval for writing to a full outbound channel.
const FEED_RETRY: Duration = Duration::from_millis(10);
/// Polling interval of [`SenderShared::wait_settled`].
const SETTLE_POLL: Duration = Duration::from_millis(2);

/// Converts queued items into events.
pub trait Convert {
    /// What the hook path queues.
    type Item: Send + 'static;
    /// Converts a batch of items. Returns one event per item, or fewer if
    /// some could not be converted (they count as discarded).
    fn convert(&mut self, items: Vec<Self::Item>) -> Vec<Event>;

    /// Says `notice` where the agent's operator reads it (the Python
    /// extension: the `hermes_collector` logger). Called on the sender
    /// thread a few times per outage at most, never per event. The default
    /// says nothing.
    fn notice(&mut self, notice: &Notice) {
        let _ = notice;
    }
}

/// A converter for senders fed with ready events (the load generator, tests):
/// every item goes out as it is (the sender still renumbers `seq` 1, 2, 3,
/// ... in the items' seq order and numbers API attempts).
#[derive(Debug, Clone, Copy, Default)]
pub struct PassThrough;

impl Convert for PassThrough {
    type Item = Event;

    fn convert(&mut self, items: Vec<Event>) -> Vec<Event> {
        items
    }
}

/// Default [`SenderConfig::idle_poll_max`]. The first event after a pause
/// shorter than `idle_sleep_after` (a model or tool call) waits up to this
/// long in the agent, on top of the collector's batch timeout; 50 ms keeps
/// capture → export within batch timeout + 100 ms at a few dozen wake-ups
/// per second while the sender polls (`docs/BENCHMARKS.md`, "Delay").
pub const DEFAULT_IDLE_POLL_MAX: Duration = Duration::from_millis(50);

/// Default [`SenderConfig::idle_sleep_after`]: longer than most model
/// calls, whose answer's hook would otherwise pay the wake, shorter than a
/// pause for user input (`docs/BENCHMARKS.md`, "An idle sender sleeps").
pub const DEFAULT_IDLE_SLEEP_AFTER: Duration = Duration::from_secs(10);

/// Sender settings.
#[derive(Debug, Clone)]
pub struct SenderConfig {
    /// Collector endpoint (`http://host:port`, `unix:/path` or a fleet's
    /// `dns:///NAME:PORT`) and token.
    pub endpoint: CollectorEndpoint,
    /// How a fleet endpoint's name is resolved.
    pub fleet: FleetOptions,
    /// Sent with every batch.
    pub shim: ShimInfo,
    /// Most events per batch.
    pub max_batch_events: usize,
    /// How often the queue is looked at while events come: the longest an
    /// event waits before its batch is cut.
    pub linger: Duration,
    /// The longest interval between looks at an idle queue (the interval
    /// doubles from `linger` while the queue stays empty); default
    /// [`DEFAULT_IDLE_POLL_MAX`].
    pub idle_poll_max: Duration,
    /// After this long without events the sender stops looking at the
    /// queue on a timer and the next push wakes it; default
    /// [`DEFAULT_IDLE_SLEEP_AFTER`].
    pub idle_sleep_after: Duration,
    /// Most unacknowledged batches kept.
    pub max_unacked_batches: usize,
    /// Most unacknowledged bytes (encoded) kept.
    pub max_unacked_bytes: usize,
    /// First reconnect delay.
    pub backoff_min: Duration,
    /// Largest reconnect delay.
    pub backoff_max: Duration,
    /// Connection options.
    pub conn: ConnOptions,
    /// Once the queue is closed (its producer dropped), how long the sender
    /// keeps trying to deliver what it holds before it exits (and spools it,
    /// with a spool).
    pub close_grace: Duration,
    /// The disk spool, if any.
    pub spool: Option<SpoolConfig>,
    /// How long no stream can be opened before the outage is reported
    /// ([`Convert::notice`]); default [`reach::DEFAULT_REPORT_AFTER`].
    pub report_unreachable_after: Duration,
    /// When the sender thread is started again after it died
    /// ([`supervise`]).
    pub restart: RestartPolicy,
}

impl SenderConfig {
    /// Defaults for `endpoint` and `shim`.
    pub fn new(endpoint: impl Into<CollectorEndpoint>, shim: ShimInfo) -> Self {
        SenderConfig {
            endpoint: endpoint.into(),
            fleet: FleetOptions::default(),
            shim,
            max_batch_events: 512,
            linger: Duration::from_millis(10),
            idle_poll_max: DEFAULT_IDLE_POLL_MAX,
            idle_sleep_after: DEFAULT_IDLE_SLEEP_AFTER,
            max_unacked_batches: 1_024,
            max_unacked_bytes: 32 << 20,
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            conn: ConnOptions::default(),
            close_grace: Duration::from_secs(5),
            spool: None,
            report_unreachable_after: reach::DEFAULT_REPORT_AFTER,
            restart: RestartPolicy::default(),
        }
    }
}

/// State shared between the sender and the threads that flush or read stats.
#[derive(Debug, Default)]
pub struct SenderShared {
    sent_batches: AtomicU64,
    acked_events: AtomicU64,
    unacked_batches: AtomicU64,
    evicted_events: AtomicU64,
    /// Acknowledged, unsettled events evicted (fleet mode; not part of
    /// the settled sum: counted at their ack).
    evicted_unsettled_events: AtomicU64,
    /// Times the stream moved to another replica (fleet mode).
    replica_moves: AtomicU64,
    discarded_events: AtomicU64,
    spooled_events: AtomicU64,
    spool_dropped_events: AtomicU64,
    replayed_events: AtomicU64,
    replayed_files: AtomicU64,
    replay_lost_events: AtomicU64,
    /// Events the sender held when it died ([`supervise`]).
    lost_events: AtomicU64,
    /// Times the sender died (panicked or returned before its queue closed).
    sender_deaths: AtomicU64,
    /// Times the sender was started again after a death.
    sender_restarts: AtomicU64,
    /// The sender died and is not started again: nothing is delivered,
    /// the queue is closed (hooks drop and count), waits return at once.
    sender_stopped: AtomicBool,
    /// Spool files are being looked for or replayed.
    replay_busy: AtomicBool,
    connected: AtomicBool,
    asleep: AtomicBool,
    last_error: Mutex<String>,
    flush_notify: Notify,
    spool_notify: Notify,
    /// Bumped by the sender after each spool request it handled.
    spool_rounds: AtomicU64,
    exit_notify: Notify,
    /// Events captured before the exit, for the exit report.
    exit_target: AtomicU64,
    /// Bumped by the sender after each exit report it made.
    exit_rounds: AtomicU64,
    /// Streams a planned move ended that are still delivering their
    /// `handoff` ([`route::move_off`]).
    leaving_streams: AtomicU64,
}

/// A snapshot of the sender's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SenderStats {
    /// Batches written to a stream (resends included).
    pub sent_batches: u64,
    /// Events the collector acknowledged.
    pub acked_events: u64,
    /// Batches waiting for an ack.
    pub unacked_batches: u64,
    /// Events evicted from the full unacknowledged buffer.
    pub evicted_events: u64,
    /// Acknowledged events evicted before they were settled (fleet mode:
    /// lost only if the stream moves to another replica).
    pub evicted_unsettled_events: u64,
    /// Times the stream moved to another replica (fleet mode).
    pub replica_moves: u64,
    /// Events that could not be converted (interpreter shutting down).
    pub discarded_events: u64,
    /// Events written to a spool file.
    pub spooled_events: u64,
    /// Events the spool had no room for (or could not write).
    pub spool_dropped_events: u64,
    /// Events of spool files (left by earlier processes) acknowledged.
    pub replayed_events: u64,
    /// Spool files replayed and deleted.
    pub replayed_files: u64,
    /// Events of spool files the collector refused as invalid.
    pub replay_lost_events: u64,
    /// Events the sender held when it died, not delivered.
    pub lost_events: u64,
    /// Times the sender thread died (panicked, or returned before its
    /// queue was closed).
    pub sender_deaths: u64,
    /// Times it was started again after a death.
    pub sender_restarts: u64,
    /// Whether the sender died and is not started again (its restart
    /// budget is spent): events are dropped and counted from then on.
    pub sender_stopped: bool,
    /// Whether a stream is open.
    pub connected: bool,
    /// Whether the sender stopped looking at the queue on a timer, until
    /// the next event wakes it ([`SenderConfig::idle_sleep_after`]).
    pub asleep: bool,
    /// Last connection error, empty if none.
    pub last_error: String,
}

impl SenderShared {
    /// Events whose fate is decided: acknowledged, evicted, discarded,
    /// spooled, dropped by the spool or lost with a dying sender.
    pub fn settled_events(&self) -> u64 {
        self.acked_events.load(Ordering::Acquire)
            + self.evicted_events.load(Ordering::Acquire)
            + self.discarded_events.load(Ordering::Acquire)
            + self.spooled_events.load(Ordering::Acquire)
            + self.spool_dropped_events.load(Ordering::Acquire)
            + self.lost_events.load(Ordering::Acquire)
    }

    /// Whether the sender died and is not started again.
    pub fn is_stopped(&self) -> bool {
        self.sender_stopped.load(Ordering::Acquire)
    }

    /// Whether spool files (of earlier processes) are being looked for or
    /// replayed.
    pub fn is_replaying(&self) -> bool {
        self.replay_busy.load(Ordering::Acquire)
    }

    /// Asks the sender to write everything it holds (queued and
    /// unacknowledged events) to its spool, and blocks the calling thread
    /// until it did or `timeout` passed. Returns whether it did. Without a
    /// spool the sender only acknowledges the request. Must not be called
    /// on the sender thread.
    pub fn spool_and_wait(&self, timeout: Duration) -> bool {
        self.request_and_wait(&self.spool_notify, &self.spool_rounds, timeout)
    }

    /// Asks the sender for its exit notices ([`Convert::notice`]): the
    /// outage, if one is on and was not reported yet, and the events of the
    /// `target` captured that are not delivered (spooled or lost). Blocks
    /// the calling thread until it made them or `timeout` passed; returns
    /// whether it did. Must not be called on the sender thread.
    pub fn report_exit_and_wait(&self, target: u64, timeout: Duration) -> bool {
        self.exit_target.store(target, Ordering::Release);
        self.request_and_wait(&self.exit_notify, &self.exit_rounds, timeout)
    }

    fn request_and_wait(&self, notify: &Notify, rounds: &AtomicU64, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        let round = rounds.load(Ordering::Acquire);
        notify.notify_one();
        self.poll_until(deadline, || rounds.load(Ordering::Acquire) > round)
    }

    /// Blocks the calling thread, polling every `SETTLE_POLL`, until `done`
    /// holds (true), or the sender stopped or `deadline` passed (false).
    fn poll_until(&self, deadline: std::time::Instant, done: impl Fn() -> bool) -> bool {
        loop {
            if done() {
                return true;
            }
            if self.is_stopped() {
                return false;
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return false;
            }
            std::thread::sleep(SETTLE_POLL.min(deadline - now));
        }
    }

    /// Whether a stream to the collector is open.
    pub fn is_connected(&self) -> bool {
        self.connected.load(Ordering::Acquire)
    }

    /// Counts events discarded outside the sender.
    pub fn add_discarded(&self, n: u64) {
        self.discarded_events.fetch_add(n, Ordering::AcqRel);
    }

    /// Blocks the calling thread until the streams planned moves ended have
    /// delivered their handoff, or `timeout` passed; whether they have. A
    /// handoff waits behind what the replica left behind has not read yet;
    /// cut off by the process's exit, it never reaches that replica, which
    /// takes the agent for dead and closes its open turns, whole on the
    /// next replica, as incomplete. Must not be called on the sender thread.
    pub fn wait_handoffs(&self, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        self.poll_until(deadline, || {
            self.leaving_streams.load(Ordering::Acquire) == 0
        })
    }

    /// Blocks the calling thread until `target` events are settled (and no
    /// spool file is being replayed) or `timeout` passed; asks the sender to
    /// look at the queue at once. Returns whether everything settled; at
    /// once (false) when the sender is stopped and `target` is out of reach.
    /// Must not be called on the sender thread.
    pub fn wait_settled(&self, target: u64, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        let done = || self.settled_events() >= target && !self.is_replaying();
        if done() {
            return true;
        }
        self.flush_notify.notify_one();
        self.poll_until(deadline, done)
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> SenderStats {
        SenderStats {
            sent_batches: self.sent_batches.load(Ordering::Acquire),
            acked_events: self.acked_events.load(Ordering::Acquire),
            unacked_batches: self.unacked_batches.load(Ordering::Acquire),
            evicted_events: self.evicted_events.load(Ordering::Acquire),
            evicted_unsettled_events: self.evicted_unsettled_events.load(Ordering::Acquire),
            replica_moves: self.replica_moves.load(Ordering::Acquire),
            discarded_events: self.discarded_events.load(Ordering::Acquire),
            spooled_events: self.spooled_events.load(Ordering::Acquire),
            spool_dropped_events: self.spool_dropped_events.load(Ordering::Acquire),
            replayed_events: self.replayed_events.load(Ordering::Acquire),
            replayed_files: self.replayed_files.load(Ordering::Acquire),
            replay_lost_events: self.replay_lost_events.load(Ordering::Acquire),
            lost_events: self.lost_events.load(Ordering::Acquire),
            sender_deaths: self.sender_deaths.load(Ordering::Acquire),
            sender_restarts: self.sender_restarts.load(Ordering::Acquire),
            sender_stopped: self.is_stopped(),
            connected: self.connected.load(Ordering::Acquire),
            asleep: self.asleep.load(Ordering::Acquire),
            last_error: self
                .last_error
                .lock()
                .map(|e| e.clone())
                .unwrap_or_default(),
        }
    }

    fn set_error(&self, error: &dyn std::fmt::Display) {
        if let Ok(mut last) = self.last_error.lock() {
            *last = error.to_string();
        }
    }
}

/// A started sender with a queue of its own: the queue's producer side, the
/// counters shared with the sender, and its thread (which ends once `tx` is
/// dropped and what it holds is delivered or `close_grace` has passed).
#[derive(Debug)]
pub struct Started<T> {
    /// Where items are queued.
    pub tx: QueueTx<T>,
    /// The sender's counters, flush and spool handshakes.
    pub shared: Arc<SenderShared>,
    /// The sender thread.
    pub thread: std::thread::JoinHandle<()>,
}

/// Starts a sender thread fed by a fresh queue of `capacity` items (the load
/// generator, the benchmarks and the tests; the Python extension makes its
/// queue and shared state apart and calls [`spawn`]).
pub fn start<C>(
    converter: C,
    config: SenderConfig,
    capacity: usize,
) -> std::io::Result<Started<C::Item>>
where
    C: Convert + Send + 'static,
{
    let (tx, rx) = event_queue(capacity);
    let shared = Arc::new(SenderShared::default());
    let thread = spawn(
        rx,
        converter,
        config,
        Arc::clone(&shared),
        Arc::clone(tx.counters()),
    )?;
    Ok(Started { tx, shared, thread })
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn next_conn_event(conn: &mut Option<Conn>) -> ConnEvent {
    match conn {
        Some(c) => c
            .events
            .recv()
            .await
            .unwrap_or(ConnEvent::Closed(ConnError::Ended)),
        None => std::future::pending().await,
    }
}

/// The sender loop over `parts` (which outlive it, so a supervisor can
/// start it again after a panic, see [`supervise`]); returns once the queue
/// is closed and what it held is delivered (or `close_grace` passed).
pub(crate) async fn run<C: Convert>(
    parts: &mut Parts<C>,
    config: &SenderConfig,
    shared: Arc<SenderShared>,
    queue: Arc<QueueCounters>,
) {
    let Parts {
        rx,
        batcher,
        pending,
        buf,
    } = parts;
    let mut reach = Reach::new(&config.endpoint.url, config.report_unreachable_after);
    let holding = Holding {
        max_batches: config.max_unacked_batches,
        max_bytes: config.max_unacked_bytes,
        spool_dir: config.spool.as_ref().map(|s| s.dir.clone()),
    };
    let mut route = match Route::new(
        &config.endpoint,
        &config.conn,
        &config.fleet,
        &config.shim.instance_id,
        Instant::now(),
    ) {
        Ok(route) => route,
        Err(e) => {
            shared.set_error(&e);
            reach.failed(Instant::now(), reach::error_chain(&e), 0);
            Route::Fixed(None)
        }
    };
    let max_batch = config.max_batch_events.max(1);
    let mut backoff = Backoff::new(config.backoff_min, config.backoff_max);
    let mut conn: Option<Conn> = None;
    // Whether the open stream's collector settles (fleet mode), and
    // whether a fleet collector that does not was said once.
    let mut settles = false;
    let mut said_no_settlement = false;
    // The replica of the last stream that was answered (fleet mode).
    let mut last_replica = None;
    // Spool files of earlier processes go on streams of their own, opened
    // before the live one.
    let _replay = match (&config.spool, route.replay()) {
        (Some(spool), Some(replay)) => {
            shared.replay_busy.store(true, Ordering::Release);
            let options = spool::ReplayOptions {
                route: replay,
                conn: config.conn.clone(),
                backoff_min: config.backoff_min,
                backoff_max: config.backoff_max,
            };
            Some(AbortOnDrop(tokio::spawn(spool::replay_dir(
                spool.dir.clone(),
                options,
                Arc::clone(&shared),
            ))))
        }
        _ => {
            shared.replay_busy.store(false, Ordering::Release);
            None
        }
    };
    let mut reconnect_at = Instant::now();
    // When the queue is looked at next, and the interval after an empty look.
    let mut poll_at = Instant::now() + config.linger;
    let mut idle_poll = config.linger;
    // When events were last taken, and whether the timer is stopped until
    // a push wakes the sender.
    let mut busy_at = Instant::now();
    let mut asleep = false;
    // Set once the queue is closed and drained: deliver what is held until then.
    let mut close_deadline: Option<Instant> = None;
    let far = Duration::from_secs(86_400);

    loop {
        let now = Instant::now();
        if close_deadline.is_some_and(|d| pending.is_empty() || now >= d) {
            break;
        }
        if conn.is_none() && now >= reconnect_at && route.usable() {
            match route.open(now) {
                Ok((target, _)) => {
                    conn = Some(Conn::open(target, &config.conn));
                    pending.mark_all_unsent();
                }
                Err(error) => {
                    shared.set_error(&error);
                    let evicted = shared.evicted_events.load(Ordering::Acquire);
                    reach.failed(now, error, evicted);
                    reconnect_at = route.failed(now, now + backoff.next_delay());
                }
            }
        }
        if let Some(c) = conn.as_ref() {
            let floor_seq = pending.floor_seq();
            while let Some(batch) = pending.next_unsent() {
                let mut batch = batch.clone();
                batch.floor_seq = floor_seq;
                match c.out.try_send(batch) {
                    Ok(()) => {
                        pending.mark_next_sent();
                        shared.sent_batches.fetch_add(1, Ordering::AcqRel);
                    }
                    // Full: retried after FEED_RETRY. Closed: the task ended
                    // and its Closed event is on the way.
                    Err(TrySendError::Full(_) | TrySendError::Closed(_)) => break,
                }
            }
        }
        shared
            .unacked_batches
            .store(pending.len() as u64, Ordering::Release);

        let can_connect = conn.is_none() && route.usable();
        let resolve_at = route.resolve_at();
        let open = close_deadline.is_none();
        tokio::select! {
            biased;
            event = next_conn_event(&mut conn) => match event {
                ConnEvent::Connected { settles: settling } => {
                    shared.connected.store(true, Ordering::Release);
                    if let Route::Fleet { current, .. } = &route {
                        if last_replica.is_some() && last_replica != *current {
                            shared.replica_moves.fetch_add(1, Ordering::AcqRel);
                        }
                        last_replica = *current;
                        settles = settling;
                        pending.set_retain(settling);
                        if !settling && !said_no_settlement {
                            said_no_settlement = true;
                            batcher.converter.notice(&Notice::NoSettlement {
                                endpoint: reach::shown_endpoint(&config.endpoint.url),
                            });
                        }
                    }
                    let evicted = shared.evicted_events.load(Ordering::Acquire);
                    if let Some(notice) = reach.connected(Instant::now(), evicted) {
                        batcher.converter.notice(&notice);
                    }
                }
                ConnEvent::Ack(ack) => {
                    let mut acked = pending.ack(ack.first_seq, ack.last_seq);
                    if settles && ack.settled_seq > 0 {
                        acked += pending.settle(ack.settled_seq);
                    }
                    shared.acked_events.fetch_add(acked, Ordering::AcqRel);
                    backoff.reset();
                    if ack.leave && route.is_fleet() {
                        route.leaving(Instant::now());
                        route::move_off(&mut conn, settles, pending, config, &shared, &queue);
                        reconnect_at = Instant::now();
                    }
                }
                ConnEvent::Closed(error) => {
                    conn = None;
                    shared.connected.store(false, Ordering::Release);
                    shared.set_error(&error);
                    let now = Instant::now();
                    let evicted = shared.evicted_events.load(Ordering::Acquire);
                    reach.failed(now, reach::error_chain(&error), evicted);
                    pending.mark_all_unsent();
                    reconnect_at = route.failed(now, now + backoff.next_delay());
                }
            },
            () = shared.flush_notify.notified() => {
                if asleep {
                    asleep = false;
                    rx.wake_up();
                    shared.asleep.store(false, Ordering::Release);
                }
                poll_at = Instant::now();
            }
            () = rx.woken(), if open => {
                // A producer woke the sender, and cleared its flag. A plain
                // push ending a sleep is looked at after `linger`, as by an
                // awake sender: the events of the step it starts go in the
                // same batch, converted after that step's hooks.
                let now = Instant::now();
                poll_at = if rx.take_urgent() || !asleep { now } else { now + config.linger };
                asleep = false;
                shared.asleep.store(false, Ordering::Release);
            }
            () = tokio::time::sleep_until(reach.report_at().unwrap_or(now + far)), if reach.report_at().is_some() => {
                if let Some(notice) = reach.report(Instant::now(), &holding) {
                    batcher.converter.notice(&notice);
                }
            }
            () = shared.exit_notify.notified() => {
                let count = reach::ExitCount {
                    captured: shared.exit_target.load(Ordering::Acquire),
                    settled: shared.settled_events(),
                    spooled: shared.spooled_events.load(Ordering::Acquire),
                    spool_dropped: shared.spool_dropped_events.load(Ordering::Acquire),
                };
                for notice in reach.exit_notices(Instant::now(), &holding, &count) {
                    batcher.converter.notice(&notice);
                }
                shared.exit_rounds.fetch_add(1, Ordering::AcqRel);
            }
            () = shared.spool_notify.notified() => {
                batcher.spool_all(rx, buf, pending, &shared, &queue, config.spool.as_ref(), max_batch);
                shared.spool_rounds.fetch_add(1, Ordering::AcqRel);
            }
            () = tokio::time::sleep_until(poll_at), if open && !asleep => {
                let mut taken = 0;
                let mut more = false;
                for _ in 0..MAX_BATCHES_PER_WAKE {
                    let room = max_batch.saturating_sub(buf.len());
                    taken += rx.drain_into(buf, room);
                    if buf.is_empty() {
                        break;
                    }
                    more = buf.len() >= max_batch;
                    let items = std::mem::replace(buf, Vec::with_capacity(max_batch));
                    batcher.cut(items, pending, &shared, &queue);
                    if !more {
                        break;
                    }
                }
                let now = Instant::now();
                poll_at = if more {
                    // More may be queued: come back right after looking at acks.
                    now
                } else if taken > 0 {
                    idle_poll = config.linger;
                    busy_at = now;
                    now + config.linger
                } else if now.duration_since(busy_at) >= config.idle_sleep_after {
                    // Nothing for a while: stop the timer, unless an item
                    // came in since the look.
                    asleep = rx.fall_asleep();
                    shared.asleep.store(asleep, Ordering::Release);
                    now
                } else {
                    idle_poll = (idle_poll * 2).clamp(config.linger, config.idle_poll_max.max(config.linger));
                    now + idle_poll
                };
                if rx.is_finished() {
                    close_deadline = Some(now + config.close_grace);
                }
            }
            () = tokio::time::sleep_until(reconnect_at), if can_connect => {}
            () = tokio::time::sleep_until(resolve_at.unwrap_or(now + far)), if resolve_at.is_some() => {
                match route.resolve(Instant::now()) {
                    Ok(true) => {
                        route.left();
                        route::move_off(&mut conn, settles, pending, config, &shared, &queue);
                        reconnect_at = Instant::now();
                    }
                    Ok(false) => {}
                    Err(error) => shared.set_error(&error),
                }
            }
            () = tokio::time::sleep(FEED_RETRY), if conn.is_some() && pending.has_unsent() => {}
            () = tokio::time::sleep_until(close_deadline.unwrap_or(now + far)), if !open => {}
        }
    }
    // What could not be delivered within `close_grace`.
    batcher.spool_all(
        rx,
        buf,
        pending,
        &shared,
        &queue,
        config.spool.as_ref(),
        max_batch,
    );
    // The streams planned moves ended get what is left of the close grace
    // to deliver their handoff ([`SenderShared::wait_handoffs`]).
    let until = close_deadline.unwrap_or_else(Instant::now);
    while shared.leaving_streams.load(Ordering::Acquire) > 0 && Instant::now() < until {
        tokio::time::sleep(SETTLE_POLL).await;
    }
    shared.connected.store(false, Ordering::Release);
    shared.replay_busy.store(false, Ordering::Release);
}

/// The events `seqs` (hook `pre_tool_call`) of `shim` in one batch, for the
/// sender's tests.
#[cfg(test)]
fn test_batch(
    shim: Option<ShimInfo>,
    seqs: std::ops::RangeInclusive<u64>,
) -> hermes_proto::v1::EventBatch {
    let events = seqs.map(|seq| Event {
        seq,
        hook: "pre_tool_call".into(),
        ..Event::default()
    });
    hermes_proto::v1::EventBatch {
        shim,
        events: events.collect(),
        ..hermes_proto::v1::EventBatch::default()
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_fleet;
#[cfg(test)]
mod tests_reach;
#[cfg(test)]
mod tests_spool;
#[cfg(test)]
mod tests_supervise;
