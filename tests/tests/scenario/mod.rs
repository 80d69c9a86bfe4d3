//! What the e2e scenarios share: running a scenario on an [`AgentRig`]
//! (`hermes chat`, a Python snippet, collecting the tree) and the checks of
//! the span model every scenario applies (common attributes, turn, chat
//! attempt and tool spans).
//!
//! Two test files include it (`e2e_scenarios.rs`, `e2e_failures.rs`), each
//! using part of it.

#![allow(dead_code)]

use hermes_e2e::hermes::PY_AGENT_PRELUDE;
use hermes_e2e::rig::{AgentRig, SETTLE, WAIT, session_id};
use hermes_e2e::{AttrsExt, DEFAULT_HERMES_VERSION, SpanExt, SpanTree};
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use serde_json::Value;
use std::process::Output;

// ---------------------------------------------------------------------------
// Harness for one scenario
// ---------------------------------------------------------------------------

/// One `hermes chat -q` run: its output and the session id it printed.
pub struct ChatRun {
    pub out: Output,
    pub session: String,
}

impl ChatRun {
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.stdout).into_owned()
    }

    pub fn describe(&self) -> String {
        format!(
            "status {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.out.status,
            self.stdout(),
            String::from_utf8_lossy(&self.out.stderr)
        )
    }
}

/// The rig of a scenario: the default Hermes with the shim enabled.
pub fn scenario(script: Value) -> AgentRig {
    AgentRig::start_enabled(script, DEFAULT_HERMES_VERSION)
}

/// What the scenarios do with their [`AgentRig`].
pub trait Scenario {
    fn model(&self) -> &str;
    fn chat(&self, query: &str, toolsets: &str, args: &[&str]) -> ChatRun;
    fn python(&self, body: &str, extra_env: &[(&str, &str)]) -> Value;
    fn collect(&mut self, roots: usize, spans: usize) -> SpanTree;
    fn collect_turn(&mut self, spans: usize, session: &str, exp: &TurnExpect) -> OneTurn;
}

/// The tree of a one-turn scenario, checked by [`assert_one_turn`], with
/// the model it ran against and the turn's id.
pub struct OneTurn {
    pub tree: SpanTree,
    pub model: String,
    pub tid: String,
}

impl Scenario for AgentRig {
    fn model(&self) -> &str {
        self.server.model()
    }

    /// `hermes chat -q QUERY -Q -t TOOLSETS ARGS…`; returns the output and
    /// the printed session id, whatever the exit status.
    fn chat(&self, query: &str, toolsets: &str, args: &[&str]) -> ChatRun {
        let out = self
            .home
            .run_chat_with(query, toolsets, args, &self.env(&[]));
        let session = session_id(&out);
        ChatRun { out, session }
    }

