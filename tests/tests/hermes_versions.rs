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

use hermes_e2e::basic_turn;
use hermes_e2e::rig::AgentRig;
use hermes_e2e::{AttrsExt, SpanExt, SpanTree};

/// What these tests do with an [`AgentRig`].
trait Setup {
    fn run_turn(&self) -> String;
    fn collect(&self, spans: usize) -> SpanTree;
}

impl Setup for AgentRig {
    /// Runs the turn; returns the session id Hermes printed.
    fn run_turn(&self) -> String {
        basic_turn::run(&self.home, &self.collector.endpoint).1
    }

    /// Waits for a root and `spans` spans, lets a late one arrive.
    fn collect(&self, spans: usize) -> SpanTree {
        self.collect_when(&format!("{spans} spans"), |received| {
            received.len() >= spans && received.iter().any(|(_, s)| s.is_root())
        })
    }
}

#[test]
fn hermes_0_18_2_enabled_without_tool_override_gives_the_basic_trace() {
    let setup = AgentRig::start(basic_turn::script(), "0.18.2");
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
    basic_turn::assert_tree(&tree, &session, setup.server.model());
}

#[test]
fn hermes_0_17_0_loads_the_plugin_listed_in_config_yaml() {
    let setup = AgentRig::start(basic_turn::script(), "0.17.0");
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
