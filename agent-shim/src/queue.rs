//! The hand-off from hook threads to the sender thread.
//!
//! Owns: the bounded event queue, the per-shim-instance sequence numbers and
//! the hook-path counters (`enqueued`, `dropped`).
//!
//! Invariants:
//! - [`QueueTx::push`] never blocks, never waits for the consumer and takes no
//!   lock the consumer holds: it is a `try_send` on a bounded tokio mpsc
//!   channel (lock-free on the sending side; its block list grows lazily, so a
//!   large capacity costs no memory up front).
//! - [`QueueTx::push`] does not wake a consumer that is awake, so it makes
//!   no system call: that consumer takes items with [`QueueRx::drain_into`]
//!   (which registers no waker) on its own timer. A producer that needs the
//!   item out at once uses [`QueueTx::push_and_wake`], which also wakes the
//!   consumer waiting in [`QueueRx::woken`] (an eventfd write when it is
//!   parked). Dropping the producer wakes the consumer too, so it sees the
//!   close at once.
//! - A consumer with nothing to do for a while can stop its timer: after
//!   [`QueueRx::fall_asleep`] returned true, the next push wakes it (only
//!   that one: it clears the flag), so no item is left behind. The flag and
//!   the `enqueued` counter are written and read `SeqCst`: either the
//!   consumer's look at `enqueued` sees a producer's item, or that producer
//!   sees the flag (the consumer sets it before it looks).
//! - When the queue is full (or the consumer is gone) the pushed item is
//!   handed back to the caller (so it can be dropped where that is safe, e.g.
//!   with the GIL held) and `dropped` is incremented: after any set of pushes,
//!   `enqueued + dropped == pushes`.
//! - [`SeqSource`] hands out unique numbers starting at 1. In the Python
//!   extension the number is taken and the item pushed without running Python
//!   code in between, while holding the GIL, so queue order equals seq order
//!   for Python callers; the sender still sorts each batch by seq.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::sync::{Notify, mpsc};

/// Per shim instance sequence numbers: unique, starting at 1.
#[derive(Debug)]
pub struct SeqSource(AtomicU64);

impl SeqSource {
    /// A source whose first number is 1.
    pub const fn new() -> Self {
        SeqSource(AtomicU64::new(1))
    }

    /// Takes the next number.
    #[inline]
    pub fn next_seq(&self) -> u64 {
        self.0.fetch_add(1, Ordering::Relaxed)
    }
}

impl Default for SeqSource {
    fn default() -> Self {
        Self::new()
    }
}

/// Hook-path counters, shared by the producers and readers of statistics.
#[derive(Debug, Default)]
pub struct QueueCounters {
    enqueued: AtomicU64,
    dropped: AtomicU64,
}

impl QueueCounters {
    /// Items accepted by the queue.
    pub fn enqueued(&self) -> u64 {
        self.enqueued.load(Ordering::Acquire)
    }

    /// Items dropped because the queue was full or closed.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Acquire)
    }
}

/// Creates a queue holding at most `capacity` items (at least 1).
pub fn event_queue<T>(capacity: usize) -> (QueueTx<T>, QueueRx<T>) {
    let (tx, rx) = mpsc::channel(capacity.max(1));
    let counters = Arc::new(QueueCounters::default());
    let wake = Arc::new(Wake::default());
    (
        QueueTx {
            tx,
            counters: Arc::clone(&counters),
            wake: WakeOnDrop(Arc::clone(&wake)),
        },
        QueueRx {
            rx,
            wake,
            counters,
            taken: 0,
        },
    )
}

/// How producers wake the consumer.
#[derive(Debug, Default)]
struct Wake {
    notify: Notify,
    /// The consumer stopped its timer: the next push must wake it.
    asleep: AtomicBool,
    /// A producer asked for its item to go out at once (or is gone).
    urgent: AtomicBool,
}

impl Wake {
    fn wake_urgently(&self) {
        self.urgent.store(true, Ordering::SeqCst);
        self.asleep.store(false, Ordering::SeqCst);
        self.notify.notify_one();
    }
}

/// The producing side, used on hook threads.
#[derive(Debug)]
pub struct QueueTx<T> {
    tx: mpsc::Sender<T>,
    counters: Arc<QueueCounters>,
    /// Declared after `tx`: fields are dropped in order, so the channel is
    /// closed by the time the consumer is woken.
    wake: WakeOnDrop,
}

