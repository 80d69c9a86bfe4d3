//! Sender tests against an in-process collector on 127.0.0.1.

use std::collections::BTreeSet;
use std::pin::Pin;
use std::sync::atomic::{AtomicU16, AtomicUsize};
use std::time::Instant as StdInstant;

use hermes_proto::received::ReceivedBatch;
use hermes_proto::server::event_ingest_server::{EventIngest, EventIngestServer};
use hermes_proto::v1::{Ack, EventBatch, Ids, event::Body};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};

use super::*;
use crate::queue::SeqSource;

/// Test converter: items are already events.
struct Passthrough;

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

#[derive(Clone, Default)]
struct Received {
    batches: Arc<Mutex<Vec<EventBatch>>>,
    streams: Arc<AtomicUsize>,
}

impl Received {
    fn seqs(&self) -> Vec<u64> {
        let batches = self.batches.lock().unwrap();
        batches
            .iter()
            .flat_map(|b| b.events.iter().map(|e| e.seq))
            .collect()
    }
}

#[derive(Clone)]
struct TestIngest {
    received: Received,
    /// The first stream ends with UNAVAILABLE after this many batches, unacked.
    fail_first_stream_after: Option<usize>,
    /// Faults for batches of one instance.
    faults: Option<Arc<InstanceFaults>>,
}

/// Faults injected into the streams that carry batches of `instance_id`.
#[derive(Default)]
struct InstanceFaults {
    instance_id: String,
    /// The first of its batches ends its stream with UNAVAILABLE, unacked.
    fail_once: bool,
    failed: std::sync::atomic::AtomicBool,
    /// A batch holding this seq is refused with INVALID_ARGUMENT, unacked.
    refuse_seq: Option<u64>,
}

impl InstanceFaults {
    fn check(&self, batch: &EventBatch) -> Option<Status> {
        if batch.shim.as_ref().map(|s| s.instance_id.as_str()) != Some(&self.instance_id) {
            return None;
        }
        if self.fail_once && !self.failed.swap(true, Ordering::SeqCst) {
            return Some(Status::unavailable("injected"));
        }
        if let Some(seq) = self.refuse_seq
            && batch.events.iter().any(|e| e.seq == seq)
        {
            return Some(Status::invalid_argument("injected refusal"));
        }
        None
    }
}

#[tonic::async_trait]
impl EventIngest for TestIngest {
    type StreamStream =
        Pin<Box<dyn tokio_stream::Stream<Item = Result<Ack, Status>> + Send + 'static>>;

