//! End-to-end check of the installed Python package against an in-process
//! collector: runs `tests/check_shim.py` with the venv's interpreter (the
//! wheel installed by `tests/setup_venv.sh`): fixture replay at level
//! `content`, hook-time snapshots, worker thread names, attempt numbers, and
//! a forked child with its own instance id. And, in fleet mode against two
//! in-process replicas, that the interpreter's exit waits for a move's
//! handoff to reach a replica that reads late.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use hermes_collector_shim::fake_collector::FakeCollector;
use hermes_e2e::fleet::write_hosts;
use hermes_e2e::ingest::fixture;
use hermes_proto::v1::{Event, EventBatch, ShimInfo, event::Body};
use serde_json::Value;

/// Events per instance id, deduplicated by seq; and the ShimInfo seen.
fn by_instance(batches: &[EventBatch]) -> HashMap<String, (ShimInfo, BTreeMap<u64, Event>)> {
    let mut out: HashMap<String, (ShimInfo, BTreeMap<u64, Event>)> = HashMap::new();
    for batch in batches {
        let shim = batch.shim.clone().unwrap();
        let entry = out
            .entry(shim.instance_id.clone())
            .or_insert_with(|| (shim, BTreeMap::new()));
        for event in &batch.events {
            entry.1.insert(event.seq, event.clone());
        }
    }
    out
}

#[test]
fn installed_wheel_end_to_end() {
    let python = hermes_e2e::venv_bin("python");
    let collector = FakeCollector::start(0);
    let endpoint = collector.endpoint();
    hermes_e2e::ensure_venv();
    let script = hermes_e2e::tests_dir().join("check_shim.py");
    let output = std::process::Command::new(python)
        .arg(&script)
        .arg(fixture("retry"))
        .env("HERMES_COLLECTOR_ENDPOINT", &endpoint)
        .env("HERMES_COLLECTOR_CAPTURE", "content")
        .env_remove("HERMES_COLLECTOR_DISABLED")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "check_shim.py failed\n{stdout}\n{stderr}"
    );
    let lines: Vec<Value> = stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let parent = lines.iter().find(|l| l["role"] == "parent").unwrap();
    let child = lines.iter().find(|l| l["role"] == "child").unwrap();
    assert!(lines.iter().any(|l| l["role"] == "done"));

    let batches = collector.batches();
    drop(collector);
    let instances = by_instance(&batches);

    // Parent: every replayed hook, in order, seq 1..=n, acknowledged.
    let stats = &parent["stats"];
    let hooks: Vec<&str> = parent["hooks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h.as_str().unwrap())
        .collect();
    let n = hooks.len() as u64;
    assert_eq!(stats["enqueued"], n);
    assert_eq!(stats["dropped"], 0);
    assert_eq!(stats["acked_events"], n);
    assert_eq!(stats["unacked_batches"], 0);
    assert_eq!(stats["connected"], true);
    // The sender's supervision, through the Python API: it never died.
    assert_eq!(stats["sender_deaths"], 0);
    assert_eq!(stats["sender_restarts"], 0);
    assert_eq!(stats["sender_stopped"], false);
    assert_eq!(stats["lost_events"], 0);
    let parent_id = stats["instance_id"].as_str().unwrap();
    let (shim, events) = &instances[parent_id];
    // The shim's own last event, after every hook: its process-exit marker.
    let mut events = events.clone();
    let marker = events.pop_last().map(|(_, e)| e.hook);
    assert_eq!(marker.as_deref(), Some(hermes_proto::hooks::PROCESS_EXIT));
    assert_eq!(shim.capture, "content");
    assert_eq!(shim.service_name, "hermes-agent");
    assert_eq!(
        events.keys().copied().collect::<Vec<_>>(),
        (1..=n).collect::<Vec<_>>()
    );
    let got: Vec<&str> = events.values().map(|e| e.hook.as_str()).collect();
    assert_eq!(got, hooks);

    // Hook-time snapshot: args mutated after the call never show.
    let mut saw_args = 0;
    for event in events.values() {
        if let Some(args) = event.content.get("args") {
            saw_args += 1;
            assert!(!args.contains("MUTATED"), "{}: {args}", event.hook);
            let args: Value = serde_json::from_str(args).unwrap();
            if event.hook == "pre_tool_call" {
                assert_eq!(
                    args,
                    serde_json::json!({"command": "echo hermes-hook-test"})
                );
            }
        }
        for banned in [
            "conversation_history",
            "request_messages",
            "assistant_message",
        ] {
            assert!(!event.content.contains_key(banned));
        }
    }
    assert!(saw_args >= 3);
    let pre_llm = events.values().find(|e| e.hook == "pre_llm_call").unwrap();
    assert_eq!(
        pre_llm.content["user_message"],
        "\"Please run echo hermes-hook-test\""
    );
    assert!(
        events
            .values()
            .any(|e| e.hook == "pre_api_request" && e.content.contains_key("request"))
    );

    // Threads, clocks, attempts.
    // Before the odd `post_api_request` and the hook after the sender slept.
    let worker = events.values().rev().nth(2).unwrap();
    assert_eq!(worker.thread, "worker-7");
    assert!(
        events
            .values()
            .filter(|e| e.seq != worker.seq)
            .all(|e| e.thread == "MainThread")
    );
    assert!(
        events
            .values()
            .all(|e| e.time_unix_nano > 1_700_000_000_000_000_000)
    );
    let monos: Vec<u64> = events.values().map(|e| e.mono_nano).collect();
    assert!(
        monos.windows(2).all(|w| w[0] <= w[1]),
        "monotonic in seq order"
    );
    let attempts: Vec<(String, u32)> = events
        .values()
        .filter_map(|e| match &e.body {
            Some(Body::Api(a)) if e.seq < n - 1 => Some((e.hook.clone(), a.attempt)),
            _ => None,
        })
        .collect();
    let expect: Vec<(String, u32)> = [
        ("pre_api_request", 1),
        ("api_request_error", 1),
        ("pre_api_request", 2),
        ("post_api_request", 2),
        ("pre_api_request", 1),
        ("api_request_error", 1),
        ("pre_api_request", 2),
        ("post_api_request", 2),
    ]
    .iter()
    .map(|(h, a)| ((*h).to_owned(), *a))
    .collect();
    assert_eq!(attempts, expect);

    // Forked child: its own instance, seq from 1.
    let child_stats = &child["child"];
    let child_id = child_stats["instance_id"].as_str().unwrap();
    assert_ne!(child_id, parent_id);
    let (child_shim, child_events) = &instances[child_id];
    assert_ne!(child_shim.pid, shim.pid);
    assert_eq!(child_events.keys().copied().collect::<Vec<_>>(), [1]);
    assert_eq!(child_events[&1].hook, "on_session_start");
    assert_eq!(
        child_events[&1].ids.as_ref().unwrap().session_id,
        "child-session"
    );
}