/// Wakes the consumer when dropped (the producer is gone).
#[derive(Debug)]
struct WakeOnDrop(Arc<Wake>);

impl Drop for WakeOnDrop {
    fn drop(&mut self) {
        self.0.wake_urgently();
    }
}

impl<T> QueueTx<T> {
    /// Enqueues `item` without blocking. An awake consumer is not woken (it
    /// finds the item on its next look); an asleep one is
    /// ([`QueueRx::fall_asleep`]). On a full or closed queue the item comes
    /// back as `Err` and the drop is counted.
    #[inline]
    pub fn push(&self, item: T) -> Result<(), T> {
        let pushed = self.enqueue(item);
        let wake = &self.wake.0;
        if pushed.is_ok()
            && wake.asleep.load(Ordering::SeqCst)
            && wake.asleep.swap(false, Ordering::SeqCst)
        {
            wake.notify.notify_one();
        }
        pushed
    }

    /// Like [`QueueTx::push`], then wakes the consumer (or leaves it a
    /// permit if it is busy), so the item goes out without waiting for the
    /// consumer's timer.
    pub fn push_and_wake(&self, item: T) -> Result<(), T> {
        let pushed = self.enqueue(item);
        self.wake.0.wake_urgently();
        pushed
    }

    #[inline]
    fn enqueue(&self, item: T) -> Result<(), T> {
        match self.tx.try_send(item) {
            Ok(()) => {
                self.counters.enqueued.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
            Err(
                mpsc::error::TrySendError::Full(item) | mpsc::error::TrySendError::Closed(item),
            ) => {
                self.counters.dropped.fetch_add(1, Ordering::AcqRel);
                Err(item)
            }
        }
    }

    /// The counters of this queue.
    pub fn counters(&self) -> &Arc<QueueCounters> {
        &self.counters
    }
}

/// The consuming side, owned by the sender.
#[derive(Debug)]
pub struct QueueRx<T> {
    rx: mpsc::Receiver<T>,
    wake: Arc<Wake>,
    counters: Arc<QueueCounters>,
    /// Items taken so far.
    taken: u64,
}

impl<T> QueueRx<T> {
    /// Resolves when a producer called [`QueueTx::push_and_wake`], pushed
    /// while the consumer was asleep, or was dropped, since the last time
    /// this resolved. Cancel safe.
    pub async fn woken(&self) {
        self.wake.notify.notified().await;
    }

