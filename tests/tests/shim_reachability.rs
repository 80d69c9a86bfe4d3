//! The real `hermes-agent==0.19.0` with our shim, pointed at a collector
//! that is not there: the agent runs as usual, Hermes' own log
//! (`$HERMES_HOME/logs/agent.log`, warnings in `errors.log` too) says once
//! that no telemetry leaves, naming the endpoint, how long, and what
//! happens to the events; the terminal (stdout and stderr of `hermes chat`)
//! says nothing of it. When the collector comes up later the log says so
//! once, and the events held meanwhile reach it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Stdio;
use std::time::Duration;

use hermes_e2e::collector::Collector;
use hermes_e2e::hermes::PY_AGENT_PRELUDE;
use hermes_e2e::{
    ChildGuard, FakeOpenAi, HermesHome, OtlpReceiver, SpanExt, cargo_bin, free_port, wait_until,
};
use serde_json::json;

/// Bound on every wait: a notice in the log, the agent's exit, the spans.
const WAIT: Duration = Duration::from_secs(60);

fn log_file(home: &HermesHome, name: &str) -> String {
    std::fs::read_to_string(home.hermes_home().join("logs").join(name)).unwrap_or_default()
}

/// The lines of `log` that name `needle`.
fn lines_with<'a>(log: &'a str, needle: &str) -> Vec<&'a str> {
    log.lines().filter(|l| l.contains(needle)).collect()
}

#[test]
fn an_unreachable_collector_is_named_once_in_the_agent_log_never_on_the_terminal() {
    let server = FakeOpenAi::start(json!([
        {"content": "Hello from the scripted model.", "usage": {"prompt_tokens": 20, "completion_tokens": 5}}
    ]));
    let home = HermesHome::new(&server.base_url(), server.model());
    home.enable_plugin("hermes_collector");
    // Nothing listens there.
    let endpoint = format!("http://127.0.0.1:{}", free_port());

    let out = home.run_chat("Say hello", &[("HERMES_COLLECTOR_ENDPOINT", &endpoint)]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "hermes failed:\n{stdout}\n{stderr}");
    assert!(
        stdout.contains("Hello from the scripted model."),
        "{stdout}\n{stderr}"
    );
    for (name, text) in [("stdout", &stdout), ("stderr", &stderr)] {
        assert!(
            !text.contains(&endpoint) && !text.contains("hermes_collector"),
            "the terminal ({name}) speaks of the collector:\n{text}"
        );
    }

    let agent_log = log_file(&home, "agent.log");
    let named = lines_with(&agent_log, &endpoint);
    assert_eq!(
        named.len(),
        1,
        "agent.log names the endpoint once:\n{agent_log}"
    );
    let line = named[0];
    println!("agent.log says:\n{line}");
    for part in [
        " WARNING ",
        "hermes_collector: cannot reach the collector at ",
        " for ",
        "Connection refused",
        "events are kept in memory (up to 1024 batches, 32 MiB",
        "what is still held at exit is lost and counted",
    ] {
        assert!(line.contains(part), "{part:?} missing in:\n{line}");
    }
    // What the exit could not deliver is counted (one turn: several hooks).
    let exit = lines_with(&agent_log, "events not delivered to the collector at exit");
    assert_eq!(exit.len(), 1, "{agent_log}");
    assert!(
        exit[0].contains(" lost (HERMES_COLLECTOR_SPOOL_DIR"),
        "{}",
        exit[0]
    );
    let lost: u64 = exit[0]
        .rsplit("hermes_collector: ")
        .next()
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in {}", exit[0]));
    assert!(lost >= 4, "a turn is at least 4 hook calls: {}", exit[0]);
    // The triage log has the warning too.
    assert_eq!(
        lines_with(&log_file(&home, "errors.log"), &endpoint).len(),
        1,
        "{}",
        log_file(&home, "errors.log")
    );
}

