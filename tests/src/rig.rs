//! The scaffolding of a real-agent test: a scripted OpenAI server, an OTLP
//! receiver, a collector exporting to it and an isolated Hermes home
//! configured for the server ([`AgentRig`]), waiting for the spans of a run
//! ([`AgentRig::collect_when`]), the session id a Hermes run printed
//! ([`session_id`]), and the scripted delegation ([`subagent_script`]).

use std::process::Output;
use std::time::Duration;

use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::Span;
use serde_json::Value;
use tempfile::TempDir;

use crate::collector::Collector;
use crate::{FakeOpenAi, HermesHome, OtlpReceiver, SpanTree};

/// Bound on the export of a finished run.
pub const WAIT: Duration = Duration::from_secs(30);
/// After the expected spans arrived: time for an unexpected extra one to
/// arrive too (the collector's batch timeout is 200 ms).
pub const SETTLE: Duration = Duration::from_millis(800);

/// What a real-agent test runs against; everything stops on drop.
pub struct AgentRig {
    pub server: FakeOpenAi,
    pub receiver: OtlpReceiver,
    pub collector: Collector,
    pub home: HermesHome,
    /// The collector's working directory.
    pub work: TempDir,
}

impl AgentRig {
    /// The fake server with `script`, a receiver, a collector exporting to
    /// it over OTLP/gRPC, and Hermes `hermes_version` configured for the
    /// server, the shim not enabled.
    pub fn start(script: Value, hermes_version: &str) -> AgentRig {
        Self::start_collector(script, hermes_version, |work, receiver| {
            Collector::start(work, &["--otlp-endpoint", &receiver.endpoint()])
        })
    }

    /// As [`start_enabled`](Self::start_enabled), the collector run with a
    /// configuration file: an OTLP/gRPC exporter to the receiver, then
    /// `sections` (YAML of the other top-level sections).
    pub fn start_configured(script: Value, hermes_version: &str, sections: &str) -> AgentRig {
        let rig = Self::start_collector(script, hermes_version, |work, receiver| {
            let otlp = format!(
                "exporters:\n  otlp:\n    endpoint: {}\n{sections}",
                receiver.endpoint()
            );
            Collector::start_with_sections(work, &otlp)
        });
        rig.home.enable_plugin("hermes_collector");
        rig
    }

    fn start_collector(
        script: Value,
        hermes_version: &str,
        collector: impl FnOnce(&std::path::Path, &OtlpReceiver) -> Collector,
    ) -> AgentRig {
        let server = FakeOpenAi::start(script);
        let receiver = OtlpReceiver::start();
        let work = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let collector = collector(work.path(), &receiver);
        let home = HermesHome::with_hermes(hermes_version, &server.base_url(), server.model());
        AgentRig {
            server,
            receiver,
            collector,
            home,
            work,
        }
    }

    /// As [`start`](Self::start), with the shim enabled as a Hermes plugin.
    pub fn start_enabled(script: Value, hermes_version: &str) -> AgentRig {
        let rig = AgentRig::start(script, hermes_version);
        rig.home.enable_plugin("hermes_collector");
        rig
    }

    /// The shim's environment (its collector endpoint) plus `extra`.
    pub fn env<'a>(&'a self, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
        let mut env = vec![(
            "HERMES_COLLECTOR_ENDPOINT",
            self.collector.endpoint.as_str(),
        )];
        env.extend_from_slice(extra);
        env
    }

    /// Waits at most [`WAIT`] until `done` holds for the spans received;
    /// whether it did.
    pub fn wait_for(&self, done: impl FnMut(&[(Resource, Span)]) -> bool) -> bool {
        self.receiver.wait_for(done, WAIT)
    }

    /// Waits [`SETTLE`] for a late extra span, then prints and returns the
    /// tree of what arrived.
    pub fn settled_tree(&self) -> SpanTree {
        std::thread::sleep(SETTLE);
        let tree = self.receiver.store().tree();
        println!("received tree:\n{}", tree.render());
        tree
    }

    /// For a failed wait: the collector's log, the requests the fake server
    /// got and the agent's log.
    pub fn report(&self) -> String {
        format!(
            "--- collector log ---\n{}\n--- requests ---\n{}\n--- agent.log ---\n{}",
            self.collector.guard.stderr_text(),
            self.server.describe_requests(),
            self.home.agent_log()
        )
    }

    /// Waits (bounded) until `done` holds for the spans received, then
    /// returns the [settled](Self::settled_tree) tree; panics showing what
    /// arrived and the [report](Self::report) if it does not, `expected`
    /// saying what was awaited.
    pub fn collect_when(
        &self,
        expected: &str,
        done: impl FnMut(&[(Resource, Span)]) -> bool,
    ) -> SpanTree {
        assert!(
            self.wait_for(done),
            "expected {expected} within {WAIT:?}; got:\n{}\n{}",
            self.receiver.store().tree().render(),
            self.report()
        );
        self.settled_tree()
    }
}

/// The session id a `hermes chat` run printed (`session_id: …`, on stderr
/// or stdout); panics with the output if there is none.
pub fn session_id(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    stderr
        .lines()
        .chain(stdout.lines())
        .find_map(|l| l.split("session_id: ").nth(1))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| panic!("no session id printed:\n{stdout}\n{stderr}"))
}

/// Parent asks for `delegate_task`; the child (same server) runs `echo`
/// and answers; the parent answers. Script entries are consumed in this
/// order because the delegation is synchronous (`hermes -z`, or the Python
/// API with a stateless channel).
pub fn subagent_script() -> Value {
    serde_json::json!([
        {"tool_calls": [{"name": "delegate_task",
                         "arguments": {"goal": "Run echo from-child and report its output"}}],
         "usage": {"prompt_tokens": 111, "completion_tokens": 11}},
        {"tool_calls": [{"name": "terminal", "arguments": {"command": "echo from-child"}}],
         "usage": {"prompt_tokens": 200, "completion_tokens": 20}},
        {"content": "The child printed from-child.",
         "usage": {"prompt_tokens": 300, "completion_tokens": 30}},
        {"content": "Parent done: the subagent printed from-child.",
         "usage": {"prompt_tokens": 444, "completion_tokens": 44}}
    ])
}