    /// Declares the consumer asleep, so the next push wakes it through
    /// [`QueueRx::woken`]. Returns false (staying awake) when an item is
    /// queued that it has not taken: it should look at once instead.
    pub fn fall_asleep(&self) -> bool {
        self.wake.asleep.store(true, Ordering::SeqCst);
        // Pushes counted before this load are seen here; any later one
        // sees the flag. Taken items whose count is not in yet make this
        // look lower, and their producers, later than the load, wake us.
        if self.counters.enqueued.load(Ordering::SeqCst) > self.taken {
            self.wake.asleep.store(false, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// Ends a sleep the producers did not end ([`QueueRx::fall_asleep`]):
    /// pushes no longer wake the consumer.
    pub fn wake_up(&self) {
        self.wake.asleep.store(false, Ordering::SeqCst);
    }

    /// Whether a producer called [`QueueTx::push_and_wake`] or was dropped
    /// since the last call; a wake without it came from a plain push to an
    /// asleep consumer.
    pub fn take_urgent(&self) -> bool {
        self.wake.urgent.swap(false, Ordering::SeqCst)
    }

    /// Appends up to `limit` already queued items to `buf` without waiting;
    /// returns how many.
    pub fn drain_into(&mut self, buf: &mut Vec<T>, limit: usize) -> usize {
        let mut n = 0;
        while n < limit {
            match self.rx.try_recv() {
                Ok(item) => {
                    buf.push(item);
                    n += 1;
                }
                Err(_) => break,
            }
        }
        self.taken += n as u64;
        n
    }

    /// Whether the producer is gone and every item was taken: nothing will
    /// ever come again.
    pub fn is_finished(&self) -> bool {
        self.rx.is_closed() && self.rx.is_empty()
    }

    /// Items taken so far ([`QueueRx::drain_into`]).
    pub fn taken(&self) -> u64 {
        self.taken
    }

    /// Closes the queue from the consumer's side (a consumer that stops
    /// for good): every later push fails at once and counts as dropped;
    /// what is queued can still be drained.
    pub fn close(&mut self) {
        self.rx.close();
    }

    /// Number of queued items.
    pub fn len(&self) -> usize {
        self.rx.len()
    }

    /// Whether no item is queued.
    pub fn is_empty(&self) -> bool {
        self.rx.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::time::{Duration, Instant};

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    fn woken_within<T>(rt: &tokio::runtime::Runtime, rx: &QueueRx<T>, ms: u64) -> bool {
        rt.block_on(async {
            tokio::time::timeout(Duration::from_millis(ms), rx.woken())
                .await
                .is_ok()
        })
    }

    #[test]
    fn full_queue_returns_at_once_and_counts_drops() {
        let (tx, mut rx) = event_queue::<u64>(4);
        for i in 0..4 {
            assert!(tx.push(i).is_ok());
        }
        let started = Instant::now();
        for i in 4..1004 {
            assert_eq!(tx.push(i), Err(i));
        }
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(tx.counters().enqueued(), 4);
        assert_eq!(tx.counters().dropped(), 1000);
        let mut buf = Vec::new();
        assert_eq!(rx.drain_into(&mut buf, 100), 4);
        assert_eq!(buf, [0, 1, 2, 3]);
        // Space again after draining.
        assert!(tx.push(7).is_ok());
    }

    #[test]
    fn closed_queue_counts_drops() {
        let (tx, rx) = event_queue::<u8>(4);
        drop(rx);
        assert_eq!(tx.push(1), Err(1));
        assert_eq!(tx.counters().dropped(), 1);
        assert_eq!(tx.counters().enqueued(), 0);
    }

    #[test]
    fn concurrent_pushers_unique_seqs() {
        const THREADS: usize = 8;
        const PER_THREAD: usize = 5_000;
        let (tx, mut rx) = event_queue::<u64>(10_000);
        let tx = Arc::new(tx);
        let seqs = Arc::new(SeqSource::new());
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                let tx = Arc::clone(&tx);
                let seqs = Arc::clone(&seqs);
                std::thread::spawn(move || {
                    let mut dropped = 0usize;
                    for _ in 0..PER_THREAD {
                        if tx.push(seqs.next_seq()).is_err() {
                            dropped += 1;
                        }
                    }
                    dropped
                })
            })
            .collect();
        let dropped: usize = handles
            .into_iter()
            .map(|h| h.join().unwrap_or(usize::MAX))
            .sum();
        let mut buf = Vec::new();
        rx.drain_into(&mut buf, usize::MAX);
        let pushed = THREADS * PER_THREAD;
        assert_eq!(buf.len(), pushed - dropped);
        assert_eq!(tx.counters().dropped() as usize, dropped);
        assert_eq!(tx.counters().enqueued() as usize, pushed - dropped);
        assert!(dropped > 0, "capacity 10000 < 40000 pushes, some must drop");
        let unique: HashSet<u64> = buf.iter().copied().collect();
        assert_eq!(unique.len(), buf.len(), "every seq unique");
        assert!(buf.iter().all(|&s| (1..=pushed as u64).contains(&s)));
    }

    #[test]
    fn seq_starts_at_one() {
        let seqs = SeqSource::new();
        assert_eq!(seqs.next_seq(), 1);
        assert_eq!(seqs.next_seq(), 2);
    }

    #[test]
    fn push_wakes_nobody_and_push_and_wake_does() {
        let rt = runtime();
        let (tx, mut rx) = event_queue::<u32>(16);
        let woken_within = |rx: &QueueRx<u32>, ms: u64| woken_within(&rt, rx, ms);
        assert!(tx.push(1).is_ok());
        assert!(!woken_within(&rx, 50), "a plain push must not wake");
        assert!(tx.push_and_wake(2).is_ok());
        assert!(woken_within(&rx, 5_000), "push_and_wake must wake");
        assert!(rx.take_urgent());
        assert!(!rx.take_urgent(), "taken");
        let mut buf = Vec::new();
        assert_eq!(rx.drain_into(&mut buf, 16), 2);
        assert_eq!(buf, [1, 2]);
        assert!(!rx.is_finished());
        // A wake from another thread reaches a parked consumer.
        let waker = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            let _ = tx.push(3);
            drop(tx);
        });
        assert!(woken_within(&rx, 5_000), "dropping the producer must wake");
        waker.join().unwrap();
        assert!(!rx.is_finished(), "an item is still queued");
        assert_eq!(rx.drain_into(&mut buf, 16), 1);
        assert!(rx.is_finished());
    }

