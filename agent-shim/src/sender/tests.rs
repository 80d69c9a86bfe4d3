//! Sender tests against an in-process collector on 127.0.0.1.

use std::collections::BTreeSet;
use std::sync::atomic::AtomicU16;
use std::time::Instant as StdInstant;

use hermes_proto::v1::{Ids, event::Body};

use super::*;
use crate::fake_collector::FakeCollector;
use crate::queue::SeqSource;

/// Test converter: items are already events.
pub(super) struct Passthrough;

impl Convert for Passthrough {
    type Item = Event;
    fn convert(&mut self, items: Vec<Event>) -> Vec<Event> {
        items
    }
}

/// Converter that loses every other item (as if conversion were impossible).
struct LosesHalf;

impl Convert for LosesHalf {
    type Item = Event;
    fn convert(&mut self, items: Vec<Event>) -> Vec<Event> {
        items.into_iter().filter(|e| e.seq % 2 == 0).collect()
    }
}

/// A port nothing listens on, from below Linux' ephemeral range so that no
/// outgoing connection (the sender's own included) can take it meanwhile;
/// probed by connecting (a probe listener could leak into a forked child).
fn free_port() -> u16 {
    static CURSOR: AtomicU16 = AtomicU16::new(0);
    let base = (std::process::id() % 8_000) as u16;
    (0..8_000)
        .map(|_| 22_000 + (base + CURSOR.fetch_add(1, Ordering::Relaxed)) % 8_000)
        .find(|&port| std::net::TcpStream::connect(("127.0.0.1", port)).is_err())
        .unwrap()
}

/// A [`free_port`] and its `http://` endpoint.
pub(super) fn free_endpoint() -> (u16, String) {
    let port = free_port();
    (port, format!("http://127.0.0.1:{port}"))
}

pub(super) fn shim() -> ShimInfo {
    shim_named("0123456789abcdef0123456789abcdef")
}

pub(super) fn shim_named(instance_id: &str) -> ShimInfo {
    ShimInfo {
        instance_id: instance_id.into(),
        service_name: "test".into(),
        host_name: "host".into(),
        pid: 42,
        shim_version: crate::SHIM_VERSION.into(),
        capture: "metadata".into(),
    }
}

pub(super) fn config(endpoint: String) -> SenderConfig {
    let mut config = SenderConfig::new(endpoint, shim());
    config.linger = Duration::from_millis(5);
    config.backoff_min = Duration::from_millis(20);
    config.backoff_max = Duration::from_millis(200);
    config.conn.connect_timeout = Duration::from_millis(500);
    config.close_grace = Duration::from_millis(500);
    config
}

pub(super) struct Harness {
    pub(super) tx: QueueTx<Event>,
    seqs: SeqSource,
    pub(super) shared: Arc<SenderShared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// A fake collector, and a harness whose sender (`converter`, the test
/// [`config`]) delivers to it.
fn delivering<C: Convert<Item = Event> + Send + 'static>(converter: C) -> (FakeCollector, Harness) {
    let collector = FakeCollector::start(0);
    let harness = Harness::start(config(collector.endpoint()), converter);
    (collector, harness)
}

impl Harness {
    pub(super) fn start<C: Convert<Item = Event> + Send + 'static>(
        config: SenderConfig,
        converter: C,
    ) -> Self {
        let Started { tx, shared, thread } = start(converter, config, 100_000).unwrap();
        Harness {
            tx,
            seqs: SeqSource::new(),
            shared,
            thread: Some(thread),
        }
    }

    pub(super) fn push(&self, hook: &str, api_request_id: &str) {
        assert!(self.tx.push(self.event(hook, api_request_id)).is_ok());
    }

    /// Waits (bounded) until `n` events are settled; fails the test
    /// otherwise.
    pub(super) fn settle(&self, n: u64) {
        assert!(
            self.shared.wait_settled(n, Duration::from_secs(10)),
            "{n} events not settled: {:?}",
            self.shared.stats()
        );
    }

    /// Pushes `n` events of `hook`.
    pub(super) fn push_n(&self, n: usize, hook: &str) {
        for _ in 0..n {
            self.push(hook, "");
        }
    }

    /// Pushes `n` events of `hook`, waits (bounded) until every event
    /// pushed so far is settled, and returns the counters then.
    pub(super) fn push_settled(&self, n: usize, hook: &str) -> SenderStats {
        self.push_n(n, hook);
        self.settle(self.enqueued());
        self.shared.stats()
    }

    pub(super) fn push_and_wake(&self, hook: &str) {
        assert!(self.tx.push_and_wake(self.event(hook, "")).is_ok());
    }

    fn event(&self, hook: &str, api_request_id: &str) -> Event {
        Event {
            seq: self.seqs.next_seq(),
            hook: hook.into(),
            ids: Some(Box::new(Ids {
                api_request_id: api_request_id.into(),
                turn_id: "turn".into(),
                ..Default::default()
            })),
            body: Some(Body::Api(Box::default())),
            ..Default::default()
        }
    }

    fn enqueued(&self) -> u64 {
        self.tx.counters().enqueued()
    }

    /// Closes the queue and waits for the sender thread to end.
    pub(super) fn close(mut self) -> Arc<SenderShared> {
        let shared = Arc::clone(&self.shared);
        let thread = self.thread.take();
        drop(self);
        if let Some(thread) = thread {
            thread.join().unwrap();
        }
        shared
    }
}

