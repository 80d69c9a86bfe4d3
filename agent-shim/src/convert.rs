//! Conversion of one hook call's kwargs into a `hermes_proto::v1::Event`.
//!
//! Owns: the mapping from Hermes kwargs (see `docs/HERMES_HOOKS.md`) to the
//! typed fields of the wire contract, and what each capture level may carry.
//!
//! Invariants:
//! - Conversion never fails: a missing or mistyped kwarg leaves its field at
//!   the proto default (empty string, 0, unset optional).
//! - `conversation_history`, `request_messages` and `assistant_message` are
//!   never read.
//! - Content (the `content` map, `child_goal`, `child_summary`, `command`) is
//!   filled only at capture level `content`. The `args` kwarg is read only
//!   through [`Kwargs::json`], which for Python sources returns the snapshot
//!   taken on the hook thread.
//! - `ApiCall.attempt` is left at 0 here; [`crate::attempts`] numbers it.
//! - Unknown hook names become [`Body::Other`] with their scalar kwargs.
//!
//! The source of kwargs is abstracted by [`Kwargs`] so the same code converts
//! a Python dict (in the extension) and a JSON object (in tests and replays).

use std::collections::HashMap;

use hermes_proto::hooks;
use hermes_proto::v1::{
    ApiCall, Approval, Event, Ids, Other, Scalar, Session, Subagent, ToolCall, Turn, Usage,
    event::Body, scalar,
};

use crate::clock::secs_to_nanos;
use crate::config::CaptureLevel;

/// Kwargs captured as JSON text into `Event.content` at capture level `content`.
pub const CONTENT_KWARGS: [&str; 6] = [
    "user_message",
    "assistant_response",
    "args",
    "result",
    "request",
    "response",
];

/// Read access to the kwargs of one hook call. `None` values read as absent.
pub trait Kwargs: Sized {
    /// A string value; ints are rendered in decimal.
    fn string(&self, key: &str) -> Option<String>;
    /// A bool value.
    fn boolean(&self, key: &str) -> Option<bool>;
    /// An int value (not a bool).
    fn int(&self, key: &str) -> Option<i64>;
    /// A float or int value.
    fn float(&self, key: &str) -> Option<f64>;
    /// A list of strings (non-string items are skipped).
    fn strings(&self, key: &str) -> Vec<String>;
    /// A nested dict.
    fn map(&self, key: &str) -> Option<Self>;
    /// The value as JSON text.
    fn json(&self, key: &str) -> Option<String>;
    /// Every str/bool/int/float kwarg.
    fn scalars(&self) -> HashMap<String, Scalar>;
}

/// What the hook thread stamped on the call.
#[derive(Clone, Copy, Debug)]
pub struct Stamp<'a> {
    /// Sequence number of the call.
    pub seq: u64,
    /// Hook name.
    pub hook: &'a str,
    /// Wall clock, ns since the epoch.
    pub time_unix_nano: u64,
    /// Monotonic clock, ns.
    pub mono_nano: u64,
    /// Python thread name.
    pub thread: &'a str,
}

/// The `oneof body` family of a hook.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HookFamily {
    /// on_session_start, on_session_finalize, on_session_reset.
    Session,
    /// pre_llm_call, post_llm_call, on_session_end.
    Turn,
    /// pre_api_request, post_api_request, api_request_error.
    Api,
    /// pre_tool_call, post_tool_call.
    Tool,
    /// subagent_start, subagent_stop.
    Subagent,
    /// pre_approval_request, post_approval_response.
    Approval,
    /// Anything else.
    Other,
}

impl HookFamily {
    /// The family of `hook`.
    pub fn of(hook: &str) -> Self {
        match hook {
            hooks::ON_SESSION_START | hooks::ON_SESSION_FINALIZE | hooks::ON_SESSION_RESET => {
                HookFamily::Session
            }
            hooks::PRE_LLM_CALL | hooks::POST_LLM_CALL | hooks::ON_SESSION_END => HookFamily::Turn,
            hooks::PRE_API_REQUEST | hooks::POST_API_REQUEST | hooks::API_REQUEST_ERROR => {
                HookFamily::Api
            }
            hooks::PRE_TOOL_CALL | hooks::POST_TOOL_CALL => HookFamily::Tool,
            hooks::SUBAGENT_START | hooks::SUBAGENT_STOP => HookFamily::Subagent,
            hooks::PRE_APPROVAL_REQUEST | hooks::POST_APPROVAL_RESPONSE => HookFamily::Approval,
            _ => HookFamily::Other,
        }
    }
}

