//! The sender thread and its supervision.
//!
//! Owns: the sender thread ([`spawn`]): its runtime, the runs of the sender
//! loop, and what happens when a run ends other than by the queue's close:
//! a panic (caught on the thread), a loop that returns while its queue is
//! open, a runtime that cannot be built. Also the restart budget
//! ([`RestartPolicy`]) and the panic hook that keeps the sender's panics off
//! the agent's terminal.
//!
//! Invariants:
//! - The agent never sees a death: hooks push to the queue as before (it
//!   buffers while the sender restarts; when full, or closed once the sender
//!   is stopped, the push fails at once and counts as dropped); nothing is
//!   raised into the agent and no wait outlives its timeout.
//! - Each death is counted (`sender_deaths`), its cause (the panic's message
//!   and location) kept as `last_error` and said once through
//!   [`Convert::notice`].
//! - A dead sender is started again after [`RestartPolicy::delay`] with the
//!   state it held ([`Parts`]: the queue, the unacknowledged batches, the
//!   stream's numbering), counted in `sender_restarts`. Only the items the
//!   dying run had in hand are lost: counted in `lost_events` (part of the
//!   settled events, so `flush` never waits for them) and in the
//!   `dropped_events` the next batches report to the collector.
//! - At most [`RestartPolicy::max_restarts`] deaths within
//!   [`RestartPolicy::window`] are restarted: a sender that keeps dying (a
//!   bug every batch hits) is stopped. Its queue is closed, what it held is
//!   counted as lost, `sender_stopped` is set and every wait on it returns
//!   at once.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use super::batcher::Parts;
use super::reach::Notice;
use super::{Convert, SenderConfig, SenderShared, THREAD_NAME, run};
use crate::queue::{QueueCounters, QueueRx};

/// When a dead sender is started again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestartPolicy {
    /// Most deaths within `window` that are followed by a restart; one
    /// more stops the sender for good. 0: never restarted.
    pub max_restarts: u32,
    /// The window over which deaths are counted.
    pub window: Duration,
    /// Pause between a death and the restart (the queue buffers meanwhile).
    pub delay: Duration,
}

impl Default for RestartPolicy {
    /// 3 restarts within 60 s, each after 500 ms: a rare fault costs a
    /// pause, a fault every batch hits stops the sender within seconds.
    fn default() -> Self {
        RestartPolicy {
            max_restarts: 3,
            window: Duration::from_secs(60),
            delay: Duration::from_millis(500),
        }
    }
}

/// The deaths within the policy's window.
#[derive(Debug)]
struct Budget {
    policy: RestartPolicy,
    deaths: VecDeque<Instant>,
}

impl Budget {
    fn new(policy: RestartPolicy) -> Self {
        Budget {
            policy,
            deaths: VecDeque::new(),
        }
    }

    /// Records a death at `now`; returns whether it is followed by a restart.
    fn restart_after_death(&mut self, now: Instant) -> bool {
        while self
            .deaths
            .front()
            .is_some_and(|&t| now.duration_since(t) >= self.policy.window)
        {
            self.deaths.pop_front();
        }
        self.deaths.push_back(now);
        self.deaths.len() <= self.policy.max_restarts as usize
    }
}

thread_local! {
    /// Message and location of the last panic on this (sender) thread.
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Installs (once per process) a panic hook that records the sender's
/// panics for its supervisor instead of printing them on stderr (the
/// agent's terminal): the supervisor says them through the shim's logging.
/// Panics of every other thread go to the hook that was installed before.
fn install_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if std::thread::current().name() != Some(THREAD_NAME) {
                previous(info);
                return;
            }
            let message = payload_text(info.payload());
            let text = match info.location() {
                Some(at) => format!("panicked at {}:{}: {message}", at.file(), at.line()),
                None => format!("panicked: {message}"),
            };
            LAST_PANIC.with(|last| *last.borrow_mut() = Some(text));
        }));
    });
}

fn payload_text(payload: &(dyn std::any::Any + Send)) -> &str {
    if let Some(text) = payload.downcast_ref::<&str>() {
        text
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text
    } else {
        "(no message)"
    }
}

/// Starts the sender thread and supervises it (see the module's
/// invariants). With a spool, [`SenderShared::is_replaying`] is true from
/// here until the spool files found at start are replayed.
pub fn spawn<C>(
    rx: QueueRx<C::Item>,
    converter: C,
    config: SenderConfig,
    shared: Arc<SenderShared>,
    queue: Arc<QueueCounters>,
) -> std::io::Result<std::thread::JoinHandle<()>>
where
    C: Convert + Send + 'static,
{
    if config.spool.is_some() {
        shared.replay_busy.store(true, Ordering::Release);
    }
    install_panic_hook();
    let thread_shared = Arc::clone(&shared);
    let spawned = std::thread::Builder::new()
        .name(THREAD_NAME.to_owned())
        .spawn(move || {
            background_policy();
            let mut parts = Parts::new(rx, converter, &config);
            supervise(&mut parts, &config, &thread_shared, &queue);
        });
    if spawned.is_err() {
        shared.replay_busy.store(false, Ordering::Release);
    }
    spawned
}

