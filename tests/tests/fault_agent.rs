//! Fault tests of issue #4 "Nothing lost", with real processes on 127.0.0.1:
//!
//! - a real Hermes agent (Python API, three turns) whose collector is down:
//!   its turns take no longer than with the collector up, its exit stays
//!   bounded, what it captured goes to the shim's disk spool, and a later
//!   shim start sends it, so every span of those turns reaches the OTLP
//!   receiver (same tree as with the collector up);
//! - an OTLP receiver answering `UNAVAILABLE` (gRPC) / 503 (HTTP) for 60 s,
//!   then recovering: every span the load generator's events must produce
//!   (`hermes-loadgen --expect-spans`) arrives;
//! - an OTLP receiver answering `INVALID_ARGUMENT` (gRPC) / 400 (HTTP) for
//!   good: every batch is attempted exactly once, dropped and counted
//!   (`hermes_collector_exporter_send_failed_spans_total`), and the
//!   collector keeps running.
//!
//! Timings are printed (`-- --nocapture`) and reported in
//! `docs/RELIABILITY.md`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use hermes_e2e::collector::Collector;
use hermes_e2e::fault::{
    export_span_counts, loadgen_summary, read_span_keys, run_loadgen, span_key, spool_files,
};
use hermes_e2e::hermes::PY_AGENT_PRELUDE;
use hermes_e2e::otlp_receiver::Rejection;
use hermes_e2e::{
    AttrsExt, FakeOpenAi, HermesHome, OtlpHttpReceiver, OtlpReceiver, SpanExt, SpanStore, SpanTree,
    free_port, wait_until,
};
use serde_json::{Value, json};

/// Bound on a span export reaching the receiver after the fact.
const WAIT: Duration = Duration::from_secs(30);
/// Bound on one Hermes process.
const AGENT_RUN: Duration = Duration::from_secs(180);

// ---------------------------------------------------------------------------
// Collector stopped while a real Hermes agent runs
// ---------------------------------------------------------------------------

/// The three turns of one agent (the second calls a tool).
fn three_turns() -> Vec<Value> {
    vec![
        json!({"content": "First answer.", "usage": {"prompt_tokens": 101, "completion_tokens": 1}}),
        json!({"tool_calls": [{"name": "terminal", "arguments": {"command": "echo turn-two"}}],
               "usage": {"prompt_tokens": 102, "completion_tokens": 2}}),
        json!({"content": "Second answer.", "usage": {"prompt_tokens": 103, "completion_tokens": 3}}),
        json!({"content": "Third answer.", "usage": {"prompt_tokens": 104, "completion_tokens": 4}}),
    ]
}

/// A Python program running `queries` as turns of one `AIAgent`. Prints
/// `E2E {session, turns (s each), end}` after the last turn and
/// `E2E_EXIT {at, shim, stats}` from an exit handler registered before the
/// plugin is loaded, so it runs after the plugin's own (flush, spool):
/// `at - end` is the whole exit after the last turn (Hermes' own exit
/// handlers included), `shim` the time of the plugin's exit call alone
/// (`_core.shutdown`, timed by a wrapper).
fn agent_program(queries: &[&str]) -> String {
    let queries = serde_json::to_string(queries).unwrap();
    format!(
        r#"
import atexit, json, time
_shim_exit = []
def _e2e_exit():
    import hermes_collector
    print("E2E_EXIT " + json.dumps({{"at": time.monotonic(), "shim": sum(_shim_exit), "stats": hermes_collector.stats()}}), flush=True)
atexit.register(_e2e_exit)
{PY_AGENT_PRELUDE}
agent = make_agent()
history = None
turns = []
finals = []
for query in json.loads({queries:?}):
    started = time.monotonic()
    r = agent.run_conversation(query, conversation_history=history)
    turns.append(time.monotonic() - started)
    history = r.get("messages")
    finals.append(r.get("final_response"))
import hermes_collector
_shutdown = hermes_collector._core.shutdown
def _timed_shutdown(timeout_ms):
    started = time.monotonic()
    try:
        return _shutdown(timeout_ms)
    finally:
        _shim_exit.append(time.monotonic() - started)
hermes_collector._core.shutdown = _timed_shutdown
print("E2E " + json.dumps({{"session": agent.session_id, "turns": turns, "finals": finals, "end": time.monotonic()}}), flush=True)
"#
    )
}