fn s<K: Kwargs>(kw: &K, key: &str) -> String {
    kw.string(key).unwrap_or_default()
}

fn uint<K: Kwargs>(kw: &K, key: &str) -> Option<u64> {
    match kw.int(key) {
        Some(v) => u64::try_from(v).ok(),
        None => kw
            .float(key)
            .filter(|f| f.is_finite() && *f >= 0.0)
            .map(|f| f as u64),
    }
}

fn u32_of<K: Kwargs>(kw: &K, key: &str) -> u32 {
    uint(kw, key).map_or(0, |v| u32::try_from(v).unwrap_or(u32::MAX))
}

fn nanos<K: Kwargs>(kw: &K, key: &str) -> u64 {
    kw.float(key).map_or(0, secs_to_nanos)
}

fn ids<K: Kwargs>(kw: &K) -> Ids {
    Ids {
        session_id: s(kw, "session_id"),
        task_id: s(kw, "task_id"),
        turn_id: s(kw, "turn_id"),
        api_request_id: s(kw, "api_request_id"),
        tool_call_id: s(kw, "tool_call_id"),
        parent_session_id: s(kw, "parent_session_id"),
        parent_turn_id: s(kw, "parent_turn_id"),
        parent_subagent_id: s(kw, "parent_subagent_id"),
        child_session_id: s(kw, "child_session_id"),
        child_subagent_id: s(kw, "child_subagent_id"),
    }
}

fn usage<K: Kwargs>(u: &K) -> Usage {
    let n = |key| uint(u, key).unwrap_or(0);
    Usage {
        input_tokens: n("input_tokens"),
        output_tokens: n("output_tokens"),
        cache_read_tokens: n("cache_read_tokens"),
        cache_write_tokens: n("cache_write_tokens"),
        reasoning_tokens: n("reasoning_tokens"),
        prompt_tokens: n("prompt_tokens"),
        total_tokens: n("total_tokens"),
        request_count: n("request_count"),
    }
}

fn api_call<K: Kwargs>(kw: &K) -> ApiCall {
    let (error_type, error_message) = match kw.map("error") {
        Some(err) => (s(&err, "type"), s(&err, "message")),
        None => (String::new(), s(kw, "error")),
    };
    ApiCall {
        model: s(kw, "model"),
        platform: s(kw, "platform"),
        provider: s(kw, "provider"),
        base_url: s(kw, "base_url"),
        api_mode: s(kw, "api_mode"),
        api_call_count: uint(kw, "api_call_count").unwrap_or(0),
        max_tokens: uint(kw, "max_tokens"),
        started_at_unix_nano: nanos(kw, "started_at"),
        ended_at_unix_nano: nanos(kw, "ended_at"),
        api_duration_nano: nanos(kw, "api_duration"),
        attempt: 0,
        finish_reason: s(kw, "finish_reason"),
        response_model: s(kw, "response_model"),
        usage: kw.map("usage").map(|u| usage(&u)),
        message_count: uint(kw, "message_count").unwrap_or(0),
        tool_count: uint(kw, "tool_count").unwrap_or(0),
        assistant_tool_call_count: uint(kw, "assistant_tool_call_count").unwrap_or(0),
        status_code: kw.int("status_code").and_then(|v| i32::try_from(v).ok()),
        retryable: kw.boolean("retryable"),
        reason: s(kw, "reason"),
        error_type,
        error_message,
        retry_count: u32_of(kw, "retry_count"),
        max_retries: u32_of(kw, "max_retries"),
        approx_input_tokens: uint(kw, "approx_input_tokens").unwrap_or(0),
        request_char_count: uint(kw, "request_char_count").unwrap_or(0),
    }
}