#[test]
fn delivers_in_order_and_settles() {
    let (collector, harness) = delivering(Passthrough);
    let stats = harness.push_settled(2_000, "post_tool_call");
    assert_eq!(stats.acked_events, 2_000);
    assert_eq!(stats.evicted_events, 0);
    assert!(stats.connected);
    assert!(stats.sent_batches >= 4, "batches of at most 512");
    let seqs = collector.seqs();
    assert_eq!(seqs, (1..=2_000).collect::<Vec<_>>());
    let batches = collector.batches();
    for batch in &batches {
        assert!(batch.events.len() <= 512);
        assert!(batch.events.windows(2).all(|w| w[0].seq < w[1].seq));
        let info = batch.shim.as_ref().unwrap();
        assert_eq!(info.instance_id.len(), 32);
        assert_eq!(info.pid, 42);
    }
    let shared = harness.close();
    assert!(!shared.stats().connected);
}

#[test]
fn numbers_attempts() {
    let (collector, harness) = delivering(Passthrough);
    harness.push("pre_api_request", "a");
    harness.push("api_request_error", "a");
    harness.push("pre_api_request", "a");
    harness.push("post_api_request", "a");
    harness.push("post_api_request", "b");
    harness.settle(5);
    let batches = collector.batches();
    let attempts: Vec<u32> = batches
        .iter()
        .flat_map(|b| b.events.iter())
        .map(|e| match &e.body {
            Some(Body::Api(a)) => a.attempt,
            _ => 0,
        })
        .collect();
    assert_eq!(attempts, [1, 1, 2, 2, 1]);
}

#[test]
fn collector_down_flush_is_bounded_then_reconnects_and_resends() {
    let (port, endpoint) = free_endpoint();
    let harness = Harness::start(config(endpoint), Passthrough);
    harness.push_n(10, "pre_tool_call");
    let started = StdInstant::now();
    assert!(!harness.shared.wait_settled(10, Duration::from_millis(300)));
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_secs(2),
        "{waited:?}"
    );
    let stats = harness.shared.stats();
    assert!(!stats.connected);
    assert_eq!(stats.acked_events, 0);
    assert!(stats.unacked_batches >= 1);
    assert!(!stats.last_error.is_empty());

    let collector = FakeCollector::start(port);
    harness.settle(10);
    let seqs: BTreeSet<u64> = collector.seqs().into_iter().collect();
    assert_eq!(seqs, (1..=10).collect());
    assert_eq!(harness.enqueued(), 10);
    // The sender ends (closing its stream) before the collector shuts down.
    harness.close();
}

#[test]
fn lost_stream_resends_unacked_batches() {
    let collector = FakeCollector::scripted(("127.0.0.1", 0), |d| {
        // The first stream ends after its first batch, unacked.
        (d.stream == 0).then(|| tonic::Status::unavailable("injected"))
    });
    let harness = Harness::start(config(collector.endpoint()), Passthrough);
    harness.push_settled(5, "pre_tool_call");
    harness.push_settled(5, "post_tool_call");
    assert!(collector.streams() >= 2);
    let seqs = collector.seqs();
    // The first batch arrived twice (unacked, resent); every seq arrived.
    let unique: BTreeSet<u64> = seqs.iter().copied().collect();
    assert_eq!(unique, (1..=10).collect());
    assert!(seqs.len() > unique.len());
    assert_eq!(harness.shared.stats().acked_events, 10);
}

#[test]
fn eviction_when_buffer_is_full_counts_and_reports() {
    let (port, endpoint) = free_endpoint();
    let mut config = config(endpoint);
    config.max_unacked_batches = 2;
    config.max_batch_events = 10;
    let harness = Harness::start(config, Passthrough);
    harness.push_n(100, "pre_tool_call");
    // Nothing can be delivered: 80 of 100 events get evicted, and those
    // settle a flush.
    assert!(!harness.shared.wait_settled(100, Duration::from_millis(300)));
    assert_eq!(harness.shared.stats().evicted_events, 80);
    let collector = FakeCollector::start(port);
    harness.settle(100);
    assert_eq!(collector.seqs(), (81..=100).collect::<Vec<_>>());
    assert!(collector.batches().iter().all(|b| b.dropped_events >= 60));
    harness.close();
}