    /// Runs `PY_AGENT_PRELUDE` + `body` with the venv's Python (must exit 0)
    /// and returns the JSON object the snippet printed on its `E2E ` line.
    fn python(&self, body: &str, extra_env: &[(&str, &str)]) -> Value {
        let code = format!("{PY_AGENT_PRELUDE}\nimport json\n{body}");
        let out = self.home.run_python(&code, &self.env(extra_env));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "python snippet failed: {}\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}\n--- requests ---\n{}",
            out.status,
            self.server.describe_requests()
        );
        stdout
            .lines()
            .find_map(|l| l.strip_prefix("E2E "))
            .map(|l| serde_json::from_str(l).expect("E2E line is JSON"))
            .unwrap_or_else(|| panic!("no E2E line:\n{stdout}\n{stderr}"))
    }

    /// Waits (bounded) until `roots` root spans and at least `spans` spans
    /// arrived, lets a late extra span arrive, checks that exactly those
    /// arrived, prints and returns the tree.
    ///
    /// If they do not arrive in time, stops the collector (which closes
    /// every open span as incomplete and exports it) and panics showing
    /// the tree it then exported: the trace was not complete when the agent
    /// was done.
    fn collect(&mut self, roots: usize, spans: usize) -> SpanTree {
        let arrived = self.wait_for(|received| {
            received.len() >= spans && received.iter().filter(|(_, s)| s.is_root()).count() >= roots
        });
        if !arrived {
            let partial = self.receiver.store().tree();
            self.collector.guard.terminate(WAIT);
            std::thread::sleep(SETTLE);
            let tree = self.receiver.store().tree();
            panic!(
                "expected {roots} root(s) and {spans} spans within {WAIT:?} after the agent finished; \
                 got {} span(s):\n{}\n--- after stopping the collector (open state flushed as incomplete) ---\n{}\
                 {}",
                partial.len(),
                partial.render(),
                tree.render(),
                self.report()
            );
        }
        let tree = self.settled_tree();
        assert_eq!(tree.len(), spans, "{}", tree.render());
        assert_eq!(tree.roots().len(), roots, "{}", tree.render());
        if let Some(dir) = std::env::var_os("HERMES_E2E_TREES_DIR") {
            // For docs/TRACE_MODEL.md: the scenario's tree, compact.
            let name = std::thread::current()
                .name()
                .unwrap_or("scenario")
                .replace("::", "_");
            let path = std::path::Path::new(&dir).join(format!("{name}.txt"));
            let _ = std::fs::write(path, compact(&tree));
        }
        tree
    }

    /// [`collect`](Self::collect) of one root and `spans` spans, checked as
    /// one turn of `session` that `exp` describes ([`assert_one_turn`]).
    fn collect_turn(&mut self, spans: usize, session: &str, exp: &TurnExpect) -> OneTurn {
        let tree = self.collect(1, spans);
        let model = self.model().to_string();
        let (_, tid) = assert_one_turn(&tree, session, &model, exp);
        OneTurn { tree, model, tid }
    }
}

/// A compact rendering of a tree: names, kinds, statuses and the telling
/// attributes, children in start order; no ids or times.
pub fn compact(tree: &SpanTree) -> String {
    fn walk(tree: &SpanTree, span: &Span, depth: usize, out: &mut String) {
        const KEYS: [&str; 12] = [
            "hermes.attempt",
            "error.type",
            "http.response.status_code",
            "gen_ai.usage.input_tokens",
            "gen_ai.usage.output_tokens",
            "gen_ai.tool.call.id",
            "hermes.tool.status",
            "hermes.approval.choice",
            "hermes.subagent.status",
            "hermes.turn.api_attempts",
            "hermes.turn.tool_calls",
            "hermes.incomplete",
        ];
        let attrs = span.attr_map();
        let notes: Vec<String> = KEYS
            .iter()
            .filter_map(|k| {
                attrs
                    .get(*k)
                    .map(|v| format!("{}={v}", k.rsplit('.').next().unwrap_or(k)))
            })
            .collect();
        let status = if span.status_code() == StatusCode::Error {
            " ERROR"
        } else {
            ""
        };
        let events: Vec<&str> = span.events.iter().map(|e| e.name.as_str()).collect();
        let events = if events.is_empty() {
            String::new()
        } else {
            format!(" events=[{}]", events.join(","))
        };
        out.push_str(&format!(
            "{}{}{status}  {}{events}\n",
            "  ".repeat(depth),
            span.name,
            notes.join(" ")
        ));
        let mut children = tree.children(span);
        children.sort_by_key(|c| c.start_time_unix_nano);
        for child in children {
            walk(tree, child, depth + 1, out);
        }
    }
    let mut out = String::new();
    let mut roots = tree.roots();
    roots.sort_by_key(|r| r.start_time_unix_nano);
    for root in roots {
        walk(tree, root, 0, &mut out);
    }
    out
}

// ---------------------------------------------------------------------------
// Assertions shared by the scenarios
// ---------------------------------------------------------------------------

/// Well formed (no orphan, children inside their parent, valid ids), and
/// every span carries the attributes TRACE_MODEL.md puts on every span,
/// with `session.id` = `gen_ai.conversation.id` = the top-level session.
pub fn assert_common(tree: &SpanTree, session: &str) {
    tree.assert_well_formed();
    for s in tree.spans() {
        let ctx = || format!("{}\n{}", s.name, tree.render());
        s.assert_str_attrs(
            &[("session.id", session), ("gen_ai.conversation.id", session)],
            ctx,
        );
        for key in ["hermes.turn_id", "hermes.task_id", "gen_ai.agent.name"] {
            assert!(
                s.str_attr(key).is_some_and(|v| !v.is_empty()),
                "{key} lacking on {}",
                ctx()
            );
        }
    }
}