    async fn stream(
        &self,
        request: Request<Streaming<ReceivedBatch>>,
    ) -> Result<Response<Self::StreamStream>, Status> {
        let stream_no = self.received.streams.fetch_add(1, Ordering::SeqCst);
        let fail_after = self.fail_first_stream_after.filter(|_| stream_no == 0);
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(64);
        let batches = Arc::clone(&self.received.batches);
        let faults = self.faults.clone();
        tokio::spawn(async move {
            let mut n = 0;
            while let Ok(Some(ReceivedBatch { batch, .. })) = inbound.message().await {
                let first = batch.events.first().map_or(0, |e| e.seq);
                let last = batch.events.last().map_or(0, |e| e.seq);
                let fault = faults.as_ref().and_then(|f| f.check(&batch));
                batches.lock().unwrap().push(batch);
                if let Some(status) = fault {
                    let _ = tx.send(Err(status)).await;
                    return;
                }
                n += 1;
                if fail_after.is_some_and(|f| n >= f) {
                    let _ = tx.send(Err(Status::unavailable("injected"))).await;
                    return;
                }
                let ack = Ack {
                    first_seq: first,
                    last_seq: last,
                };
                if tx.send(Ok(ack)).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// An in-process collector on its own thread and runtime.
pub(super) struct TestCollector {
    addr: std::net::SocketAddr,
    received: Received,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TestCollector {
    pub(super) fn start(port: u16, fail_first_stream_after: Option<usize>) -> TestCollector {
        Self::start_with(port, fail_first_stream_after, None)
    }

    fn start_with(
        port: u16,
        fail_first_stream_after: Option<usize>,
        faults: Option<Arc<InstanceFaults>>,
    ) -> TestCollector {
        let std_listener = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
        std_listener.set_nonblocking(true).unwrap();
        let addr = std_listener.local_addr().unwrap();
        let received = Received::default();
        let service = TestIngest {
            received: received.clone(),
            fail_first_stream_after,
            faults,
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
                let _ = tonic::transport::Server::builder()
                    .serve_with_incoming_shutdown(
                        EventIngestServer::new(service),
                        TcpListenerStream::new(listener),
                        async {
                            let _ = stopped.await;
                        },
                    )
                    .await;
            });
        });
        TestCollector {
            addr,
            received,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    pub(super) fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The seqs of every event received, in arrival order.
    pub(super) fn seqs(&self) -> Vec<u64> {
        self.received.seqs()
    }

    /// The batches received, in arrival order.
    pub(super) fn batches(&self) -> Vec<EventBatch> {
        self.received.batches.lock().unwrap().clone()
    }
}

impl Drop for TestCollector {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A port nothing listens on, from below Linux' ephemeral range so that no
/// outgoing connection (the sender's own included) can take it meanwhile;
/// probed by connecting (a probe listener could leak into a forked child).
pub(super) fn free_port() -> u16 {
    static CURSOR: AtomicU16 = AtomicU16::new(0);
    let base = (std::process::id() % 8_000) as u16;
    (0..8_000)
        .map(|_| 22_000 + (base + CURSOR.fetch_add(1, Ordering::Relaxed)) % 8_000)
        .find(|&port| std::net::TcpStream::connect(("127.0.0.1", port)).is_err())
        .unwrap()
}

pub(super) fn shim() -> ShimInfo {
    shim_named("0123456789abcdef0123456789abcdef")
}

fn shim_named(instance_id: &str) -> ShimInfo {
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

struct Harness {
    tx: QueueTx<Event>,
    seqs: SeqSource,
    shared: Arc<SenderShared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Harness {
    fn start<C: Convert<Item = Event> + Send + 'static>(
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

    fn push(&self, hook: &str, api_request_id: &str) {
        assert!(self.tx.push(self.event(hook, api_request_id)).is_ok());
    }

    fn push_and_wake(&self, hook: &str) {
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
    fn close(mut self) -> Arc<SenderShared> {
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
    let collector = TestCollector::start(0, None);
    let harness = Harness::start(config(collector.endpoint()), Passthrough);
    for _ in 0..2_000 {
        harness.push("post_tool_call", "");
    }
    assert!(harness.shared.wait_settled(2_000, Duration::from_secs(10)));
    let stats = harness.shared.stats();
    assert_eq!(stats.acked_events, 2_000);
    assert_eq!(stats.evicted_events, 0);
    assert!(stats.connected);
    assert!(stats.sent_batches >= 4, "batches of at most 512");
    let seqs = collector.received.seqs();
    assert_eq!(seqs, (1..=2_000).collect::<Vec<_>>());
    let batches = collector.received.batches.lock().unwrap().clone();
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
    let collector = TestCollector::start(0, None);
    let harness = Harness::start(config(collector.endpoint()), Passthrough);
    harness.push("pre_api_request", "a");
    harness.push("api_request_error", "a");
    harness.push("pre_api_request", "a");
    harness.push("post_api_request", "a");
    harness.push("post_api_request", "b");
    assert!(harness.shared.wait_settled(5, Duration::from_secs(10)));
    let batches = collector.received.batches.lock().unwrap().clone();
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
    let port = free_port();
    let harness = Harness::start(config(format!("http://127.0.0.1:{port}")), Passthrough);
    for _ in 0..10 {
        harness.push("pre_tool_call", "");
    }
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

    let collector = TestCollector::start(port, None);
    assert!(harness.shared.wait_settled(10, Duration::from_secs(10)));
    let seqs: BTreeSet<u64> = collector.received.seqs().into_iter().collect();
    assert_eq!(seqs, (1..=10).collect());
    assert_eq!(harness.enqueued(), 10);
    // The sender ends (closing its stream) before the collector shuts down.
    harness.close();
}

#[test]
fn lost_stream_resends_unacked_batches() {
    let collector = TestCollector::start(0, Some(1));
    let harness = Harness::start(config(collector.endpoint()), Passthrough);
    for _ in 0..5 {
        harness.push("pre_tool_call", "");
    }
    assert!(harness.shared.wait_settled(5, Duration::from_secs(10)));
    for _ in 0..5 {
        harness.push("post_tool_call", "");
    }
    assert!(harness.shared.wait_settled(10, Duration::from_secs(10)));
    assert!(collector.received.streams.load(Ordering::SeqCst) >= 2);
    let seqs = collector.received.seqs();
    // The first batch arrived twice (unacked, resent); every seq arrived.
    let unique: BTreeSet<u64> = seqs.iter().copied().collect();
    assert_eq!(unique, (1..=10).collect());
    assert!(seqs.len() > unique.len());
    assert_eq!(harness.shared.stats().acked_events, 10);
}

#[test]
fn eviction_when_buffer_is_full_counts_and_reports() {
    let port = free_port();
    let mut config = config(format!("http://127.0.0.1:{port}"));
    config.max_unacked_batches = 2;
    config.max_batch_events = 10;
    let harness = Harness::start(config, Passthrough);
    for _ in 0..100 {
        harness.push("pre_tool_call", "");
    }
    // Nothing can be delivered: 80 of 100 events get evicted, and those
    // settle a flush.
    assert!(!harness.shared.wait_settled(100, Duration::from_millis(300)));
    assert_eq!(harness.shared.stats().evicted_events, 80);
    let collector = TestCollector::start(port, None);
    assert!(harness.shared.wait_settled(100, Duration::from_secs(10)));
    let batches = collector.received.batches.lock().unwrap().clone();
    let seqs: Vec<u64> = batches
        .iter()
        .flat_map(|b| b.events.iter().map(|e| e.seq))
        .collect();
    assert_eq!(seqs, (81..=100).collect::<Vec<_>>());
    assert!(batches.iter().all(|b| b.dropped_events >= 60));
    harness.close();
}

#[test]
fn discarded_items_settle() {
    let collector = TestCollector::start(0, None);
    let harness = Harness::start(config(collector.endpoint()), LosesHalf);
    for _ in 0..10 {
        harness.push("pre_tool_call", "");
    }
    assert!(harness.shared.wait_settled(10, Duration::from_secs(10)));
    let stats = harness.shared.stats();
    assert_eq!((stats.acked_events, stats.discarded_events), (5, 5));
}

#[test]
fn a_push_waits_for_the_senders_timer_and_a_wake_sends_at_once() {
    let collector = TestCollector::start(0, None);
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
    assert_eq!(collector.received.seqs(), [1, 2]);
    // A flush makes the sender look too.
    harness.push("pre_tool_call", "");
    assert!(harness.shared.wait_settled(3, Duration::from_secs(10)));
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
    let collector = TestCollector::start(0, None);
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
    let collector = TestCollector::start(0, None);
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
    assert_eq!(collector.received.seqs(), [1, 2, 3]);
}

#[test]
fn closed_queue_ends_sender_after_delivery() {
    let collector = TestCollector::start(0, None);
    let harness = Harness::start(config(collector.endpoint()), Passthrough);
    for _ in 0..3 {
        harness.push("pre_tool_call", "");
    }
    let shared = harness.close();
    assert_eq!(shared.stats().acked_events, 3);
    assert_eq!(collector.received.seqs(), [1, 2, 3]);
}

// ---------------------------------------------------------------------------
// Disk spool
// ---------------------------------------------------------------------------

fn spool_config(endpoint: String, instance_id: &str, dir: &std::path::Path) -> SenderConfig {
    let mut config = config(endpoint);
    config.shim = shim_named(instance_id);
    config.spool = Some(SpoolConfig {
        dir: dir.to_path_buf(),
        max_bytes: 1 << 20,
    });
    config
}

fn spool_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .map(|e| e.unwrap().path())
                .filter(|p| p.to_string_lossy().ends_with(spool::SPOOL_SUFFIX))
                .collect()
        })
        .unwrap_or_default()
}

/// (instance, seq) of every event the collector received.
fn received_by_instance(received: &Received) -> BTreeSet<(String, u64)> {
    let batches = received.batches.lock().unwrap();
    batches
        .iter()
        .flat_map(|b| {
            let id = b.shim.as_ref().unwrap().instance_id.clone();
            b.events.iter().map(move |e| (id.clone(), e.seq))
        })
        .collect()
}

#[test]
fn exit_spool_is_replayed_by_a_later_sender_under_its_instance_and_seqs() {
    let port = free_port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("spool");

    // Process 1: the collector is down at exit.
    let first = Harness::start(spool_config(endpoint.clone(), "aaaa", &dir), Passthrough);
    for _ in 0..10 {
        first.push("pre_tool_call", "");
    }
    assert!(!first.shared.wait_settled(10, Duration::from_millis(100)));
    let started = StdInstant::now();
    assert!(first.shared.spool_and_wait(Duration::from_secs(5)));
    assert!(started.elapsed() < Duration::from_secs(2));
    let stats = first.shared.stats();
    assert_eq!((stats.spooled_events, stats.spool_dropped_events), (10, 0));
    assert_eq!(stats.unacked_batches, 0);
    assert!(
        first.shared.wait_settled(10, Duration::ZERO),
        "spooled counts as settled"
    );
    assert_eq!(spool_files(&dir).len(), 1);
    first.close();
    assert_eq!(spool_files(&dir).len(), 1, "nothing left to spool at close");

    // Process 2, with the collector up: the spool goes first, on its own
    // stream, then its own events.
    let collector = TestCollector::start(port, None);
    let second = Harness::start(spool_config(endpoint, "bbbb", &dir), Passthrough);
    for _ in 0..3 {
        second.push("post_tool_call", "");
    }
    assert!(second.shared.wait_settled(3, Duration::from_secs(10)));
    let stats = second.shared.stats();
    assert_eq!((stats.replayed_events, stats.replayed_files), (10, 1));
    assert_eq!(stats.acked_events, 3);
    assert!(spool_files(&dir).is_empty(), "deleted once acknowledged");
    let expected: BTreeSet<(String, u64)> = (1..=10)
        .map(|seq| ("aaaa".to_owned(), seq))
        .chain((1..=3).map(|seq| ("bbbb".to_owned(), seq)))
        .collect();
    assert_eq!(received_by_instance(&collector.received), expected);
    assert!(collector.received.streams.load(Ordering::SeqCst) >= 2);
    second.close();
}

/// The exit path spools twice: at `atexit` what the flush could not
/// deliver, then, after finalization, the hooks that fired meanwhile and
/// the exit marker. The second file continues the first's seqs, so the
/// replay gives the collector one gapless run of the instance.
#[test]
fn hooks_after_the_exit_spool_go_to_a_second_file_that_continues_the_seqs() {
    let port = free_port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("spool");

    let first = Harness::start(spool_config(endpoint.clone(), "late", &dir), Passthrough);
    // Its look for earlier spool files is done (else it could claim its own).
    assert!(first.shared.wait_settled(0, Duration::from_secs(5)));
    for _ in 0..4 {
        first.push("pre_tool_call", "");
    }
    assert!(first.shared.spool_and_wait(Duration::from_secs(5)));
    // Late hooks (converted on their threads) and the marker, woken at once.
    for _ in 0..2 {
        first.push_and_wake("post_api_request");
    }
    first.push_and_wake(hermes_proto::hooks::PROCESS_EXIT);
    assert!(!first.shared.wait_settled(7, Duration::from_millis(100)));
    assert!(first.shared.spool_and_wait(Duration::from_secs(5)));
    assert!(
        first.shared.wait_settled(7, Duration::ZERO),
        "{:?}",
        first.shared.stats()
    );
    assert_eq!(first.shared.stats().spooled_events, 7);
    let files = spool_files(&dir);
    assert_eq!(files.len(), 2, "{files:?}");
    first.close();

    let collector = TestCollector::start(port, None);
    let second = Harness::start(spool_config(endpoint, "next", &dir), Passthrough);
    assert!(second.shared.wait_settled(0, Duration::from_secs(10)));
    assert_eq!(second.shared.stats().replayed_events, 7);
    let received: Vec<(u64, String)> = collector
        .received
        .batches
        .lock()
        .unwrap()
        .iter()
        .filter(|b| b.shim.as_ref().is_some_and(|s| s.instance_id == "late"))
        .flat_map(|b| b.events.iter().map(|e| (e.seq, e.hook.clone())))
        .collect();
    let seqs: Vec<u64> = received.iter().map(|(seq, _)| *seq).collect();
    assert_eq!(seqs, (1..=7).collect::<Vec<_>>(), "{received:?}");
    assert_eq!(
        received.last().map(|(_, hook)| hook.as_str()),
        Some(hermes_proto::hooks::PROCESS_EXIT)
    );
    second.close();
}

#[test]
fn closed_queue_spools_what_close_grace_could_not_deliver() {
    let port = free_port();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("spool");
    let harness = Harness::start(
        spool_config(format!("http://127.0.0.1:{port}"), "cccc", &dir),
        Passthrough,
    );
    for _ in 0..5 {
        harness.push("pre_tool_call", "");
    }
    let shared = harness.close();
    assert_eq!(shared.stats().spooled_events, 5);
    let files = spool_files(&dir);
    assert_eq!(files.len(), 1);
    let claimed = spool::claim_all(&dir);
    let seqs: Vec<u64> = claimed[0]
        .batches
        .iter()
        .flat_map(|b| b.events.iter().map(|e| e.seq))
        .collect();
    assert_eq!(seqs, [1, 2, 3, 4, 5]);
}

#[test]
fn a_full_spool_drops_and_counts() {
    let port = free_port();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("spool");
    let mut config = spool_config(format!("http://127.0.0.1:{port}"), "dddd", &dir);
    config.spool = Some(SpoolConfig {
        dir: dir.clone(),
        max_bytes: 4,
    });
    let harness = Harness::start(config, Passthrough);
    for _ in 0..5 {
        harness.push("pre_tool_call", "");
    }
    assert!(harness.shared.spool_and_wait(Duration::from_secs(5)));
    let stats = harness.shared.stats();
    assert_eq!((stats.spooled_events, stats.spool_dropped_events), (0, 5));
    // Settled (the replay task may still be on its first scan of the directory).
    assert!(harness.shared.wait_settled(5, Duration::from_secs(5)));
    assert!(spool_files(&dir).is_empty());
    harness.close();
}

#[test]
fn replay_resends_after_a_lost_stream_and_skips_a_refused_batch() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("spool");
    let batches: Vec<EventBatch> = (0..6)
        .map(|i| EventBatch {
            shim: Some(shim_named("eeee")),
            events: (i * 5 + 1..=i * 5 + 5)
                .map(|seq| Event {
                    seq,
                    hook: "pre_tool_call".into(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
        .collect();
    let spool_cfg = SpoolConfig {
        dir: dir.clone(),
        max_bytes: 1 << 20,
    };
    // Batches of 5: the third (seqs 11..=15) is refused as invalid.
    spool::write(&spool_cfg, "eeee", batches, 5).unwrap();
    let faults = Arc::new(InstanceFaults {
        instance_id: "eeee".into(),
        fail_once: true,
        refuse_seq: Some(13),
        ..Default::default()
    });
    let collector = TestCollector::start_with(0, None, Some(faults));
    let harness = Harness::start(
        spool_config(collector.endpoint(), "ffff", &dir),
        Passthrough,
    );
    assert!(harness.shared.wait_settled(0, Duration::from_secs(10)));
    let stats = harness.shared.stats();
    assert_eq!(stats.replayed_files, 1);
    assert_eq!(stats.replay_lost_events, 5);
    assert_eq!(stats.replayed_events, 25);
    assert!(spool_files(&dir).is_empty());
    let received: BTreeSet<u64> = received_by_instance(&collector.received)
        .into_iter()
        .map(|(_, seq)| seq)
        .collect();
    assert_eq!(received, (1..=30).collect());
    // Every resent batch says which seqs are settled below it.
    let batches = collector.received.batches.lock().unwrap().clone();
    let after_refusal: Vec<u64> = batches
        .iter()
        .filter(|b| b.events[0].seq > 15)
        .map(|b| b.floor_seq)
        .collect();
    assert!(after_refusal.iter().all(|&f| f >= 16), "{after_refusal:?}");
    harness.close();
}

#[test]
fn without_a_spool_a_spool_request_is_acknowledged() {
    let port = free_port();
    let harness = Harness::start(config(format!("http://127.0.0.1:{port}")), Passthrough);
    harness.push("pre_tool_call", "");
    assert!(harness.shared.spool_and_wait(Duration::from_secs(5)));
    assert_eq!(harness.shared.stats().spooled_events, 0);
    assert!(!harness.shared.is_replaying());
    harness.close();
}