#[test]
fn discarded_items_settle() {
    let (_collector, harness) = delivering(LosesHalf);
    let stats = harness.push_settled(10, "pre_tool_call");
    assert_eq!((stats.acked_events, stats.discarded_events), (5, 5));
}

#[test]
fn a_push_waits_for_the_senders_timer_and_a_wake_sends_at_once() {
    let collector = FakeCollector::start(0);
    let mut config = config(collector.endpoint());
    // The sender's first look at the queue would come after a minute.
    config.linger = Duration::from_secs(60);
    config.idle_poll_max = Duration::from_secs(60);
    let harness = Harness::start(config, Passthrough);
    harness.push("pre_tool_call", "");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        harness.shared.stats().sent_batches,
        0,
        "a push woke the sender"
    );
    harness.push_and_wake("on_session_end");
    let deadline = StdInstant::now() + Duration::from_secs(10);
    while harness.shared.stats().acked_events < 2 && StdInstant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(harness.shared.stats().acked_events, 2);
    assert_eq!(collector.seqs(), [1, 2]);
    // A flush makes the sender look too.
    harness.push("pre_tool_call", "");
    harness.settle(3);
    // Closing the queue wakes the sender, which ends without waiting a minute.
    let started = StdInstant::now();
    harness.close();
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn an_idle_sender_looks_at_least_every_50_ms_by_default() {
    // The delay target is capture -> export within the collector's batch
    // timeout + 100 ms; the first event after a pause waits up to
    // `idle_poll_max` in the shim (docs/BENCHMARKS.md, "Delay").
    let config = SenderConfig::new("http://127.0.0.1:1", shim());
    assert_eq!(config.idle_poll_max, DEFAULT_IDLE_POLL_MAX);
    assert!(DEFAULT_IDLE_POLL_MAX <= Duration::from_millis(50));
    assert!(config.linger <= config.idle_poll_max);
}

#[cfg(target_os = "linux")]
#[test]
fn the_sender_thread_runs_under_sched_batch() {
    // What `spawn` runs first on the sender thread.
    let policy = std::thread::spawn(|| {
        super::supervise::background_policy();
        uapi::sched_getscheduler(0).ok()
    })
    .join()
    .expect("policy thread");
    assert_eq!(policy, Some(uapi::c::SCHED_BATCH));
}

#[test]
fn an_idle_sender_still_finds_pushed_events() {
    let collector = FakeCollector::start(0);
    let mut config = config(collector.endpoint());
    config.idle_poll_max = Duration::from_millis(50);
    let harness = Harness::start(config, Passthrough);
    // Idle long enough for the interval to back off to its maximum.
    std::thread::sleep(Duration::from_millis(400));
    harness.push("pre_tool_call", "");
    let deadline = StdInstant::now() + Duration::from_secs(10);
    while harness.shared.stats().acked_events < 1 && StdInstant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(harness.shared.stats().acked_events, 1);
}

#[test]
fn an_idle_sender_stops_its_timer_and_the_next_push_wakes_it() {
    let collector = FakeCollector::start(0);
    let mut config = config(collector.endpoint());
    config.idle_sleep_after = Duration::ZERO;
    let harness = Harness::start(config, Passthrough);
    let wait_for = |what: &dyn Fn(&SenderStats) -> bool| {
        let deadline = StdInstant::now() + Duration::from_secs(10);
        while !what(&harness.shared.stats()) && StdInstant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        what(&harness.shared.stats())
    };
    for round in 1..=3 {
        assert!(
            wait_for(&|s| s.asleep),
            "round {round}: the sender never fell asleep"
        );
        // A plain push: nothing else would make an asleep sender look.
        harness.push("pre_tool_call", "");
        assert!(
            wait_for(&|s| s.acked_events == round),
            "round {round}: the push did not wake the sender: {:?}",
            harness.shared.stats()
        );
    }
    assert!(wait_for(&|s| s.asleep), "it falls asleep again");
    assert_eq!(collector.seqs(), [1, 2, 3]);
}

#[test]
fn closed_queue_ends_sender_after_delivery() {
    let (collector, harness) = delivering(Passthrough);
    harness.push_n(3, "pre_tool_call");
    let shared = harness.close();
    assert_eq!(shared.stats().acked_events, 3);
    assert_eq!(collector.seqs(), [1, 2, 3]);
}