/// What a turn span (`invoke_agent …`) must say.
pub struct TurnExpect {
    /// `error.type` of a turn that failed (status ERROR).
    pub failed_with: Option<&'static str>,
    pub completed: Option<bool>,
    pub interrupted: Option<bool>,
    pub api_attempts: i64,
    pub tool_calls: i64,
    pub usage: (i64, i64),
    pub session_start: bool,
    pub incomplete: bool,
}

impl TurnExpect {
    /// A turn that completed normally.
    pub fn completed(api_attempts: i64, tool_calls: i64, usage: (i64, i64)) -> TurnExpect {
        TurnExpect {
            failed_with: None,
            completed: Some(true),
            interrupted: Some(false),
            api_attempts,
            tool_calls,
            usage,
            session_start: false,
            incomplete: false,
        }
    }

    /// The first turn of a session that failed with `error_type` after
    /// `api_attempts` attempts without a usage. Hermes fires no
    /// `on_session_end` on its failure paths, so neither completed nor
    /// interrupted is known, and whatever closed the turn (the host's
    /// `on_session_finalize`, the next turn) closed it as incomplete.
    pub fn failed(error_type: &'static str, api_attempts: i64) -> TurnExpect {
        TurnExpect {
            failed_with: Some(error_type),
            completed: None,
            interrupted: None,
            api_attempts,
            tool_calls: 0,
            usage: (0, 0),
            session_start: true,
            incomplete: true,
        }
    }

    pub fn first_of_session(mut self) -> TurnExpect {
        self.session_start = true;
        self
    }
}

/// The top-level agent's turn span: `invoke_agent hermes`.
pub const TOP_TURN: &str = "invoke_agent hermes";

pub fn assert_turn(tree: &SpanTree, turn: &Span, name: &str, model: &str, exp: &TurnExpect) {
    let ctx = || format!("{name}\n{}", tree.render());
    assert_eq!(turn.name, name, "{}", ctx());
    assert_eq!(turn.kind(), SpanKind::Internal, "{}", ctx());
    turn.assert_str_attrs(
        &[
            ("gen_ai.operation.name", "invoke_agent"),
            ("gen_ai.request.model", model),
        ],
        ctx,
    );
    for (key, expected) in [
        ("hermes.turn.completed", exp.completed),
        ("hermes.turn.interrupted", exp.interrupted),
    ] {
        assert_eq!(turn.bool_attr(key), expected, "{key} of {}", ctx());
    }
    turn.assert_int_attrs(
        &[
            ("hermes.turn.api_attempts", exp.api_attempts),
            ("hermes.turn.tool_calls", exp.tool_calls),
            ("hermes.turn.usage.input_tokens", exp.usage.0),
            ("hermes.turn.usage.output_tokens", exp.usage.1),
        ],
        ctx,
    );
    assert!(
        !turn
            .attributes
            .iter()
            .any(|kv| kv.key.starts_with("gen_ai.usage.")),
        "no gen_ai.usage.* on a turn: {}",
        ctx()
    );
    assert_eq!(
        turn.bool_attr("hermes.incomplete").unwrap_or(false),
        exp.incomplete,
        "hermes.incomplete of {}",
        ctx()
    );
    assert_eq!(
        turn.events_named("hermes.session.start").len(),
        usize::from(exp.session_start),
        "hermes.session.start event on {}",
        ctx()
    );
    let should_fail = exp.failed_with.is_some()
        || (exp.completed == Some(false) && exp.interrupted != Some(true));
    assert_eq!(
        turn.status_code() == StatusCode::Error,
        should_fail,
        "status of {}",
        ctx()
    );
    if let Some(error_type) = exp.failed_with {
        turn.assert_str_attrs(&[("error.type", error_type)], ctx);
    }
}

/// A `chat {model}` attempt.
pub struct ChatExpect<'a> {
    pub model: &'a str,
    pub port: u16,
    pub turn_id: &'a str,
    pub api_call: i64,
    pub attempt: i64,
    pub usage: (i64, i64),
    pub finish: &'a str,
}