fn body<K: Kwargs>(hook: &str, kw: &K, content: bool) -> Body {
    let content_s = |key| if content { s(kw, key) } else { String::new() };
    match HookFamily::of(hook) {
        HookFamily::Session => Body::Session(Session {
            model: s(kw, "model"),
            platform: s(kw, "platform"),
            reason: s(kw, "reason"),
            old_session_id: s(kw, "old_session_id"),
            new_session_id: s(kw, "new_session_id"),
        }),
        HookFamily::Turn => Body::Turn(Turn {
            model: s(kw, "model"),
            platform: s(kw, "platform"),
            is_first_turn: kw.boolean("is_first_turn"),
            completed: kw.boolean("completed"),
            interrupted: kw.boolean("interrupted"),
            reason: s(kw, "reason"),
            sender_id: s(kw, "sender_id"),
        }),
        HookFamily::Api => Body::Api(Box::new(api_call(kw))),
        HookFamily::Tool => Body::Tool(ToolCall {
            tool_name: s(kw, "tool_name"),
            status: s(kw, "status"),
            duration_ms: uint(kw, "duration_ms"),
            error_type: s(kw, "error_type"),
            error_message: s(kw, "error_message"),
        }),
        HookFamily::Subagent => Body::Subagent(Subagent {
            child_role: s(kw, "child_role"),
            child_status: s(kw, "child_status"),
            duration_ms: uint(kw, "duration_ms"),
            child_goal: content_s("child_goal"),
            child_summary: content_s("child_summary"),
        }),
        HookFamily::Approval => Body::Approval(Box::new(Approval {
            pattern_key: s(kw, "pattern_key"),
            pattern_keys: kw.strings("pattern_keys"),
            surface: s(kw, "surface"),
            choice: s(kw, "choice"),
            decided_by: s(kw, "decided_by"),
            session_key: s(kw, "session_key"),
            command: content_s("command"),
            description: s(kw, "description"),
        })),
        HookFamily::Other => Body::Other(Other {
            fields: kw.scalars(),
        }),
    }
}

/// Converts one hook call.
pub fn to_event<K: Kwargs>(stamp: &Stamp<'_>, kw: &K, capture: CaptureLevel) -> Event {
    let content_on = capture.captures_content();
    let mut content = HashMap::new();
    if content_on {
        for key in CONTENT_KWARGS {
            if let Some(text) = kw.json(key) {
                content.insert(key.to_owned(), text);
            }
        }
    }
    Event {
        seq: stamp.seq,
        hook: stamp.hook.to_owned(),
        schema_version: s(kw, "telemetry_schema_version"),
        time_unix_nano: stamp.time_unix_nano,
        mono_nano: stamp.mono_nano,
        thread: stamp.thread.to_owned(),
        ids: Some(Box::new(ids(kw))),
        body: Some(body(stamp.hook, kw, content_on)),
        content,
    }
}

/// [`Kwargs`] over a JSON object (fixtures, replays, tests).
#[derive(Clone, Copy, Debug)]
pub struct JsonKwargs<'a>(pub &'a serde_json::Map<String, serde_json::Value>);

impl<'a> JsonKwargs<'a> {
    fn get(&self, key: &str) -> Option<&'a serde_json::Value> {
        self.0.get(key).filter(|v| !v.is_null())
    }
}

