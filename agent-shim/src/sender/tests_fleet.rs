//! Fleet mode against in-process replicas on 127.0.0.2, .3 and .4 (one
//! port, one name in a test hosts file): the replica the rendezvous ranks
//! first, retention until settled, planned moves (leave, a new best
//! replica) with the handoff, and the unplanned move when a replica dies.

use std::net::SocketAddr;
use std::path::PathBuf;

use super::tests::{Harness, Passthrough, config, shim_named};
use super::tests_reach::Recorder;
use super::*;
use crate::fake_collector::FakeCollector;

const WAIT: Duration = Duration::from_secs(10);

/// Settling replicas on 127.0.0.2.. under one port, and a hosts file that
/// lists some of them under the name `fleet`.
struct Replicas {
    replicas: Vec<Option<FakeCollector>>,
    port: u16,
    dir: tempfile::TempDir,
}

impl Replicas {
    /// `n` replicas, the first `listed` of them in the hosts file.
    fn start(n: u8, listed: usize) -> Replicas {
        // A port free on every address: retried on a clash.
        for _ in 0..20 {
            let first = FakeCollector::settling(("127.0.0.2", 0));
            let port = first.addr().port();
            let mut replicas = vec![Some(first)];
            for i in 1..n {
                let addr = SocketAddr::from(([127, 0, 0, 2 + i], port));
                match std::net::TcpListener::bind(addr) {
                    Ok(probe) => {
                        drop(probe);
                        replicas.push(Some(FakeCollector::settling(addr)));
                    }
                    Err(_) => break,
                }
            }
            if replicas.len() == usize::from(n) {
                let fleet = Replicas {
                    replicas,
                    port,
                    dir: tempfile::tempdir().unwrap(),
                };
                fleet.list(&(0..listed).collect::<Vec<_>>());
                return fleet;
            }
        }
        panic!("no port free on 127.0.0.2..");
    }