/// Two turns on one agent (Python API): the first while the collector is
/// down, the second once it is up. The log says the outage once, then that
/// the collector is back; both turns reach the backend.
#[test]
fn a_collector_that_comes_up_later_is_said_once_and_gets_the_held_events() {
    let server = FakeOpenAi::start(json!([
        {"content": "First answer.", "usage": {"prompt_tokens": 20, "completion_tokens": 3}},
        {"content": "Second answer.", "usage": {"prompt_tokens": 30, "completion_tokens": 3}}
    ]));
    let home = HermesHome::new(&server.base_url(), server.model());
    home.enable_plugin("hermes_collector");
    let listen = format!("127.0.0.1:{}", free_port());
    let endpoint = format!("http://{listen}");
    let work = tempfile::tempdir().expect("tempdir");
    let go = work.path().join("go");
    // Built (and its receiver up) before the agent starts waiting for it.
    cargo_bin("hermes-collector", "hermes-collector");
    let receiver = OtlpReceiver::start();

    let code = format!(
        r#"{PY_AGENT_PRELUDE}
import json, os, time
import hermes_collector
agent = make_agent()
agent.run_conversation("first")
deadline = time.time() + 60
while not os.path.exists(os.environ["HERMES_E2E_GO"]) and time.time() < deadline:
    time.sleep(0.05)
agent.run_conversation("second")
print("E2E " + json.dumps({{"flushed": hermes_collector.flush(20000)}}), flush=True)
"#
    );
    let go_path = go.to_string_lossy().into_owned();
    let mut cmd = home.command(
        "python",
        &[
            ("HERMES_COLLECTOR_ENDPOINT", &endpoint),
            ("HERMES_E2E_GO", &go_path),
        ],
    );
    cmd.arg("-c")
        .arg(&code)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut agent = ChildGuard::spawn_named("agent", &mut cmd).expect("spawn python");

    let unreachable = format!("cannot reach the collector at {endpoint} for ");
    assert!(
        wait_until(WAIT, Duration::from_millis(100), || {
            log_file(&home, "agent.log").contains(&unreachable)
        }),
        "no outage notice in agent.log:\n{}\n--- agent stderr ---\n{}",
        log_file(&home, "agent.log"),
        agent.stderr_text()
    );

    let collector = Collector::start_on(
        work.path(),
        &listen,
        &["--otlp-endpoint", &receiver.endpoint()],
    );
    std::fs::write(&go, b"").expect("write go");
    let status = agent.wait_timeout(WAIT).expect("the agent exits");
    let stdout = agent.stdout_text();
    let stderr = agent.stderr_text();
    assert!(status.success(), "agent failed:\n{stdout}\n{stderr}");
    assert!(
        stdout.contains(r#"E2E {"flushed": true}"#),
        "{stdout}\n{stderr}"
    );
    for text in [&stdout, &stderr] {
        assert!(
            !text.contains(&endpoint),
            "the terminal speaks of the collector:\n{text}"
        );
    }

    let agent_log = log_file(&home, "agent.log");
    let named = lines_with(&agent_log, &endpoint);
    assert_eq!(named.len(), 2, "the outage, then its end:\n{agent_log}");
    assert!(named[0].contains(&unreachable), "{}", named[0]);
    assert!(
        named[1].contains(" INFO ")
            && named[1].contains(&format!(
                "hermes_collector: the collector at {endpoint} is reachable again after "
            )),
        "{}",
        named[1]
    );
    assert!(
        !agent_log.contains("not delivered to the collector at exit"),
        "{agent_log}"
    );
    // Both turns, the one held in memory included, reach the backend.
    assert!(
        receiver.wait_for(
            |spans| spans.iter().filter(|(_, s)| s.is_root()).count() >= 2,
            WAIT
        ),
        "two turns expected; got {} span(s); collector log:\n{}",
        receiver.spans().len(),
        collector.guard.stderr_text()
    );
}
