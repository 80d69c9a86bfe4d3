//! Issue #29, a replicated fleet: three collector processes on 127.0.0.2,
//! .3 and .4 (one port, one name in a test hosts file, each with its own
//! persistent queue, `fleet.replicated: true`), all exporting to one OTLP
//! receiver. 200 simulated agents (the load generator: the shim's real
//! sender per agent, thousands of recorded turns) and real Hermes agents
//! (the installed plugin) stream to `dns:///NAME:PORT`. Mid-run one
//! replica is killed with SIGKILL and restarted, a fourth (127.0.0.5) is
//! added to the name, and one is stopped with SIGTERM (it drains: its
//! agents hand off and move).
//!
//! Every turn must arrive as one trace with exactly one root span, every
//! expected span id must arrive, a span that arrives twice must be the
//! same bytes, and the agents' queue pushes (the hook path) never wait.
//! The replicas run with a short end grace, so that a move between a
//! turn's end events is caught in every run, not only under load.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use hermes_e2e::fault::{assert_all_arrived, loadgen_summary, read_span_keys, spawn_loadgen};
use hermes_e2e::fleet::{Fleet, assert_whole_traces};
use hermes_e2e::{AttrsExt, FakeOpenAi, HermesHome, OtlpReceiver, SpanTree, basic_turn, cargo_bin};

/// The replicas at the start, the one added, the one killed and the one
/// stopped.
const FIRST: [u8; 3] = [2, 3, 4];
const ADDED: u8 = 5;
const KILLED: u8 = 3;
const DRAINED: u8 = 2;
/// An end grace far below the default (2 s): a replica that closed a moved
/// agent's ended turn at the grace, before the handoff behind its last
/// batches was read, would export it without its end while the next
/// replica ends it whole. With the default that takes a stream backed up
/// for seconds; with this one, any move between a turn's `post_llm_call`
/// and its `on_session_end`.
const SHORT_END_GRACE: &str = "correlator:\n  turn_end_grace_ms: 100\n";
/// Real Hermes agents run alongside the simulated ones.
const REAL_AGENTS: usize = 3;
/// The longest queue push the agents may see. A push never waits for the
/// network; on a loaded machine the pushing thread may still be preempted
/// for tens of milliseconds, while a push that waited for a replica would
/// take as long as its kill, restart or drain (seconds).
const MAX_PUSH_MICROS: u64 = 500_000;

/// Waits (bounded) until the replicas accepted `n` events in all.
fn wait_accepted(fleet: &Fleet, n: f64) {
    let deadline = Instant::now() + Duration::from_secs(240);
    while fleet.metric("hermes_collector_receiver_accepted_events_total") < n {
        assert!(
            Instant::now() < deadline,
            "the fleet never accepted {n} events:\n{}",
            fleet.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One basic turn of a real Hermes agent through the fleet; its session id.
fn real_agent_turn(env: &[(&str, &str)]) -> (String, String) {
    let server = FakeOpenAi::start(basic_turn::script());
    let home = HermesHome::new(&server.base_url(), server.model());
    home.enable_plugin("hermes_collector");
    let out = home.run_chat("Please run echo hermes-e2e", env);
    assert!(
        out.status.success(),
        "hermes failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (hermes_e2e::rig::session_id(&out), server.model().to_owned())
}

#[test]
fn a_fleet_keeps_every_turn_one_trace_through_a_kill_a_scale_up_and_a_drain() {
    cargo_bin("hermes-loadgen", "hermes-loadgen");
    hermes_e2e::ensure_venv();
    let receiver = OtlpReceiver::start();
    let mut fleet = Fleet::new(&receiver, &[2, 3, 4, 5], SHORT_END_GRACE);
    for octet in FIRST {
        fleet.start(octet);
    }
    fleet.list(&FIRST);
    let endpoint = fleet.endpoint();
    let hosts = fleet.hosts_file();
    let hosts = hosts.to_str().unwrap();
    let expected_file = fleet.dir().join("expected-spans.txt");
    // 200 agents x 50 recorded turns: 10 000 turns, about 150 000 events.
    let loadgen = spawn_loadgen(&[
        "--endpoint",
        &endpoint,
        "--hosts-file",
        hosts,
        "--resolve-secs",
        "1",
        "--instances",
        "200",
        "--turns",
        "50",
        "--batch",
        "64",
        "--timeout-secs",
        "400",
        "--give-up-secs",
        "120",
        "--expect-spans",
        expected_file.to_str().unwrap(),
    ]);
    let env = [
        ("HERMES_COLLECTOR_ENDPOINT", endpoint.as_str()),
        ("HERMES_COLLECTOR_HOSTS_FILE", hosts),
        ("HERMES_COLLECTOR_RESOLVE_SECS", "1"),
    ];
    let real_agents = std::thread::scope(|scope| {
        let agents = scope.spawn(|| {
            (0..REAL_AGENTS)
                .map(|_| real_agent_turn(&env))
                .collect::<Vec<_>>()
        });

        wait_accepted(&fleet, 20_000.0);
        assert!(!fleet.kill(KILLED).success());
        fleet.restart(KILLED);
        wait_accepted(&fleet, 50_000.0);
        fleet.start(ADDED);
        fleet.list(&[2, 3, 4, ADDED]);
        wait_accepted(&fleet, 80_000.0);
        // A replica that is stopped leaves the name first, as a pod's
        // address leaves its headless Service.
        fleet.list(&[3, 4, ADDED]);
        let status = fleet.terminate(DRAINED, Duration::from_secs(60));
        assert!(
            status.is_some_and(|s| s.success()),
            "the drained replica did not stop cleanly: {status:?}"
        );
        agents.join().unwrap()
    });

    let out = loadgen.into_output(Duration::from_secs(420));
    assert!(out.success(), "loadgen failed:\n{}", out.describe());
    let summary = loadgen_summary(&out);
    assert_eq!(summary["events_evicted"], 0, "{summary}");
    assert_eq!(summary["events_evicted_unsettled"], 0, "{summary}");
    assert!(summary["replica_moves"].as_u64().unwrap() > 0, "{summary}");
    assert!(
        summary["max_push_micros"].as_u64().unwrap() < MAX_PUSH_MICROS,
        "a queue push waited: {summary}"
    );
    assert!(summary["turns"].as_u64().unwrap() >= 10_000, "{summary}");

    // Every span the events make arrives.
    let expected = read_span_keys(&expected_file);
    let arrived = || -> bool {
        let got: std::collections::BTreeSet<String> = receiver
            .spans()
            .iter()
            .map(|(_, s)| hermes_e2e::fault::span_key(s))
            .collect();
        got.is_superset(&expected)
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while !arrived() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(250));
    }
    let spans = receiver.spans();
    let (got, repeats) = assert_whole_traces(&spans, |agent| fleet.trail(agent));
    assert_all_arrived(&expected, &got, &fleet.logs());

    // The real agents' turns: each one whole tree, as with one collector.
    for (session, model) in &real_agents {
        let tree = SpanTree::new(
            spans
                .iter()
                .filter(|(_, s)| s.str_attr("session.id") == Some(session.as_str()))
                .cloned(),
        );
        basic_turn::assert_tree(&tree, session, model);
    }
    eprintln!(
        "fleet: {} spans expected, {} received, {repeats} repeats, {summary}",
        expected.len(),
        spans.len()
    );
}