    /// Lists replicas `which` in the hosts file (replaced at once).
    fn list(&self, which: &[usize]) {
        let text: String = which
            .iter()
            .map(|i| format!("127.0.0.{} fleet\n", 2 + i))
            .collect();
        let tmp = self.dir.path().join("hosts.tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(tmp, self.hosts()).unwrap();
    }

    fn hosts(&self) -> PathBuf {
        self.dir.path().join("hosts")
    }

    /// A sender of `instance` to the fleet.
    fn config(&self, instance: &str) -> SenderConfig {
        let mut config = config(format!("dns:///fleet:{}", self.port));
        config.shim = shim_named(instance);
        config.fleet = FleetOptions {
            hosts_file: Some(self.hosts()),
            resolve_every: Duration::from_millis(50),
        };
        config
    }

    /// The indexes of the first `n` replicas, ranked for `instance`.
    fn ranking(&self, instance: &str, n: usize) -> Vec<usize> {
        let addrs: Vec<SocketAddr> = (0..n)
            .map(|i| SocketAddr::from(([127, 0, 0, 2 + i as u8], self.port)))
            .collect();
        fleet::ranked(instance, addrs)
            .iter()
            .map(|a| match a.ip() {
                std::net::IpAddr::V4(ip) => usize::from(ip.octets()[3] - 2),
                std::net::IpAddr::V6(_) => unreachable!(),
            })
            .collect()
    }

    /// An instance id whose best replica among all is the last one, and
    /// among the others is `best_before`.
    fn instance_moving_to_the_last(&self) -> (String, usize) {
        let n = self.replicas.len();
        (0..)
            .map(|i| format!("instance-{i}"))
            .find(|id| self.ranking(id, n)[0] == n - 1)
            .map(|id| {
                let before = self.ranking(&id, n - 1)[0];
                (id, before)
            })
            .unwrap()
    }

    fn get(&self, i: usize) -> &FakeCollector {
        self.replicas[i].as_ref().unwrap()
    }

    /// Kills replica `i` (its streams end, it stops listening).
    fn kill(&mut self, i: usize) {
        if let Some(replica) = self.replicas[i].take() {
            replica.kill();
        }
    }
}

/// Waits (bounded) until `done` holds; fails the test with `what` otherwise.
fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + WAIT;
    while !done() {
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The seqs replica `c` received, batches with events only.
fn seqs(c: &FakeCollector) -> Vec<u64> {
    c.seqs()
}

#[test]
fn the_best_replica_keeps_nothing_settled_and_a_leave_moves_the_rest() {
    let mut fleet = Replicas::start(3, 3);
    let instance = "fleet-test-instance";
    let rank = fleet.ranking(instance, 3);
    let (top, second, third) = (rank[0], rank[1], rank[2]);
    let h = Harness::start(fleet.config(instance), Passthrough);
    h.push_settled(5, "pre_tool_call");
    h.push_settled(5, "pre_tool_call");
    assert_eq!(seqs(fleet.get(top)), (1..=10).collect::<Vec<_>>());
    assert_eq!(fleet.get(top).fleet_streams(), 1);
    assert_eq!(fleet.get(second).streams() + fleet.get(third).streams(), 0);
    // Acknowledged, not settled: both batches are held.
    assert_eq!(h.shared.stats().acked_events, 10);
    wait_until("two batches held", || h.shared.stats().unacked_batches == 2);
    fleet.get(top).settle(5);
    wait_until("the settled batch let go", || {
        h.shared.stats().unacked_batches == 1
    });

    // The replica leaves: handoff on its stream, the unsettled rest to the
    // next replica, from the lowest unsettled seq.
    fleet.get(top).leave();
    wait_until("the rest resent to the next replica", || {
        seqs(fleet.get(second)) == (6..=10).collect::<Vec<_>>()
    });
    wait_until("the handoff", || fleet.get(top).handoffs() == 1);
    let handoff = fleet
        .get(top)
        .batches()
        .into_iter()
        .find(|b| b.handoff)
        .unwrap();
    assert!(handoff.events.is_empty());
    assert_eq!(handoff.floor_seq, 6);
    assert_eq!(handoff.shim.unwrap().instance_id, instance);
    assert_eq!(fleet.get(second).batches()[0].floor_seq, 6);
    wait_until("one move counted", || h.shared.stats().replica_moves == 1);

    // The next replica dies (and leaves the name's addresses): the rest
    // goes to the last one (the one that left is skipped).
    fleet.kill(second);
    fleet.list(&[top, third]);
    h.push_settled(1, "pre_tool_call");
    wait_until("the rest resent to the last replica", || {
        let got: std::collections::BTreeSet<u64> = seqs(fleet.get(third)).into_iter().collect();
        got == (6..=11).collect()
    });
    assert_eq!(seqs(fleet.get(third))[0], 6, "from the lowest unsettled");
    assert_eq!(
        fleet.get(top).streams(),
        1,
        "the leaving replica is skipped"
    );
    fleet.get(third).settle(11);
    wait_until("everything settled", || {
        h.shared.stats().unacked_batches == 0
    });
    let stats = h.close().stats();
    assert_eq!(stats.acked_events, 11);
    assert_eq!(stats.evicted_events + stats.evicted_unsettled_events, 0);
}

#[test]
fn a_new_best_replica_after_a_resolution_takes_the_unsettled_events() {
    let fleet = Replicas::start(4, 3);
    let (instance, before) = fleet.instance_moving_to_the_last();
    let h = Harness::start(fleet.config(&instance), Passthrough);
    h.push_settled(2, "pre_tool_call");
    h.push_settled(2, "pre_tool_call");
    assert_eq!(seqs(fleet.get(before)), [1, 2, 3, 4]);
    fleet.get(before).settle(2);
    wait_until("the settled batch let go", || {
        h.shared.stats().unacked_batches == 1
    });
    // The fourth replica joins the name: this instance's best now.
    fleet.list(&[0, 1, 2, 3]);
    wait_until("the move to the added replica", || {
        seqs(fleet.get(3)) == [3, 4]
    });
    wait_until("the handoff", || fleet.get(before).handoffs() == 1);
    h.push_settled(1, "pre_tool_call");
    assert_eq!(seqs(fleet.get(3)), [3, 4, 5]);
    assert_eq!(seqs(fleet.get(before)), [1, 2, 3, 4]);
    // Nobody else moved.
    for other in (0..3).filter(|i| *i != before) {
        assert_eq!(fleet.get(other).streams(), 0);
    }
    h.close();
}

/// An agent that moved off a replica that reads its stream late (paused),
/// every event settled on the next replica: the handoff still waits in the
/// shim, behind more than the stream's flow-control window (hyper's:
/// 1 MiB). The fleet, the agent and the replica left behind.
fn moved_off_a_backed_up_replica() -> (Replicas, Harness, usize) {
    let fleet = Replicas::start(4, 3);
    let (instance, before) = fleet.instance_moving_to_the_last();
    let mut config = fleet.config(&instance);
    config.close_grace = WAIT;
    let h = Harness::start(config, Passthrough);
    h.push_settled(2, "pre_tool_call");
    fleet.get(before).pause_reads();
    let large = "x".repeat(1024);
    for _ in 0..2_000 {
        h.push("pre_api_request", &large);
    }
    fleet.list(&[0, 1, 2, 3]);
    wait_until("everything resent to the added replica", || {
        seqs(fleet.get(3)).last() == Some(&2_002)
    });
    fleet.get(3).settle(2_002);
    wait_until("nothing held", || h.shared.stats().unacked_batches == 0);
    (fleet, h, before)
}

#[test]
fn the_exit_waits_for_a_moves_handoff_to_a_backed_up_replica() {
    // Cut off by the process's exit, the handoff never reaches the replica
    // left behind, which takes the agent for dead and closes its open
    // turns as incomplete.
    let (fleet, h, before) = moved_off_a_backed_up_replica();
    assert!(
        !h.shared.wait_handoffs(Duration::from_millis(200)),
        "the replica reads nothing: the handoff is on its way"
    );
    fleet.get(before).resume_reads();
    assert!(h.shared.wait_handoffs(WAIT));
    assert_eq!(fleet.get(before).handoffs(), 1);
    h.close();
}

#[test]
fn a_stopping_sender_lets_a_moves_handoff_reach_a_backed_up_replica() {
    let (fleet, h, before) = moved_off_a_backed_up_replica();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            std::thread::sleep(Duration::from_millis(300));
            fleet.get(before).resume_reads();
        });
        h.close();
    });
    assert_eq!(fleet.get(before).handoffs(), 1);
}