impl<'a> ChatExpect<'a> {
    /// First (only) attempt of API call `api_call`.
    pub fn first(
        model: &'a str,
        port: u16,
        turn_id: &'a str,
        api_call: i64,
        usage: (i64, i64),
        finish: &'a str,
    ) -> ChatExpect<'a> {
        ChatExpect {
            model,
            port,
            turn_id,
            api_call,
            attempt: 1,
            usage,
            finish,
        }
    }

    /// The same API call's attempt `attempt`.
    pub fn attempt(self, attempt: i64) -> ChatExpect<'a> {
        ChatExpect { attempt, ..self }
    }
}

pub fn assert_chat_ok(tree: &SpanTree, chat: &Span, exp: &ChatExpect<'_>) {
    assert_chat_common(tree, chat, exp);
    let ctx = || format!("{} attempt {}\n{}", chat.name, exp.attempt, tree.render());
    assert_ne!(chat.status_code(), StatusCode::Error, "{}", ctx());
    chat.assert_str_attrs(&[("gen_ai.response.model", exp.model)], ctx);
    assert_eq!(
        chat.str_array_attr("gen_ai.response.finish_reasons"),
        Some(vec![exp.finish.to_string()]),
        "{}",
        ctx()
    );
    chat.assert_int_attrs(
        &[
            ("gen_ai.usage.input_tokens", exp.usage.0),
            ("gen_ai.usage.output_tokens", exp.usage.1),
        ],
        ctx,
    );
    assert!(!chat.has_attr("error.type"), "{}", ctx());
    assert!(chat.events_named("exception").is_empty(), "{}", ctx());
    assert!(!chat.has_attr("hermes.incomplete"), "{}", ctx());
}

/// What a failed attempt must say.
pub struct ChatError<'a> {
    pub error_type: &'a str,
    pub status_code: i64,
    pub retryable: bool,
    pub exception_type: &'a str,
    pub message_contains: &'a str,
}

/// The fake server's scripted 400 (`"message": BAD_REQUEST_MESSAGE`):
/// not retried.
pub const BAD_REQUEST: ChatError<'static> = ChatError {
    error_type: "format_error",
    status_code: 400,
    retryable: false,
    exception_type: "BadRequestError",
    message_contains: BAD_REQUEST_MESSAGE,
};
pub const BAD_REQUEST_MESSAGE: &str = "bad request from the e2e test";

/// The fake server's scripted 429: retried.
pub const RATE_LIMITED: ChatError<'static> = ChatError {
    error_type: "rate_limit",
    status_code: 429,
    retryable: true,
    exception_type: "RateLimitError",
    message_contains: "fake_openai scripted error 429",
};

pub fn assert_chat_error(tree: &SpanTree, chat: &Span, base: &ChatExpect<'_>, err: &ChatError<'_>) {
    assert_chat_common(tree, chat, base);
    let ctx = || format!("{} attempt {}\n{}", chat.name, base.attempt, tree.render());
    assert_eq!(chat.status_code(), StatusCode::Error, "{}", ctx());
    chat.assert_str_attrs(&[("error.type", err.error_type)], ctx);
    chat.assert_int_attrs(
        &[
            ("http.response.status_code", err.status_code),
            ("hermes.retry_count", base.attempt - 1),
        ],
        ctx,
    );
    assert_eq!(
        chat.bool_attr("hermes.retryable"),
        Some(err.retryable),
        "{}",
        ctx()
    );
    let events = chat.events_named("exception");
    assert_eq!(events.len(), 1, "one exception event: {}", ctx());
    events[0].assert_str_attrs(&[("exception.type", err.exception_type)], ctx);
    assert!(
        events[0]
            .str_attr("exception.message")
            .is_some_and(|m| m.contains(err.message_contains)),
        "{}",
        ctx()
    );
    assert!(
        !chat.has_attr("gen_ai.usage.input_tokens"),
        "no usage on a failed attempt: {}",
        ctx()
    );
}

