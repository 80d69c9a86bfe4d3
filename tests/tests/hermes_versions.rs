//! Older hermes-agent releases, each in a venv of its own
//! (`HermesHome::with_hermes`), installed the way README.md's "Hermes
//! versions" says, through the shim and the real collector:
//!
//! - 0.18.2: `hermes plugins enable hermes_collector
//!   --no-allow-tool-override`, then the basic turn (a tool call between two
//!   model calls) becomes the same trace as on 0.19.0.
//! - 0.17.0: `hermes plugins enable` does not know pip plugins there; listing
//!   the plugin in `plugins.enabled` of `config.yaml` loads it, and a turn's
//!   events reach the collector.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use hermes_e2e::collector::Collector;
use hermes_e2e::{AttrsExt, FakeOpenAi, HermesHome, OtlpReceiver, SpanExt, SpanTree};
use opentelemetry_proto::tonic::trace::v1::Span;
use serde_json::{Value, json};
use tempfile::TempDir;

const WAIT: Duration = Duration::from_secs(30);
/// After the expected spans: time for an unexpected extra one to arrive.
const SETTLE: Duration = Duration::from_millis(800);

/// One tool call, then the final answer.
fn script() -> Value {
    json!([
        {"tool_calls": [{"name": "terminal", "arguments": {"command": "echo hermes-e2e"}}],
         "usage": {"prompt_tokens": 1212, "completion_tokens": 17}},
        {"content": "The command printed hermes-e2e.",
         "usage": {"prompt_tokens": 1300, "completion_tokens": 21}}
    ])
}

/// `(prompt_tokens, completion_tokens)` of each scripted response.
const USAGE: [(i64, i64); 2] = [(1212, 17), (1300, 21)];

struct Setup {
    server: FakeOpenAi,
    receiver: OtlpReceiver,
    collector: Collector,
    home: HermesHome,
    _work: TempDir,
}

impl Setup {
    fn start(hermes_version: &str) -> Setup {
        let server = FakeOpenAi::start(script());
        let receiver = OtlpReceiver::start();
        let work = tempfile::tempdir().expect("tempdir");
        let collector = Collector::start(work.path(), &["--otlp-endpoint", &receiver.endpoint()]);
        let home = HermesHome::with_hermes(hermes_version, &server.base_url(), server.model());
        Setup {
            server,
            receiver,
            collector,
            home,
            _work: work,
        }
    }

    /// Runs the turn; returns the session id Hermes printed.
    fn run_turn(&self) -> String {
        let out = self.home.run_chat(
            "Please run echo hermes-e2e",
            &[("HERMES_COLLECTOR_ENDPOINT", &self.collector.endpoint)],
        );
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(
            out.status.success(),
            "hermes failed: {}\n{stdout}\n{stderr}",
            out.status
        );
        assert!(
            stdout.contains("The command printed hermes-e2e."),
            "{stdout}\n{stderr}"
        );
        stderr
            .lines()
            .chain(stdout.lines())
            .find_map(|l| l.split("session_id: ").nth(1))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|| panic!("no session id printed:\n{stdout}\n{stderr}"))
    }

    /// Waits for a root and `spans` spans, lets a late one arrive.
    fn collect(&self, spans: usize) -> SpanTree {
        let arrived = self.receiver.wait_for(
            |received| received.len() >= spans && received.iter().any(|(_, s)| s.is_root()),
            WAIT,
        );
        assert!(
            arrived,
            "{spans} spans expected within {WAIT:?}; got:\n{}\n--- collector log ---\n{}\n--- agent.log ---\n{}",
            self.receiver.store().tree().render(),
            self.collector.guard.stderr_text(),
            self.home.agent_log()
        );
        std::thread::sleep(SETTLE);
        let tree = self.receiver.store().tree();
        println!("received tree:\n{}", tree.render());
        tree
    }
}