#[test]
fn a_replica_that_does_not_settle_is_said_once_and_acks_let_go() {
    let plain = FakeCollector::scripted(("127.0.0.2", 0), |_| None);
    let dir = tempfile::tempdir().unwrap();
    let hosts = dir.path().join("hosts");
    std::fs::write(&hosts, "127.0.0.2 fleet\n").unwrap();
    let mut config = config(format!("dns:///fleet:{}", plain.addr().port()));
    config.fleet.hosts_file = Some(hosts);
    let recorder = Recorder::default();
    let h = Harness::start(config, recorder.clone());
    let stats = h.push_settled(3, "pre_tool_call");
    assert_eq!(stats.acked_events, 3);
    wait_until("nothing held", || h.shared.stats().unacked_batches == 0);
    assert_eq!(plain.fleet_streams(), 1);
    let texts = recorder.wait_for(1);
    assert_eq!(texts.len(), 1, "{texts:?}");
    assert!(
        texts[0].contains("does not say when events are settled"),
        "{texts:?}"
    );
    h.close();
}

#[test]
fn unsettled_events_go_to_the_spool_counted_once() {
    let fleet = Replicas::start(1, 1);
    let spool_dir = tempfile::tempdir().unwrap();
    let mut config = fleet.config("spooling-instance");
    config.spool = Some(spool::SpoolConfig {
        dir: spool_dir.path().to_path_buf(),
        max_bytes: 1 << 20,
    });
    let h = Harness::start(config, Passthrough);
    let stats = h.push_settled(3, "pre_tool_call");
    assert_eq!(stats.acked_events, 3);
    wait_until("held until settled", || {
        h.shared.stats().unacked_batches == 1
    });
    assert!(h.shared.spool_and_wait(WAIT));
    let stats = h.shared.stats();
    // Counted at their ack, not again as spooled; written all the same.
    assert_eq!((stats.acked_events, stats.spooled_events), (3, 0));
    assert_eq!(stats.unacked_batches, 0);
    let files: Vec<_> = std::fs::read_dir(spool_dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(spool::SPOOL_SUFFIX))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    h.close();
}
