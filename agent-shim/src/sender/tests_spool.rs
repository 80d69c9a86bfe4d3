//! The sender's disk spool: what could not be delivered at exit is
//! written to disk and replayed, under its own instance and seqs, by a
//! later sender.

use std::collections::BTreeSet;
use std::time::Instant as StdInstant;

use hermes_proto::v1::EventBatch;
use tonic::Status;

use super::tests::{Harness, Passthrough, config, free_endpoint, shim_named};
use super::*;
use crate::fake_collector::FakeCollector;

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

fn spool_config(endpoint: String, instance_id: &str, dir: &std::path::Path) -> SenderConfig {
    let mut config = config(endpoint);
    config.shim = shim_named(instance_id);
    config.spool = Some(SpoolConfig {
        dir: dir.to_path_buf(),
        max_bytes: 1 << 20,
    });
    config
}

/// Where a test's spool goes (not created yet), and the temporary
/// directory holding it.
fn spool_dir() -> (tempfile::TempDir, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("spool");
    (tmp, dir)
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
fn received_by_instance(collector: &FakeCollector) -> BTreeSet<(String, u64)> {
    collector
        .batches()
        .iter()
        .flat_map(|b| {
            let id = b.shim.as_ref().unwrap().instance_id.clone();
            b.events.iter().map(move |e| (id.clone(), e.seq))
        })
        .collect()
}

#[test]
fn exit_spool_is_replayed_by_a_later_sender_under_its_instance_and_seqs() {
    let (port, endpoint) = free_endpoint();
    let (_tmp, dir) = spool_dir();

    // Process 1: the collector is down at exit.
    let first = Harness::start(spool_config(endpoint.clone(), "aaaa", &dir), Passthrough);
    first.push_n(10, "pre_tool_call");
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
    let collector = FakeCollector::start(port);
    let second = Harness::start(spool_config(endpoint, "bbbb", &dir), Passthrough);
    second.push_n(3, "post_tool_call");
    second.settle(3);
    let stats = second.shared.stats();
    assert_eq!((stats.replayed_events, stats.replayed_files), (10, 1));
    assert_eq!(stats.acked_events, 3);
    assert!(spool_files(&dir).is_empty(), "deleted once acknowledged");
    let expected: BTreeSet<(String, u64)> = (1..=10)
        .map(|seq| ("aaaa".to_owned(), seq))
        .chain((1..=3).map(|seq| ("bbbb".to_owned(), seq)))
        .collect();
    assert_eq!(received_by_instance(&collector), expected);
    assert!(collector.streams() >= 2);
    second.close();
}

/// The exit path spools twice: at `atexit` what the flush could not
/// deliver, then, after finalization, the hooks that fired meanwhile and
/// the exit marker. The second file continues the first's seqs, so the
/// replay gives the collector one gapless run of the instance.
#[test]
fn hooks_after_the_exit_spool_go_to_a_second_file_that_continues_the_seqs() {
    let (port, endpoint) = free_endpoint();
    let (_tmp, dir) = spool_dir();

    let first = Harness::start(spool_config(endpoint.clone(), "late", &dir), Passthrough);
    // Its look for earlier spool files is done (else it could claim its own).
    assert!(first.shared.wait_settled(0, Duration::from_secs(5)));
    first.push_n(4, "pre_tool_call");
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

    let collector = FakeCollector::start(port);
    let second = Harness::start(spool_config(endpoint, "next", &dir), Passthrough);
    second.settle(0);
    assert_eq!(second.shared.stats().replayed_events, 7);
    let received: Vec<(u64, String)> = collector
        .batches()
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
    let (_, endpoint) = free_endpoint();
    let (_tmp, dir) = spool_dir();
    let harness = Harness::start(spool_config(endpoint, "cccc", &dir), Passthrough);
    harness.push_n(5, "pre_tool_call");
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
    let (_, endpoint) = free_endpoint();
    let (_tmp, dir) = spool_dir();
    let mut config = spool_config(endpoint, "dddd", &dir);
    config.spool = Some(SpoolConfig {
        dir: dir.clone(),
        max_bytes: 4,
    });
    let harness = Harness::start(config, Passthrough);
    harness.push_n(5, "pre_tool_call");
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
    let (_tmp, dir) = spool_dir();
    let batches: Vec<EventBatch> = (0..6)
        .map(|i| test_batch(Some(shim_named("eeee")), i * 5 + 1..=i * 5 + 5))
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
    let collector = FakeCollector::scripted(("127.0.0.1", 0), move |d| faults.check(d.batch));
    let harness = Harness::start(
        spool_config(collector.endpoint(), "ffff", &dir),
        Passthrough,
    );
    harness.settle(0);
    let stats = harness.shared.stats();
    assert_eq!(stats.replayed_files, 1);
    assert_eq!(stats.replay_lost_events, 5);
    assert_eq!(stats.replayed_events, 25);
    assert!(spool_files(&dir).is_empty());
    let received: BTreeSet<u64> = received_by_instance(&collector)
        .into_iter()
        .map(|(_, seq)| seq)
        .collect();
    assert_eq!(received, (1..=30).collect());
    // Every resent batch says which seqs are settled below it.
    let batches = collector.batches();
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
    let (_, endpoint) = free_endpoint();
    let harness = Harness::start(config(endpoint), Passthrough);
    harness.push("pre_tool_call", "");
    assert!(harness.shared.spool_and_wait(Duration::from_secs(5)));
    assert_eq!(harness.shared.stats().spooled_events, 0);
    assert!(!harness.shared.is_replaying());
    harness.close();
}