    #[test]
    fn a_push_wakes_a_sleeping_consumer_once() {
        let rt = runtime();
        let (tx, mut rx) = event_queue::<u32>(16);
        let woken_within = |rx: &QueueRx<u32>, ms: u64| woken_within(&rt, rx, ms);
        assert!(rx.fall_asleep());
        assert!(tx.push(1).is_ok());
        assert!(woken_within(&rx, 5_000), "a push must wake a sleeper");
        assert!(!rx.take_urgent(), "a plain push is not urgent");
        assert!(tx.push(2).is_ok());
        assert!(!woken_within(&rx, 50), "only the first push wakes");
        let mut buf = Vec::new();
        assert_eq!(rx.drain_into(&mut buf, 16), 2);
        // A consumer that woke on its own (a flush) is not woken by pushes.
        assert!(rx.fall_asleep());
        rx.wake_up();
        assert!(tx.push(3).is_ok());
        assert!(!woken_within(&rx, 50), "an awake consumer is not woken");
    }

    #[test]
    fn a_consumer_cannot_fall_asleep_over_a_queued_item() {
        let (tx, mut rx) = event_queue::<u32>(16);
        assert!(tx.push(1).is_ok());
        assert!(!rx.fall_asleep(), "an item is queued");
        let mut buf = Vec::new();
        assert_eq!(rx.drain_into(&mut buf, 16), 1);
        assert!(rx.fall_asleep());
        // A full queue's refused item wakes nobody and counts nothing.
        let (tx, rx) = event_queue::<u32>(1);
        assert!(tx.push(1).is_ok());
        assert_eq!(tx.push(2), Err(2));
        assert!(!rx.fall_asleep());
    }

    #[test]
    fn no_push_is_left_behind_by_a_sleeping_consumer() {
        // Producers push with pauses while the consumer falls asleep
        // whenever it finds the queue empty: a lost wake-up leaves an item
        // queued while the consumer waits out its timeout.
        const THREADS: usize = 4;
        const PER_THREAD: usize = 2_000;
        let rt = runtime();
        let (tx, mut rx) = event_queue::<u64>(THREADS * PER_THREAD);
        let tx = Arc::new(tx);
        let producers: Vec<_> = (0..THREADS)
            .map(|t| {
                let tx = Arc::clone(&tx);
                std::thread::spawn(move || {
                    for i in 0..PER_THREAD {
                        assert!(tx.push((t * PER_THREAD + i) as u64).is_ok());
                        if i % (3 + t) == 0 {
                            std::thread::yield_now();
                        }
                        if i % 100 == 0 {
                            std::thread::sleep(Duration::from_micros(50));
                        }
                    }
                })
            })
            .collect();
        let mut buf = Vec::new();
        let (mut sleeps, mut lost) = (0, 0);
        while buf.len() < THREADS * PER_THREAD {
            if rx.drain_into(&mut buf, usize::MAX) > 0 || !rx.fall_asleep() {
                continue;
            }
            sleeps += 1;
            if !woken_within(&rt, &rx, 2_000) {
                rx.wake_up();
                lost += usize::from(!rx.is_empty());
            }
        }
        for producer in producers {
            producer.join().unwrap();
        }
        assert_eq!(lost, 0, "a queued item waited for a consumer asleep");
        assert!(sleeps > 0, "the consumer never fell asleep");
        let mut seen = buf.clone();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), THREADS * PER_THREAD);
    }

    #[test]
    fn a_consumer_woken_by_the_producer_s_drop_finds_the_queue_closed() {
        // The wake used to come before the channel closed: a consumer quick
        // enough saw an open, empty queue and slept until its next timer.
        let rt = runtime();
        for _ in 0..200 {
            let (tx, rx) = event_queue::<u8>(4);
            let dropper = std::thread::spawn(move || drop(tx));
            rt.block_on(rx.woken());
            assert!(rx.is_finished());
            dropper.join().unwrap();
        }
    }
}