/// One agent process, as measured.
struct AgentRun {
    session: String,
    /// Seconds per turn (`run_conversation`).
    turns: Vec<f64>,
    /// Seconds from the end of the last turn to the end of the plugin's
    /// exit handler.
    exit: f64,
    /// Seconds of the plugin's exit call (flush, spool).
    shim_exit: f64,
    /// Wall time of the whole process.
    wall: Duration,
    /// `hermes_collector.stats()` after the plugin's exit handler.
    stats: Value,
}

impl AgentRun {
    fn turns_total(&self) -> f64 {
        self.turns.iter().sum()
    }
}

fn run_agent(home: &HermesHome, queries: &[&str], env: &[(&str, &str)]) -> AgentRun {
    let out = home.python(&agent_program(queries), env, AGENT_RUN);
    assert!(out.success(), "agent run failed: {}", out.describe());
    let stdout = out.stdout();
    let line = |prefix: &str| -> Value {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .map(|l| serde_json::from_str(l).unwrap())
            .unwrap_or_else(|| panic!("no {prefix} line: {}", out.describe()))
    };
    let result = line("E2E ");
    let exit = line("E2E_EXIT ");
    assert_eq!(
        result["finals"].as_array().map(Vec::len),
        Some(queries.len()),
        "{result}"
    );
    AgentRun {
        session: result["session"].as_str().unwrap().to_string(),
        turns: result["turns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_f64().unwrap())
            .collect(),
        exit: exit["at"].as_f64().unwrap() - result["end"].as_f64().unwrap(),
        shim_exit: exit["shim"].as_f64().unwrap(),
        wall: out.elapsed,
        stats: exit["stats"].clone(),
    }
}

/// The spans of `session`.
fn session_tree(store: &SpanStore, session: &str) -> SpanTree {
    SpanTree::new(
        store
            .spans()
            .into_iter()
            .filter(|(_, s)| s.str_attr("session.id") == Some(session)),
    )
}

/// The structure of a session's turns, ids left out: per turn in start
/// order, its name, completion, attempt and tool counts, and its children's
/// names in start order.
fn shape(tree: &SpanTree) -> Vec<String> {
    let mut roots = tree.roots();
    roots.sort_by_key(|r| r.start_time_unix_nano);
    roots
        .iter()
        .map(|root| {
            let mut children = tree.children(root);
            children.sort_by_key(|c| c.start_time_unix_nano);
            let names: Vec<&str> = children.iter().map(|c| c.name.as_str()).collect();
            format!(
                "{} completed={:?} incomplete={:?} attempts={:?} tools={:?} [{}]",
                root.name,
                root.bool_attr("hermes.turn.completed"),
                root.bool_attr("hermes.incomplete"),
                root.int_attr("hermes.turn.api_attempts"),
                root.int_attr("hermes.turn.tool_calls"),
                names.join(", ")
            )
        })
        .collect()
}

fn wait_for_session(store: &SpanStore, session: &str, roots: usize, spans: usize) -> bool {
    store.wait_for(
        |received| {
            let mine: Vec<_> = received
                .iter()
                .filter(|(_, s)| s.str_attr("session.id") == Some(session))
                .collect();
            mine.len() >= spans && mine.iter().filter(|(_, s)| s.is_root()).count() >= roots
        },
        WAIT,
    )
}

#[test]
fn collector_down_during_a_real_agent_costs_no_time_and_the_spool_delivers_later() {
    let queries = ["Say one", "Run echo turn-two", "Say three"];
    let mut script = three_turns();
    script.extend(three_turns());
    script.push(json!({"content": "Later answer."}));
    let server = FakeOpenAi::start(Value::Array(script));
    let receiver = OtlpReceiver::start();
    let work = tempfile::tempdir().unwrap();
    let spool = work.path().join("spool");
    let baseline_spool = work.path().join("baseline-spool");
    let spool_env = spool.to_string_lossy().into_owned();
    let home = HermesHome::new(&server.base_url(), server.model());
    home.enable_plugin("hermes_collector");

    // 1. Baseline: the collector is up.
    let up_dir = work.path().join("up");
    std::fs::create_dir_all(&up_dir).unwrap();
    let collector = Collector::start_on(
        &up_dir,
        &format!("127.0.0.1:{}", free_port()),
        &["--otlp-endpoint", &receiver.endpoint()],
    );
    let baseline_spool_env = baseline_spool.to_string_lossy().into_owned();
    let baseline = run_agent(
        &home,
        &queries,
        &[
            ("HERMES_COLLECTOR_ENDPOINT", &collector.endpoint),
            ("HERMES_COLLECTOR_SPOOL_DIR", &baseline_spool_env),
        ],
    );
    assert!(
        wait_for_session(receiver.store(), &baseline.session, 3, 8),
        "baseline spans did not arrive:\n{}\n{}",
        receiver.store().tree().render(),
        collector.guard.stderr_text()
    );
    assert!(spool_files(&baseline_spool).is_empty());
    let baseline_shape = shape(&session_tree(receiver.store(), &baseline.session));

    // 2. The same agent with nothing listening on its collector endpoint.
    let down_port = free_port();
    let down_endpoint = format!("http://127.0.0.1:{down_port}");
    let down = run_agent(
        &home,
        &queries,
        &[
            ("HERMES_COLLECTOR_ENDPOINT", &down_endpoint),
            ("HERMES_COLLECTOR_SPOOL_DIR", &spool_env),
        ],
    );
    for (label, run) in [("collector up:  ", &baseline), ("collector down:", &down)] {
        println!(
            "{label} turns {:.3} s ({:?}), exit {:.3} s of which the plugin {:.3} s, process {:.2} s",
            run.turns_total(),
            run.turns,
            run.exit,
            run.shim_exit,
            run.wall.as_secs_f64()
        );
    }
    println!("stats up: {}\nstats down: {}", baseline.stats, down.stats);
    // A busy 2-core machine: within a second of the run with the collector up.
    assert!(
        down.turns_total() <= baseline.turns_total() + 1.0,
        "turns took {:.3} s with the collector down, {:.3} s with it up",
        down.turns_total(),
        baseline.turns_total()
    );
    assert!(
        down.exit <= baseline.exit + 1.0,
        "the exit took {:.3} s with the collector down, {:.3} s with it up",
        down.exit,
        baseline.exit
    );
    // The plugin's part: no wait for the collector, the spool file written
    // (its bound is 1 s, plus the 200 ms seal of the sender).
    assert!(
        down.shim_exit > 0.0 && down.shim_exit <= 1.2,
        "the plugin's exit took {:.3} s",
        down.shim_exit
    );
    let spooled = down.stats["spooled_events"].as_u64().unwrap();
    assert!(spooled >= 10, "{}", down.stats);
    assert_eq!(down.stats["spool_dropped_events"], 0, "{}", down.stats);
    assert_eq!(down.stats["acked_events"], 0, "{}", down.stats);
    assert_eq!(down.stats["dropped"], 0, "{}", down.stats);
    // The exit flush's spool file, and the one the process-exit step writes
    // after the interpreter is gone (its `process_exit` marker).
    assert_eq!(spool_files(&spool).len(), 2);
    assert_eq!(
        session_tree(receiver.store(), &down.session).len(),
        0,
        "nothing could be sent"
    );

    // 3. The collector is back on that endpoint, and a later agent starts
    //    the plugin with the same spool directory.
    let back_dir = work.path().join("back");
    std::fs::create_dir_all(&back_dir).unwrap();
    let back = Collector::start_on(
        &back_dir,
        &format!("127.0.0.1:{down_port}"),
        &["--otlp-endpoint", &receiver.endpoint()],
    );
    let later = run_agent(
        &home,
        &["Say later"],
        &[
            ("HERMES_COLLECTOR_ENDPOINT", &back.endpoint),
            ("HERMES_COLLECTOR_SPOOL_DIR", &spool_env),
        ],
    );
    println!("stats later: {}", later.stats);
    assert_eq!(later.stats["replayed_files"], 2, "{}", later.stats);
    assert_eq!(
        later.stats["replayed_events"].as_u64(),
        Some(spooled + 1),
        "the spooled events and the process-exit marker: {}",
        later.stats
    );
    assert!(spool_files(&spool).is_empty(), "deleted once acknowledged");
    assert!(
        wait_for_session(receiver.store(), &down.session, 3, 8),
        "the spooled turns did not arrive:\n{}\n{}",
        receiver.store().tree().render(),
        back.guard.stderr_text()
    );
    assert!(wait_for_session(receiver.store(), &later.session, 1, 2));
    std::thread::sleep(Duration::from_millis(800));
    let tree = session_tree(receiver.store(), &down.session);
    println!("spooled turns as received:\n{}", tree.render());
    tree.assert_well_formed();
    assert_eq!(tree.len(), 8, "{}", tree.render());
    assert!(tree.duplicates().is_empty(), "{}", tree.render());
    assert_eq!(shape(&tree), baseline_shape, "{}", tree.render());
}

// ---------------------------------------------------------------------------
// The OTLP receiver fails
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum Transport {
    Grpc,
    Http,
}

/// An in-test OTLP receiver of either transport.
enum Receiver {
    Grpc(OtlpReceiver),
    Http(OtlpHttpReceiver),
}

impl Receiver {
    fn start(transport: Transport) -> Receiver {
        match transport {
            Transport::Grpc => Receiver::Grpc(OtlpReceiver::start()),
            Transport::Http => Receiver::Http(OtlpHttpReceiver::start()),
        }
    }

    fn store(&self) -> &SpanStore {
        match self {
            Receiver::Grpc(r) => r.store(),
            Receiver::Http(r) => r.store(),
        }
    }

    /// The `exporters.otlp` section for it.
    fn exporter_yaml(&self, max_elapsed_secs: u64) -> String {
        let (endpoint, protocol) = match self {
            Receiver::Grpc(r) => (r.endpoint(), "grpc"),
            Receiver::Http(r) => (r.endpoint(), "http/protobuf"),
        };
        format!(
            "exporters:\n  otlp:\n    endpoint: {endpoint}\n    protocol: {protocol}\n    max_elapsed_secs: {max_elapsed_secs}\n"
        )
    }
}

/// A collector exporting to `receiver`, giving up on a batch after
/// `max_elapsed_secs`, with export batches of at most `max_spans` spans.
fn collector_for(
    dir: &Path,
    receiver: &Receiver,
    max_elapsed_secs: u64,
    max_spans: usize,
) -> Collector {
    let sections = format!(
        "batch:\n  max_spans: {max_spans}\n{}shutdown:\n  grace_ms: 5000\n",
        receiver.exporter_yaml(max_elapsed_secs)
    );
    Collector::start_with_sections(dir, &sections)
}

/// Runs `hermes-loadgen --expect-spans` (the shim's sender core, never
/// giving up before `timeout`) against `collector`; returns the span keys
/// the collector must produce.
fn load(
    collector: &Collector,
    dir: &Path,
    instances: usize,
    turns: usize,
    timeout: Duration,
) -> BTreeSet<String> {
    let expect = dir.join("expected-spans.txt");
    let out = run_loadgen(
        &[
            "--endpoint",
            &collector.endpoint,
            "--give-up-secs",
            "0",
            "--instances",
            &instances.to_string(),
            "--turns",
            &turns.to_string(),
            "--timeout-secs",
            &timeout.as_secs().to_string(),
            "--expect-spans",
            &expect.to_string_lossy(),
        ],
        timeout + Duration::from_secs(30),
    );
    assert!(out.success(), "loadgen: {}", out.describe());
    let summary = loadgen_summary(&out);
    assert_eq!(summary["events_acked"], summary["events_sent"], "{summary}");
    assert_eq!(summary["events_evicted"], 0, "{summary}");
    let expected = read_span_keys(&expect);
    assert_eq!(
        summary["expected_spans"].as_u64(),
        Some(expected.len() as u64)
    );
    assert!(!expected.is_empty());
    expected
}

fn received_keys(store: &SpanStore) -> BTreeSet<String> {
    store.spans().iter().map(|(_, s)| span_key(s)).collect()
}

/// The receiver answers UNAVAILABLE/503 for `OUTAGE`, then accepts:
/// returns a line for the report.
fn outage_then_recovery(transport: Transport) -> String {
    const OUTAGE: Duration = Duration::from_secs(60);
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(transport);
    let store = receiver.store().clone();
    store.fail_for(OUTAGE, Rejection::Unavailable);
    let recovers_at = store.fail_until().unwrap();
    // Retrying for longer than the outage.
    let mut collector = collector_for(dir.path(), &receiver, 150, 512);
    let started = Instant::now();
    let expected = load(&collector, dir.path(), 2, 100, Duration::from_secs(200));
    let loaded = started.elapsed();
    let delivered = store.wait_for(
        |spans| {
            let keys: BTreeSet<String> = spans.iter().map(|(_, s)| span_key(s)).collect();
            keys.is_superset(&expected)
        },
        OUTAGE + WAIT,
    );
    let received = received_keys(&store);
    assert!(
        delivered,
        "{transport:?}: {} of {} expected spans arrived; missing e.g. {:?}\n{}",
        received.intersection(&expected).count(),
        expected.len(),
        expected.difference(&received).take(5).collect::<Vec<_>>(),
        collector.guard.stderr_text()
    );
    let recovered_after = started.elapsed();
    let after_outage = Instant::now().saturating_duration_since(recovers_at);
    std::thread::sleep(Duration::from_millis(1000));
    let received = received_keys(&store);
    assert_eq!(
        received, expected,
        "{transport:?}: exactly the expected spans"
    );
    assert!(store.rejected() > 0, "{transport:?}: the outage was seen");
    let first = store.exports().first().map(|e| e.received_at).unwrap();
    assert!(
        first >= recovers_at,
        "{transport:?}: accepted during the outage"
    );
    assert!(collector.is_running());
    assert_eq!(
        collector.metric("hermes_collector_exporter_send_failed_spans_total"),
        0.0,
        "{transport:?}"
    );
    let sent = collector.metric("hermes_collector_exporter_sent_spans_total");
    assert!(sent >= expected.len() as f64, "{transport:?}: {sent}");
    format!(
        "{transport:?}: {} spans, loadgen done after {:.1} s, {} rejected requests, all delivered {:.1} s after the start ({:.1} s after the outage ended)",
        expected.len(),
        loaded.as_secs_f64(),
        store.rejected(),
        recovered_after.as_secs_f64(),
        after_outage.as_secs_f64()
    )
}

#[test]
fn receiver_unavailable_for_60_s_then_everything_arrives() {
    let grpc = std::thread::spawn(|| outage_then_recovery(Transport::Grpc));
    let http = std::thread::spawn(|| outage_then_recovery(Transport::Http));
    let reports = [grpc.join(), http.join()];
    for line in reports.iter().flatten() {
        println!("{line}");
    }
    for report in reports {
        if let Err(panic) = report {
            std::panic::resume_unwind(panic);
        }
    }
}

/// The receiver refuses every request as invalid: returns a line for the
/// report.
fn permanent_refusal(transport: Transport) -> String {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(transport);
    let store = receiver.store().clone();
    store.fail_always(Some(Rejection::InvalidArgument));
    // Small export batches: several requests, each to be tried once.
    let mut collector = collector_for(dir.path(), &receiver, 30, 50);
    let expected = load(&collector, dir.path(), 1, 40, Duration::from_secs(60));
    let counted = wait_until(WAIT, Duration::from_millis(100), || {
        collector.metric("hermes_collector_exporter_send_failed_spans_total")
            >= expected.len() as f64
    });
    assert!(
        counted,
        "{transport:?}: {} of {} spans counted as failed\n{}",
        collector.metric("hermes_collector_exporter_send_failed_spans_total"),
        expected.len(),
        collector.guard.stderr_text()
    );
    // Time for a retry to show up, if there were one.
    std::thread::sleep(Duration::from_millis(1500));
    let rejected = store.rejected_exports();
    let counts = export_span_counts(&rejected);
    let keys: BTreeSet<String> = counts.keys().cloned().collect();
    assert_eq!(keys, expected, "{transport:?}: every span was attempted");
    assert!(
        rejected.len() >= 2,
        "{transport:?}: {} requests",
        rejected.len()
    );
    let retried: Vec<_> = counts.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        retried.is_empty(),
        "{transport:?}: attempted more than once: {retried:?}"
    );
    assert_eq!(
        collector.metric("hermes_collector_exporter_send_failed_spans_total"),
        expected.len() as f64
    );
    assert_eq!(
        collector.metric("hermes_collector_exporter_sent_spans_total"),
        0.0
    );
    assert_eq!(store.span_count(), 0);
    assert!(
        collector.is_running(),
        "{transport:?}: the collector exited"
    );
    assert!(
        collector.admin_get("/livez").starts_with("HTTP/1.1 200"),
        "{transport:?}"
    );
    format!(
        "{transport:?}: {} spans in {} requests, each refused once and counted",
        expected.len(),
        rejected.len()
    )
}

#[test]
fn receiver_refusing_as_invalid_drops_counts_and_never_retries() {
    for transport in [Transport::Grpc, Transport::Http] {
        println!("{}", permanent_refusal(transport));
    }
}