impl Kwargs for JsonKwargs<'_> {
    fn string(&self, key: &str) -> Option<String> {
        match self.get(key)? {
            serde_json::Value::String(v) => Some(v.clone()),
            serde_json::Value::Number(n) if n.is_i64() || n.is_u64() => Some(n.to_string()),
            _ => None,
        }
    }

    fn boolean(&self, key: &str) -> Option<bool> {
        self.get(key)?.as_bool()
    }

    fn int(&self, key: &str) -> Option<i64> {
        self.get(key)?.as_i64()
    }

    fn float(&self, key: &str) -> Option<f64> {
        self.get(key)?.as_f64()
    }

    fn strings(&self, key: &str) -> Vec<String> {
        match self.get(key) {
            Some(serde_json::Value::Array(items)) => items
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect(),
            _ => Vec::new(),
        }
    }

    fn map(&self, key: &str) -> Option<Self> {
        self.get(key)?.as_object().map(JsonKwargs)
    }

    fn json(&self, key: &str) -> Option<String> {
        self.get(key).map(|v| v.to_string())
    }

    fn scalars(&self) -> HashMap<String, Scalar> {
        self.0
            .iter()
            .filter_map(|(k, v)| {
                let value = match v {
                    serde_json::Value::String(s) => scalar::Value::StringValue(s.clone()),
                    serde_json::Value::Bool(b) => scalar::Value::BoolValue(*b),
                    serde_json::Value::Number(n) => match n.as_i64() {
                        Some(i) => scalar::Value::IntValue(i),
                        None => scalar::Value::DoubleValue(n.as_f64()?),
                    },
                    _ => return None,
                };
                Some((k.clone(), Scalar { value: Some(value) }))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attempts::AttemptTracker;
    use serde_json::{Value, json};
    use std::path::PathBuf;

    /// One recorded hook call of the fixtures.
    struct Call {
        hook: String,
        t_wall: f64,
        t_mono: f64,
        thread: String,
        kwargs: serde_json::Map<String, Value>,
    }

    fn fixtures_dir() -> PathBuf {
        match std::env::var_os("HERMES_FIXTURES_DIR") {
            Some(dir) => PathBuf::from(dir),
            None => {
                PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/hermes-0.19.0")
            }
        }
    }

    fn load(name: &str) -> Vec<Call> {
        let path = fixtures_dir().join(name);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()));
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|line| {
                let v: Value = serde_json::from_str(line).unwrap();
                Call {
                    hook: v["hook"].as_str().unwrap().to_owned(),
                    t_wall: v["t_wall"].as_f64().unwrap(),
                    t_mono: v["t_mono"].as_f64().unwrap(),
                    thread: v["thread"].as_str().unwrap().to_owned(),
                    kwargs: v["kwargs"].as_object().unwrap().clone(),
                }
            })
            .collect()
    }

    /// Converts a fixture as the sender would: registered hooks only, seq
    /// order, attempts numbered.
    fn convert_all(calls: &[Call], capture: CaptureLevel) -> Vec<Event> {
        let mut tracker = AttemptTracker::default();
        calls
            .iter()
            .filter(|c| capture.hooks().contains(&c.hook.as_str()))
            .enumerate()
            .map(|(i, c)| {
                let stamp = Stamp {
                    seq: i as u64 + 1,
                    hook: &c.hook,
                    time_unix_nano: secs_to_nanos(c.t_wall),
                    mono_nano: secs_to_nanos(c.t_mono),
                    thread: &c.thread,
                };
                let mut event = to_event(&stamp, &JsonKwargs(&c.kwargs), capture);
                tracker.stamp(&mut event);
                event
            })
            .collect()
    }

    fn api(e: &Event) -> &ApiCall {
        match e.body.as_ref() {
            Some(Body::Api(a)) => a,
            other => panic!("not an api body: {other:?}"),
        }
    }

    const FIXTURES: [&str; 4] = [
        "basic.jsonl",
        "multiturn.jsonl",
        "parallel.jsonl",
        "retry.jsonl",
    ];

    #[test]
    fn every_fixture_hook_kind_converts() {
        let mut seen = std::collections::BTreeSet::new();
        for name in FIXTURES {
            let calls = load(name);
            for capture in [
                CaptureLevel::Lean,
                CaptureLevel::Metadata,
                CaptureLevel::Content,
            ] {
                let events = convert_all(&calls, capture);
                for (e, c) in events.iter().zip(
                    calls
                        .iter()
                        .filter(|c| capture.hooks().contains(&c.hook.as_str())),
                ) {
                    seen.insert(e.hook.clone());
                    assert_eq!(e.hook, c.hook);
                    assert_eq!(e.schema_version, "hermes.observer.v1");
                    assert_eq!(e.thread, c.thread);
                    assert!(e.time_unix_nano > 1_700_000_000_000_000_000);
                    let ids = e.ids.as_ref().unwrap();
                    assert_eq!(
                        ids.session_id,
                        c.kwargs["session_id"].as_str().unwrap_or("")
                    );
                    let family = HookFamily::of(&e.hook);
                    let body_family = match e.body.as_ref().unwrap() {
                        Body::Session(_) => HookFamily::Session,
                        Body::Turn(_) => HookFamily::Turn,
                        Body::Api(_) => HookFamily::Api,
                        Body::Tool(_) => HookFamily::Tool,
                        Body::Subagent(_) => HookFamily::Subagent,
                        Body::Approval(_) => HookFamily::Approval,
                        Body::Other(_) => HookFamily::Other,
                    };
                    assert_eq!(family, body_family, "{}", e.hook);
                    assert_ne!(family, HookFamily::Other, "{} is a known hook", e.hook);
                    if capture.captures_content() {
                        for key in CONTENT_KWARGS {
                            if c.kwargs.get(key).is_some_and(|v| !v.is_null()) {
                                let text = &e.content[key];
                                let back: Value = serde_json::from_str(text).unwrap();
                                assert_eq!(back, c.kwargs[key], "{}.{key}", e.hook);
                            }
                        }
                        for banned in [
                            "conversation_history",
                            "request_messages",
                            "assistant_message",
                        ] {
                            assert!(!e.content.contains_key(banned));
                        }
                    } else {
                        assert!(e.content.is_empty(), "no content at {capture:?}");
                    }
                }
            }
        }
        for hook in [
            "on_session_start",
            "pre_llm_call",
            "pre_api_request",
            "post_api_request",
            "api_request_error",
            "pre_tool_call",
            "post_tool_call",
            "post_llm_call",
            "on_session_end",
            "on_session_finalize",
        ] {
            assert!(seen.contains(hook), "fixtures cover {hook}");
        }
    }

    #[test]
    fn post_api_request_fields() {
        let calls = load("basic.jsonl");
        let events = convert_all(&calls, CaptureLevel::Metadata);
        let post = events
            .iter()
            .find(|e| e.hook == "post_api_request")
            .unwrap();
        let a = api(post);
        assert_eq!(a.model, "fake-model-1");
        assert_eq!(a.platform, "cli");
        assert_eq!(a.provider, "custom");
        assert_eq!(a.api_mode, "chat_completions");
        assert_eq!(a.api_call_count, 1);
        assert_eq!(a.attempt, 1);
        assert_eq!(a.finish_reason, "tool_calls");
        assert_eq!(a.response_model, "fake-model-1");
        assert_eq!(a.message_count, 2);
        assert_eq!(a.assistant_tool_call_count, 1);
        assert_eq!(a.api_duration_nano, secs_to_nanos(0.30072474479675293));
        assert_eq!(a.started_at_unix_nano, secs_to_nanos(1795982552.9198372));
        assert_eq!(a.ended_at_unix_nano, secs_to_nanos(1795982553.220562));
        let u = a.usage.as_ref().unwrap();
        assert_eq!(u.input_tokens, 1204);
        assert_eq!(u.output_tokens, 17);
        assert!(u.prompt_tokens >= u.input_tokens);
        assert_eq!(u.total_tokens, u.prompt_tokens + u.output_tokens);
        assert_eq!(a.status_code, None);

        let pre = events.iter().find(|e| e.hook == "pre_api_request").unwrap();
        let p = api(pre);
        assert_eq!(p.max_tokens, None);
        assert_eq!(p.tool_count, 2);
        assert_eq!(p.approx_input_tokens, 1208);
        assert_eq!(p.request_char_count, 4832);
        assert_eq!(p.attempt, 1);
    }

    #[test]
    fn retry_attempts_and_errors() {
        let calls = load("retry.jsonl");
        let events = convert_all(&calls, CaptureLevel::Metadata);
        let api_events: Vec<(&str, String, u32)> = events
            .iter()
            .filter(|e| HookFamily::of(&e.hook) == HookFamily::Api)
            .map(|e| {
                let id = e.ids.as_ref().unwrap().api_request_id.clone();
                (
                    e.hook.as_str(),
                    id.rsplit(':').next().unwrap_or("").to_owned(),
                    api(e).attempt,
                )
            })
            .collect();
        let expect = [
            ("pre_api_request", "1", 1),
            ("api_request_error", "1", 1),
            ("pre_api_request", "1", 2),
            ("post_api_request", "1", 2),
            ("pre_api_request", "2", 1),
            ("api_request_error", "2", 1),
            ("pre_api_request", "2", 2),
            ("post_api_request", "2", 2),
        ];
        let got: Vec<(&str, &str, u32)> = api_events
            .iter()
            .map(|(h, n, a)| (*h, n.as_str(), *a))
            .collect();
        assert_eq!(got, expect);

        let err = events
            .iter()
            .find(|e| e.hook == "api_request_error")
            .unwrap();
        let a = api(err);
        assert_eq!(a.status_code, Some(500));
        assert_eq!(a.retryable, Some(true));
        assert_eq!(a.reason, "server_error");
        assert_eq!(a.error_type, "InternalServerError");
        assert!(a.error_message.starts_with("Error code: 500"));
        assert_eq!(a.retry_count, 0);
        assert_eq!(a.max_retries, 3);

        // Lean: no pre_api_request; the error and the post are attempts 1 and 2.
        let lean = convert_all(&calls, CaptureLevel::Lean);
        let attempts: Vec<(String, u32)> = lean
            .iter()
            .filter(|e| HookFamily::of(&e.hook) == HookFamily::Api)
            .map(|e| (e.hook.clone(), api(e).attempt))
            .collect();
        assert_eq!(
            attempts,
            [
                ("api_request_error".to_owned(), 1),
                ("post_api_request".to_owned(), 2),
                ("api_request_error".to_owned(), 1),
                ("post_api_request".to_owned(), 2),
            ]
        );
    }

    #[test]
    fn tool_turn_session_fields() {
        let calls = load("parallel.jsonl");
        let events = convert_all(&calls, CaptureLevel::Metadata);
        let posts: Vec<&Event> = events
            .iter()
            .filter(|e| e.hook == "post_tool_call")
            .collect();
        assert_eq!(posts.len(), 2);
        assert!(
            posts
                .iter()
                .all(|e| e.thread.starts_with("ThreadPoolExecutor"))
        );
        for e in &posts {
            let Some(Body::Tool(t)) = e.body.as_ref() else {
                panic!()
            };
            assert_eq!(t.tool_name, "read_file");
            assert_eq!(t.status, "ok");
            assert!(t.duration_ms.is_some());
            assert_eq!(t.error_type, "");
            assert!(!e.ids.as_ref().unwrap().tool_call_id.is_empty());
        }
        let pre_llm = events.iter().find(|e| e.hook == "pre_llm_call").unwrap();
        let Some(Body::Turn(t)) = pre_llm.body.as_ref() else {
            panic!()
        };
        assert_eq!(t.is_first_turn, Some(true));
        assert_eq!(t.completed, None);
        let end = events.iter().find(|e| e.hook == "on_session_end").unwrap();
        let Some(Body::Turn(t)) = end.body.as_ref() else {
            panic!()
        };
        assert_eq!(t.completed, Some(true));
        assert_eq!(t.interrupted, Some(false));
        let fin = events
            .iter()
            .find(|e| e.hook == "on_session_finalize")
            .unwrap();
        let Some(Body::Session(s)) = fin.body.as_ref() else {
            panic!()
        };
        assert_eq!(s.reason, "shutdown");
        assert_eq!(s.platform, "cli");
    }

    fn convert_one(hook: &str, kwargs: Value, capture: CaptureLevel) -> Event {
        let map = kwargs.as_object().unwrap().clone();
        let stamp = Stamp {
            seq: 1,
            hook,
            time_unix_nano: 1,
            mono_nano: 2,
            thread: "MainThread",
        };
        to_event(&stamp, &JsonKwargs(&map), capture)
    }

    #[test]
    fn subagent_content_only_at_content() {
        let kwargs = json!({
            "parent_session_id": "p", "parent_turn_id": "pt", "parent_subagent_id": null,
            "child_session_id": "c", "child_subagent_id": "sa-1", "child_role": "worker",
            "child_goal": "find the bug", "telemetry_schema_version": "hermes.observer.v1"
        });
        let e = convert_one("subagent_start", kwargs.clone(), CaptureLevel::Metadata);
        let ids = e.ids.as_ref().unwrap();
        assert_eq!(
            (
                ids.parent_session_id.as_str(),
                ids.child_subagent_id.as_str()
            ),
            ("p", "sa-1")
        );
        assert_eq!(ids.parent_subagent_id, "");
        let Some(Body::Subagent(s)) = e.body.as_ref() else {
            panic!()
        };
        assert_eq!(s.child_role, "worker");
        assert_eq!(s.child_goal, "");
        let e = convert_one("subagent_start", kwargs, CaptureLevel::Content);
        let Some(Body::Subagent(s)) = e.body.as_ref() else {
            panic!()
        };
        assert_eq!(s.child_goal, "find the bug");

        let stop = json!({"parent_session_id": "p", "child_session_id": "c", "child_role": "worker",
            "child_summary": "fixed", "child_status": "completed", "duration_ms": 1234});
        let e = convert_one("subagent_stop", stop.clone(), CaptureLevel::Lean);
        let Some(Body::Subagent(s)) = e.body.as_ref() else {
            panic!()
        };
        assert_eq!(
            (
                s.child_status.as_str(),
                s.duration_ms,
                s.child_summary.as_str()
            ),
            ("completed", Some(1234), "")
        );
        let e = convert_one("subagent_stop", stop, CaptureLevel::Content);
        let Some(Body::Subagent(s)) = e.body.as_ref() else {
            panic!()
        };
        assert_eq!(s.child_summary, "fixed");
    }

    #[test]
    fn approval_and_reset() {
        let kwargs = json!({"command": "rm -rf /tmp/x", "description": "recursive delete",
            "pattern_key": "rm_rf", "pattern_keys": ["rm_rf", 3, "other"], "session_key": "k",
            "surface": "cli", "turn_id": "t", "tool_call_id": "call_1", "choice": "once"});
        let e = convert_one(
            "post_approval_response",
            kwargs.clone(),
            CaptureLevel::Metadata,
        );
        let Some(Body::Approval(a)) = e.body.as_ref() else {
            panic!()
        };
        assert_eq!(a.pattern_keys, ["rm_rf", "other"]);
        assert_eq!(
            (a.surface.as_str(), a.choice.as_str(), a.command.as_str()),
            ("cli", "once", "")
        );
        assert_eq!(a.description, "recursive delete");
        assert_eq!(e.ids.as_ref().unwrap().tool_call_id, "call_1");
        let e = convert_one("pre_approval_request", kwargs, CaptureLevel::Content);
        let Some(Body::Approval(a)) = e.body.as_ref() else {
            panic!()
        };
        assert_eq!(a.command, "rm -rf /tmp/x");

        let e = convert_one(
            "on_session_reset",
            json!({"session_id": "s1", "platform": "cli", "reason": "new_session",
                   "old_session_id": "s1", "new_session_id": "s2"}),
            CaptureLevel::Metadata,
        );
        let Some(Body::Session(s)) = e.body.as_ref() else {
            panic!()
        };
        assert_eq!(
            (
                s.old_session_id.as_str(),
                s.new_session_id.as_str(),
                s.reason.as_str()
            ),
            ("s1", "s2", "new_session")
        );
    }

    #[test]
    fn unknown_hook_goes_to_other_with_scalars() {
        let e = convert_one(
            "pre_auxiliary_call",
            json!({"session_id": "s", "n": 3, "ok": true, "ratio": 0.5, "nested": {"a": 1},
                   "list": [1], "none": null}),
            CaptureLevel::Metadata,
        );
        let Some(Body::Other(o)) = e.body.as_ref() else {
            panic!()
        };
        let mut keys: Vec<&str> = o.fields.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["n", "ok", "ratio", "session_id"]);
        assert_eq!(o.fields["n"].value, Some(scalar::Value::IntValue(3)));
        assert_eq!(
            o.fields["ratio"].value,
            Some(scalar::Value::DoubleValue(0.5))
        );
        assert_eq!(e.ids.as_ref().unwrap().session_id, "s");
    }

    #[test]
    fn mistyped_values_do_not_fail() {
        let e = convert_one(
            "api_request_error",
            json!({"status_code": "x", "api_duration": "slow", "usage": 5, "error": "boom",
                   "retry_count": -1, "max_tokens": 99999999999u64}),
            CaptureLevel::Metadata,
        );
        let a = api(&e);
        assert_eq!(a.status_code, None);
        assert_eq!(a.api_duration_nano, 0);
        assert_eq!(a.usage, None);
        assert_eq!(a.error_message, "boom");
        assert_eq!(a.retry_count, 0);
        assert_eq!(a.max_tokens, Some(99_999_999_999));
    }
}