/// Runs the sender loop until its queue is closed and drained, restarting
/// it after a death while the budget allows.
fn supervise<C: Convert>(
    parts: &mut Parts<C>,
    config: &SenderConfig,
    shared: &Arc<SenderShared>,
    queue: &Arc<QueueCounters>,
) {
    let mut budget = Budget::new(config.restart);
    loop {
        let cause = match run_once(parts, config, shared, queue) {
            Ok(()) if parts.rx.is_finished() => return,
            Ok(()) => "its loop returned while its queue was open".to_owned(),
            Err(cause) => cause,
        };
        shared.connected.store(false, Ordering::Release);
        shared.replay_busy.store(false, Ordering::Release);
        let deaths = shared.sender_deaths.fetch_add(1, Ordering::AcqRel) + 1;
        shared.set_error(&format_args!("sender thread died: {cause}"));
        // What the dying run had in hand: taken, neither settled nor held.
        let in_hand = parts
            .rx
            .taken()
            .saturating_sub(shared.settled_events() + parts.held_events());
        let restarting = budget.restart_after_death(Instant::now());
        let lost = if restarting {
            in_hand
        } else {
            in_hand + stop_holding(parts)
        };
        shared.lost_events.fetch_add(lost, Ordering::AcqRel);
        let notice = Notice::SenderDied {
            cause,
            deaths,
            restarting,
            lost,
        };
        // A converter whose logging panics too stays silent.
        let _ = panic::catch_unwind(AssertUnwindSafe(|| parts.batcher.converter.notice(&notice)));
        if !restarting {
            shared.sender_stopped.store(true, Ordering::Release);
            return;
        }
        std::thread::sleep(config.restart.delay);
        shared.sender_restarts.fetch_add(1, Ordering::AcqRel);
    }
}

/// One run of the sender loop on a runtime of its own (dropped with the
/// tasks the run spawned); the cause of its death if it panicked.
fn run_once<C: Convert>(
    parts: &mut Parts<C>,
    config: &SenderConfig,
    shared: &Arc<SenderShared>,
    queue: &Arc<QueueCounters>,
) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot build its runtime: {e}"))?;
    LAST_PANIC.with(|last| last.borrow_mut().take());
    let ran = panic::catch_unwind(AssertUnwindSafe(|| {
        runtime.block_on(run(parts, config, Arc::clone(shared), Arc::clone(queue)));
    }));
    drop(runtime);
    ran.map_err(|payload| {
        LAST_PANIC
            .with(|last| last.borrow_mut().take())
            .unwrap_or_else(|| format!("panicked: {}", payload_text(&*payload)))
    })
}

/// Closes the queue (later pushes are dropped and counted at once) and
/// lets go of everything held; returns how many events that was.
fn stop_holding<C: Convert>(parts: &mut Parts<C>) -> u64 {
    parts.rx.close();
    let mut rest = Vec::new();
    let queued = parts.rx.drain_into(&mut rest, usize::MAX) as u64;
    let held = parts.held_events();
    parts.pending.take_all();
    parts.buf.clear();
    queued + held
}

/// Puts the calling thread (the sender's) under `SCHED_BATCH`, with its nice
/// value and CPU share as they were. The kernel then never lets a wake-up
/// of this thread preempt the thread that woke it: a hook that wakes the
/// sender (the end of a session, [`crate::config::wakes_sender`]) returns to
/// the agent's code at once, and the sender runs on an idle CPU or at the
/// next scheduler tick (`docs/BENCHMARKS.md`). Best effort: where
/// the policy cannot be set (not Linux, a seccomp filter) the thread runs
/// as before.
pub(super) fn background_policy() {
    #[cfg(target_os = "linux")]
    {
        let param = uapi::c::sched_param { sched_priority: 0 };
        let _ = uapi::sched_setscheduler(0, uapi::c::SCHED_BATCH, &param);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_restarts_at_most_max_restarts_deaths_per_window() {
        let policy = RestartPolicy {
            max_restarts: 2,
            window: Duration::from_secs(60),
            delay: Duration::ZERO,
        };
        let mut budget = Budget::new(policy);
        let t0 = Instant::now();
        assert!(budget.restart_after_death(t0));
        assert!(budget.restart_after_death(t0 + Duration::from_secs(1)));
        assert!(!budget.restart_after_death(t0 + Duration::from_secs(2)));
        // Deaths older than the window no longer count.
        let mut budget = Budget::new(policy);
        assert!(budget.restart_after_death(t0));
        assert!(budget.restart_after_death(t0 + Duration::from_secs(10)));
        assert!(budget.restart_after_death(t0 + Duration::from_secs(61)));
        assert!(!budget.restart_after_death(t0 + Duration::from_secs(62)));
    }

    #[test]
    fn no_restart_with_a_zero_budget() {
        let mut budget = Budget::new(RestartPolicy {
            max_restarts: 0,
            ..RestartPolicy::default()
        });
        assert!(!budget.restart_after_death(Instant::now()));
    }
}