/// The Python side of [`the_exit_lets_a_moves_handoff_reach_a_backed_up_replica`]:
/// registers the plugin, says its instance id, then on each line read
/// from stdin pushes 2 000 events of 1 KiB of content (`push`) or exits
/// (anything else).
const MOVING_AGENT: &str = "\
import sys, hermes_collector as h
class C:
    def __init__(s): s.h = {}
    def register_hook(s, n, c): s.h[n] = c
c = C(); h.register(c)
print(h.stats()['instance_id'], flush=True)
big = 'x' * 1024
while sys.stdin.readline().strip() == 'push':
    for i in range(2000):
        c.h['post_tool_call'](tool_name='terminal', args={'command': big}, result=big,
            task_id='t', session_id='s', tool_call_id='c%d' % i)
    print('pushed', flush=True)
";

/// Waits (bounded) until `done` holds.
fn wait_for(what: &str, done: impl Fn() -> bool) {
    let (timeout, poll) = (Duration::from_secs(30), Duration::from_millis(10));
    assert!(
        hermes_e2e::wait_until(timeout, poll, done),
        "timed out: {what}"
    );
}

#[test]
fn the_exit_lets_a_moves_handoff_reach_a_backed_up_replica() {
    // A real agent in fleet mode moves off a replica that reads its stream
    // late, and exits once the next replica settled everything: its exit
    // flush must wait for the handoff behind the backlog, or the replica
    // left behind takes the agent for dead and exports its open turns as
    // incomplete.
    use std::io::{BufRead, Write};
    use std::net::SocketAddr;
    hermes_e2e::ensure_venv();
    let a = FakeCollector::settling(("127.0.0.2", 0));
    let port = a.addr().port();
    let b = FakeCollector::settling(("127.0.0.3", port));
    let dir = tempfile::tempdir().unwrap();
    let hosts = dir.path().join("hosts");
    let list = |octets: &[u8]| write_hosts(&hosts, "fleet", octets);
    list(&[2]);
    let mut agent = std::process::Command::new(hermes_e2e::venv_bin("python"))
        .args(["-c", MOVING_AGENT])
        .env("HERMES_COLLECTOR_ENDPOINT", format!("dns:///fleet:{port}"))
        .env("HERMES_COLLECTOR_HOSTS_FILE", &hosts)
        .env("HERMES_COLLECTOR_RESOLVE_SECS", "1")
        .env("HERMES_COLLECTOR_CAPTURE", "content")
        .env("HERMES_COLLECTOR_EXIT_FLUSH_MS", "20000")
        .env_remove("HERMES_COLLECTOR_DISABLED")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = agent.stdin.take().unwrap();
    let mut lines = std::io::BufReader::new(agent.stdout.take().unwrap()).lines();
    let instance = lines.next().unwrap().unwrap();
    // The agent's stream goes to the replica it ranks lower; it moves to
    // the other once both are listed.
    let ranked = hermes_collector_shim::sender::fleet::ranked(
        &instance,
        vec![a.addr(), SocketAddr::from(([127, 0, 0, 3], port))],
    );
    let (left, next, left_octet) = if ranked[0] == a.addr() {
        (&b, &a, 3)
    } else {
        (&a, &b, 2)
    };
    list(&[left_octet]);
    wait_for("the agent's stream", || left.fleet_streams() == 1);
    left.pause_reads();
    writeln!(stdin, "push").unwrap();
    assert_eq!(lines.next().unwrap().unwrap(), "pushed");
    list(&[2, 3]);
    wait_for("every event resent to the next replica", || {
        next.seqs().last() == Some(&2_000)
    });
    next.settle(2_000);
    writeln!(stdin, "exit").unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        agent.try_wait().unwrap().is_none(),
        "the agent exited with its handoff still on the way"
    );
    left.resume_reads();
    let status = agent.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert_eq!(left.handoffs(), 1);
}
