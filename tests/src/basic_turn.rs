//! The basic real-agent turn the end-to-end tests of every Hermes release
//! run: one tool call, then the final answer, and the trace it must give.

use opentelemetry_proto::tonic::trace::v1::Span;
use serde_json::{Value, json};

use std::process::Output;

use crate::{AttrsExt, HermesHome, SpanExt, SpanTree};

/// One tool call, then the final answer; the usage the server reports.
pub fn script() -> Value {
    json!([
        {"tool_calls": [{"name": "terminal", "arguments": {"command": "echo hermes-e2e"}}],
         "usage": {"prompt_tokens": 1212, "completion_tokens": 17, "cached_tokens": 8}},
        {"content": "The command printed hermes-e2e.",
         "usage": {"prompt_tokens": 1300, "completion_tokens": 21}}
    ])
}

/// `(prompt_tokens, completion_tokens)` of each scripted response.
pub const USAGE: [(i64, i64); 2] = [(1212, 17), (1300, 21)];

/// The tree the issue asks for: one trace, root `invoke_agent hermes`, two
/// `chat {model}` children with the server's usage, one `execute_tool
/// terminal` child with its call id, all parents present, children inside
/// their parent's window, `session.id` on every span.
pub fn assert_tree(tree: &SpanTree, session: &str, model: &str) {
    tree.assert_well_formed();
    assert_eq!(tree.trace_ids().len(), 1, "one trace:\n{}", tree.render());
    let roots = tree.roots();
    assert_eq!(roots.len(), 1, "{}", tree.render());
    let root = roots[0];
    assert_eq!(root.name, "invoke_agent hermes");
    assert!(root.is_root());
    let chat_name = format!("chat {model}");
    let mut chats: Vec<&Span> = tree.children_named(root, &chat_name);
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
        assert_eq!(chat.str_attr("gen_ai.operation.name"), Some("chat"));
        assert_eq!(chat.str_attr("gen_ai.request.model"), Some(model));
        assert_eq!(chat.str_attr("server.address"), Some("127.0.0.1"));
    }
    let tools = tree.children_named(root, "execute_tool terminal");
    assert_eq!(tools.len(), 1, "{}", tree.render());
    assert_eq!(tools[0].str_attr("gen_ai.tool.call.id"), Some("call_1"));
    assert_eq!(tools[0].str_attr("hermes.tool.status"), Some("ok"));
    // The tool ran between the two model calls.
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
        if !span.is_root() {
            assert_eq!(span.parent_span_id, root.span_id);
            assert!(
                span.start_time_unix_nano >= root.start_time_unix_nano,
                "{}",
                span.name
            );
            assert!(
                span.end_time_unix_nano <= root.end_time_unix_nano,
                "{}",
                span.name
            );
        }
    }
    assert_eq!(root.int_attr("hermes.turn.api_attempts"), Some(2));
    assert_eq!(root.int_attr("hermes.turn.tool_calls"), Some(1));
    assert_eq!(root.bool_attr("hermes.turn.completed"), Some(true));
    let Some(resource) = tree.resource_of(root) else {
        panic!("the root has no resource:\n{}", tree.render());
    };
    assert_eq!(resource.str_attr("service.name"), Some("hermes-agent"));
    assert!(
        resource
            .str_attr("service.instance.id")
            .is_some_and(|s| s.len() == 32)
    );
}

/// Runs the basic turn in `home` against the collector at `endpoint`:
/// Hermes must succeed and print the tool's result. Returns its output and
/// the session id it printed.
pub fn run(home: &HermesHome, endpoint: &str) -> (Output, String) {
    let out = home.run_chat(
        "Please run echo hermes-e2e",
        &[("HERMES_COLLECTOR_ENDPOINT", endpoint)],
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
    let session = crate::rig::session_id(&out);
    (out, session)
}