/// The basic turn's trace, as on 0.19.0 (`e2e_trace.rs`): one trace, root
/// `invoke_agent hermes`, two `chat {model}` children with the server's
/// usage, one `execute_tool terminal` between them, `session.id` on all.
fn assert_basic_turn(tree: &SpanTree, session: &str, model: &str) {
    tree.assert_well_formed();
    assert_eq!(tree.trace_ids().len(), 1, "one trace:\n{}", tree.render());
    let roots = tree.roots();
    assert_eq!(roots.len(), 1, "{}", tree.render());
    let root = roots[0];
    assert_eq!(root.name, "invoke_agent hermes");
    let mut chats: Vec<&Span> = tree.children_named(root, &format!("chat {model}"));
    chats.sort_by_key(|s| s.start_time_unix_nano);
    assert_eq!(chats.len(), 2, "{}", tree.render());
    for (chat, (prompt, completion)) in chats.iter().zip(USAGE) {
        assert_eq!(
            chat.int_attr("gen_ai.usage.input_tokens"),
            Some(prompt),
            "{}",
            tree.render()
        );
        assert_eq!(
            chat.int_attr("gen_ai.usage.output_tokens"),
            Some(completion)
        );
        assert_eq!(chat.str_attr("gen_ai.request.model"), Some(model));
        assert_eq!(chat.str_attr("server.address"), Some("127.0.0.1"));
    }
    let tools = tree.children_named(root, "execute_tool terminal");
    assert_eq!(tools.len(), 1, "{}", tree.render());
    assert_eq!(tools[0].str_attr("gen_ai.tool.call.id"), Some("call_1"));
    assert_eq!(tools[0].str_attr("hermes.tool.status"), Some("ok"));
    assert!(tools[0].start_time_unix_nano >= chats[0].end_time_unix_nano);
    assert!(tools[0].end_time_unix_nano <= chats[1].start_time_unix_nano);
    assert_eq!(tree.len(), 4, "{}", tree.render());
    for span in tree.spans() {
        assert_eq!(
            span.str_attr("session.id"),
            Some(session),
            "{} lacks session.id",
            span.name
        );
    }
    assert_eq!(root.int_attr("hermes.turn.api_attempts"), Some(2));
    assert_eq!(root.int_attr("hermes.turn.tool_calls"), Some(1));
    assert_eq!(root.bool_attr("hermes.turn.completed"), Some(true));
}

#[test]
fn hermes_0_18_2_enabled_without_tool_override_gives_the_basic_trace() {
    let setup = Setup::start("0.18.2");
    // `--no-allow-tool-override` (HermesHome adds it from 0.18 on): enabled
    // without the question on stdin, and without the grant.
    setup.home.enable_plugin("hermes_collector");
    let config = setup.home.config_yaml();
    assert!(config.contains("- hermes_collector"), "{config}");
    assert!(config.contains("allow_tool_override: false"), "{config}");
    let list = setup.home.plugins_list();
    assert!(
        list.contains("hermes_collector"),
        "plugin not listed:\n{list}"
    );
    let session = setup.run_turn();
    let tree = setup.collect(4);
    assert_basic_turn(&tree, &session, setup.server.model());
}

#[test]
fn hermes_0_17_0_loads_the_plugin_listed_in_config_yaml() {
    let setup = Setup::start("0.17.0");
    let refused = setup.home.try_enable_plugin("hermes_collector");
    assert!(
        !refused.success() && refused.stdout().contains("is not installed or bundled"),
        "0.17.0's `hermes plugins enable` sees no pip plugin; if it does now, \
         README.md's \"Hermes versions\" is out of date: {}",
        refused.describe()
    );
    setup.home.enable_plugin_in_config("hermes_collector");
    let session = setup.run_turn();
    let tree = setup.collect(4);
    tree.assert_well_formed();
    let roots = tree.roots();
    assert_eq!(roots.len(), 1, "{}", tree.render());
    assert_eq!(roots[0].name, "invoke_agent hermes");
    assert_eq!(roots[0].bool_attr("hermes.turn.completed"), Some(true));
    let chat = format!("chat {}", setup.server.model());
    assert_eq!(
        tree.children_named(roots[0], &chat).len(),
        2,
        "{}",
        tree.render()
    );
    assert_eq!(
        tree.children_named(roots[0], "execute_tool terminal").len(),
        1,
        "{}",
        tree.render()
    );
    for span in tree.spans() {
        assert_eq!(
            span.str_attr("session.id"),
            Some(session.as_str()),
            "{}",
            span.name
        );
    }
}