/// What every attempt says, failed, successful or cut off.
pub fn assert_chat_common(tree: &SpanTree, chat: &Span, exp: &ChatExpect<'_>) {
    let ctx = || format!("{} attempt {}\n{}", chat.name, exp.attempt, tree.render());
    assert_eq!(chat.name, format!("chat {}", exp.model), "{}", ctx());
    assert_eq!(chat.kind(), SpanKind::Client, "{}", ctx());
    let request_id = format!("{}:api:{}", exp.turn_id, exp.api_call);
    chat.assert_str_attrs(
        &[
            ("gen_ai.operation.name", "chat"),
            ("gen_ai.provider.name", "custom"),
            ("gen_ai.request.model", exp.model),
            ("server.address", "127.0.0.1"),
            ("hermes.turn_id", exp.turn_id),
            ("hermes.api_request_id", &request_id),
        ],
        ctx,
    );
    chat.assert_int_attrs(
        &[
            ("server.port", i64::from(exp.port)),
            ("hermes.api_call_count", exp.api_call),
            ("hermes.attempt", exp.attempt),
        ],
        ctx,
    );
}

/// A successful `execute_tool {name}` span.
pub fn assert_tool(tree: &SpanTree, tool: &Span, name: &str, call_id: &str, turn_id: &str) {
    let ctx = || format!("{} {call_id}\n{}", tool.name, tree.render());
    assert_eq!(tool.name, format!("execute_tool {name}"), "{}", ctx());
    assert_eq!(tool.kind(), SpanKind::Internal, "{}", ctx());
    tool.assert_str_attrs(
        &[
            ("gen_ai.operation.name", "execute_tool"),
            ("gen_ai.tool.name", name),
            ("gen_ai.tool.call.id", call_id),
            ("gen_ai.tool.type", "function"),
            ("hermes.tool.status", "ok"),
            ("hermes.turn_id", turn_id),
        ],
        ctx,
    );
    assert!(
        tool.int_attr("hermes.tool.duration_ms")
            .is_some_and(|d| d >= 0),
        "{}",
        ctx()
    );
    assert_ne!(tool.status_code(), StatusCode::Error, "{}", ctx());
    assert!(!tool.has_attr("hermes.incomplete"), "{}", ctx());
}

/// The checks of a one-turn scenario: the attributes on every span, with
/// `session`; one root, the top-level turn `exp` describes. Returns the
/// turn and its id.
pub fn assert_one_turn<'t>(
    tree: &'t SpanTree,
    session: &str,
    model: &str,
    exp: &TurnExpect,
) -> (&'t Span, String) {
    assert_common(tree, session);
    let root = only_root(tree);
    assert_turn(tree, root, TOP_TURN, model, exp);
    (root, turn_id(root))
}

/// Checks `turn` as the top-level turn `exp` describes, with one child: a
/// chat span. Returns the chat and the turn's id.
pub fn assert_top_turn_with_one_chat<'t>(
    tree: &'t SpanTree,
    turn: &Span,
    model: &str,
    exp: &TurnExpect,
) -> (&'t Span, String) {
    assert_turn(tree, turn, TOP_TURN, model, exp);
    (tree.expect_children(turn, 1)[0], turn_id(turn))
}

/// The only root of the tree (panics otherwise).
pub fn only_root(tree: &SpanTree) -> &Span {
    let roots = tree.roots();
    assert_eq!(roots.len(), 1, "exactly one root:\n{}", tree.render());
    assert_eq!(tree.trace_ids().len(), 1, "one trace:\n{}", tree.render());
    roots[0]
}

/// The children of `span`, by start time, as their names.
pub fn child_names(tree: &SpanTree, span: &Span) -> Vec<String> {
    tree.children(span).iter().map(|s| s.name.clone()).collect()
}

pub fn turn_id(span: &Span) -> String {
    span.str_attr("hermes.turn_id")
        .expect("hermes.turn_id")
        .to_string()
}

/// Hermes' session id format: `YYYYMMDD_HHMMSS_6hex`.
pub fn looks_like_session_id(s: &str) -> bool {
    let parts: Vec<&str> = s.split('_').collect();
    matches!(parts.as_slice(), [d, t, h]
        if d.len() == 8 && t.len() == 6 && h.len() == 6
            && d.chars().chain(t.chars()).all(|c| c.is_ascii_digit())
            && h.chars().all(|c| c.is_ascii_hexdigit()))
}
