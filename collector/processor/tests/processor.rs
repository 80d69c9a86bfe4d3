//! Behaviour of the span processor through its public API.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use hermes_processor::{
    AttributeSet, ConfigError, ProcessorConfig, RedactionConfig, SpanProcessor,
    TRUNCATED_ATTRIBUTES,
};
use hermes_span::common::v1::{AnyValue, ArrayValue, KeyValue, KeyValueList, any_value::Value};
use hermes_span::resource::v1::Resource;
use hermes_span::trace::v1::{
    ResourceSpans, ScopeSpans, Span, Status, span::Event, status::StatusCode,
};
use hermes_span::{Id, Str};
use serde_json::json;

fn kv(key: &str, value: Value) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(value) }),
    }
}

fn s(key: &str, value: &str) -> KeyValue {
    kv(key, Value::StringValue(value.into()))
}

fn i(key: &str, value: i64) -> KeyValue {
    kv(key, Value::IntValue(value))
}

fn span(name: &str, root: bool, attributes: Vec<KeyValue>) -> Span {
    Span {
        trace_id: [1; 16].into(),
        span_id: [2; 8].into(),
        parent_span_id: if root { Id::default() } else { [3; 8].into() },
        name: name.into(),
        attributes,
        ..Default::default()
    }
}

/// A span of turn `turn-1` in session `sess-1` with `own` attributes after
/// the ones every span of the turn carries.
fn turn_member(name: &str, root: bool, own: impl IntoIterator<Item = KeyValue>) -> Span {
    let mut attributes = vec![
        s("session.id", "sess-1"),
        s("gen_ai.conversation.id", "sess-1"),
        s("hermes.turn_id", "turn-1"),
        s("hermes.platform", "cli"),
        s("gen_ai.agent.name", "hermes"),
    ];
    attributes.extend(own);
    span(name, root, attributes)
}

fn chat_span() -> Span {
    turn_member(
        "chat claude-sonnet-4",
        false,
        [
            s("gen_ai.operation.name", "chat"),
            s("gen_ai.provider.name", "anthropic"),
            s("gen_ai.request.model", "claude-sonnet-4"),
            s("gen_ai.response.model", "claude-sonnet-4-20250514"),
            i("gen_ai.usage.input_tokens", 1200),
            i("gen_ai.usage.output_tokens", 300),
            i("gen_ai.usage.cache_read.input_tokens", 1000),
            i("gen_ai.usage.cache_creation.input_tokens", 150),
            i("gen_ai.usage.reasoning.output_tokens", 100),
            s(
                "gen_ai.input.messages",
                r#"[{"role":"user","parts":[{"type":"text","content":"hi"}]}]"#,
            ),
            s(
                "gen_ai.output.messages",
                r#"[{"role":"assistant","parts":[{"type":"text","content":"hello"}],"finish_reason":"stop"}]"#,
            ),
        ],
    )
}

fn tool_span(arguments: &str) -> Span {
    turn_member(
        "execute_tool terminal",
        false,
        [
            s("gen_ai.operation.name", "execute_tool"),
            s("gen_ai.tool.name", "terminal"),
            s("gen_ai.tool.call.id", "call_1"),
            s("gen_ai.tool.type", "function"),
            s("hermes.tool.status", "ok"),
            s("gen_ai.tool.call.arguments", arguments),
            s("gen_ai.tool.call.result", "done"),
        ],
    )
}

fn turn_span() -> Span {
    let mut sp = turn_member(
        "invoke_agent hermes",
        true,
        [
            s("gen_ai.operation.name", "invoke_agent"),
            s("gen_ai.request.model", "claude-sonnet-4"),
            s("hermes.turn.user_message", "list the files"),
            s("hermes.turn.final_answer", "{\"files\":[\"a\",\"b\"]}"),
            i("hermes.turn.usage.input_tokens", 1200),
        ],
    );
    sp.status = Some(Status {
        code: StatusCode::Error as i32,
        message: "turn failed".to_owned(),
    });
    sp
}

fn batch(spans: Vec<Span>) -> Vec<ResourceSpans> {
    vec![ResourceSpans {
        resource: Some(Resource {
            attributes: vec![s("service.name", "hermes-agent"), s("host.name", "box")],
            ..Default::default()
        }),
        scope_spans: vec![ScopeSpans {
            spans,
            ..Default::default()
        }],
        ..Default::default()
    }]
}

fn processor(config: ProcessorConfig) -> SpanProcessor {
    SpanProcessor::new(&config).unwrap()
}

fn all_sets() -> ProcessorConfig {
    ProcessorConfig {
        attribute_sets: vec![
            AttributeSet::GenAi,
            AttributeSet::OpenInference,
            AttributeSet::Langfuse,
        ],
        ..Default::default()
    }
}

fn get<'a>(sp: &'a Span, key: &str) -> Option<&'a Value> {
    sp.attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

fn get_str<'a>(sp: &'a Span, key: &str) -> &'a str {
    match get(sp, key) {
        Some(Value::StringValue(v)) => v,
        other => panic!("{key}: {other:?}"),
    }
}

/// `span`, alone in a batch, through a processor with every attribute set.
fn through_all_sets(span: Span) -> Span {
    let mut b = batch(vec![span]);
    processor(all_sets()).process(&mut b);
    b[0].scope_spans[0].spans[0].clone()
}

/// Each `(key, value)` is a string attribute of `sp` (the key named when
/// one is not).
fn assert_strs(sp: &Span, expected: &[(&str, &str)]) {
    for (key, value) in expected {
        assert_eq!(get_str(sp, key), *value, "{key}");
    }
}

fn get_int(sp: &Span, key: &str) -> i64 {
    match get(sp, key) {
        Some(Value::IntValue(v)) => *v,
        other => panic!("{key}: {other:?}"),
    }
}

/// Every string anywhere in the batch, for "never survives" checks.
fn all_text(b: &[ResourceSpans]) -> String {
    serde_json::to_string(&hermes_span::convert::to_otlp(b)).unwrap()
}

#[test]
fn a_token_in_tool_arguments_never_survives() {
    let arguments = r#"{"headers":{"Authorization":"Bearer abc.def"},"cmd":"curl -H 'Authorization: Bearer xyz' https://api.example.com"}"#;
    let mut p = processor(all_sets());
    let mut b = batch(vec![tool_span(arguments)]);
    p.process(&mut b);

    let text = all_text(&b);
    assert!(!text.contains("abc.def"), "{text}");
    assert!(!text.contains("xyz"), "{text}");

    let sp = &b[0].scope_spans[0].spans[0];
    for key in [
        "gen_ai.tool.call.arguments",
        "input.value",
        "langfuse.observation.input",
    ] {
        let v: serde_json::Value = serde_json::from_str(get_str(sp, key)).unwrap();
        assert_eq!(v["headers"]["Authorization"], "<redacted>", "{key}");
        assert_eq!(
            v["cmd"], "curl -H '<redacted>' https://api.example.com",
            "{key}"
        );
    }
    assert_eq!(get_str(sp, "input.mime_type"), "application/json");
    assert_eq!(p.stats().redacted_attributes(), 3);
}

#[test]
fn an_email_in_a_message_is_redacted() {
    let mut sp = chat_span();
    let messages = json!([
        {"role": "user", "parts": [{"type": "text", "content": "mail jane.doe+x@example.co.uk about it"}]},
        {"role": "assistant", "parts": [{"type": "tool_call", "id": "c1", "name": "send",
            "arguments": "{\"to\":\"bob@corp.example\",\"api_key\":\"k-123\"}"}]}
    ]);
    sp.attributes.retain(|a| a.key != "gen_ai.input.messages");
    sp.attributes
        .push(s("gen_ai.input.messages", &messages.to_string()));
    sp.attributes
        .push(s("hermes.note", "contact alice@example.org"));
    let mut b = batch(vec![sp]);
    processor(ProcessorConfig::default()).process(&mut b);

    let text = all_text(&b);
    for secret in ["jane.doe", "example.co.uk", "bob@corp", "k-123", "alice@"] {
        assert!(!text.contains(secret), "{secret} survived: {text}");
    }
    let sp = &b[0].scope_spans[0].spans[0];
    let v: serde_json::Value = serde_json::from_str(get_str(sp, "gen_ai.input.messages")).unwrap();
    assert_eq!(v[0]["parts"][0]["content"], "mail <redacted> about it");
    // JSON text inside a JSON string is redacted and stays JSON text.
    let args: serde_json::Value =
        serde_json::from_str(v[1]["parts"][0]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"to": "<redacted>", "api_key": "<redacted>"}));
    assert_eq!(get_str(sp, "hermes.note"), "contact <redacted>");
}

/// Static keys and values and shared values (as the correlator builds them)
/// are remembered by address (shared ones for their pass only): a clean
/// shared value stays as it is, a shared value with a secret is redacted on
/// every span that holds it, and a static key's verdict holds for every
/// attribute under it.
#[test]
fn static_and_shared_strings_are_redacted_like_owned_ones() {
    let secret = Str::from("mail jane@example.org");
    let clean = Str::from("sess-1");
    let fixed = Str::from_static("hermes.note");
    let attribute = |key: Str, value: Str| KeyValue {
        key,
        value: Some(AnyValue {
            value: Some(Value::StringValue(value)),
        }),
    };
    let spans = || {
        (0..3)
            .map(|_| {
                span(
                    "x",
                    false,
                    vec![
                        attribute(fixed.clone(), secret.clone()),
                        attribute(Str::from_static("gen_ai.conversation.id"), clean.clone()),
                        attribute(Str::from_static("api_key"), Str::from_static("plain")),
                        attribute(
                            Str::from_static("gen_ai.operation.name"),
                            Str::from_static("chat"),
                        ),
                        attribute(
                            Str::from_static("hermes.fixed"),
                            Str::from_static("key sk-abcdefghijklmnop1234"),
                        ),
                    ],
                )
            })
            .collect()
    };
    let mut p = processor(ProcessorConfig::default());
    // The second pass starts from the static verdicts of the first: the
    // same output.
    for pass in 1..=2 {
        let mut b = batch(spans());
        p.process(&mut b);
        for sp in &b[0].scope_spans[0].spans {
            assert_eq!(get_str(sp, "hermes.note"), "mail <redacted>");
            assert_eq!(get_str(sp, "gen_ai.conversation.id"), "sess-1");
            assert_eq!(get_str(sp, "api_key"), "<redacted>");
            assert_eq!(get_str(sp, "gen_ai.operation.name"), "chat");
            assert_eq!(get_str(sp, "hermes.fixed"), "key <redacted>");
            // The clean shared value is still the one allocation.
            let Some(Value::StringValue(Str::Shared(kept))) = get(sp, "gen_ai.conversation.id")
            else {
                panic!("not shared");
            };
            let Str::Shared(original) = &clean else {
                unreachable!()
            };
            assert!(std::sync::Arc::ptr_eq(kept, original));
        }
        assert_eq!(p.stats().redacted_attributes(), 9 * pass);
    }
    // Shared values are remembered for their pass only: the processor
    // holds none of them afterwards (their addresses may be reused).
    let Str::Shared(original) = &clean else {
        unreachable!()
    };
    assert_eq!(std::sync::Arc::strong_count(original), 1);
}

#[test]
fn keys_matching_rules_have_their_whole_value_replaced() {
    let mut sp = span(
        "x",
        false,
        vec![
            s("hermes.config.OPENAI-API-KEY", "plain-value"),
            s("my-service-token", "plain-value"),
            s("clientSecret", "plain-value"),
            i("password", 1234),
            s("http.request.header.authorization", "Basic Zm9vOmJhcg=="),
            kv(
                "hermes.headers",
                Value::KvlistValue(KeyValueList {
                    values: vec![s("Cookie", "sid=1"), s("accept", "json")],
                }),
            ),
            s("gen_ai.request.max_tokens", "plain-value"),
            i("gen_ai.usage.input_tokens", 5),
        ],
    );
    sp.events.push(Event {
        name: "hermes.hook.x".into(),
        attributes: vec![s("x_refresh_token", "plain-value")],
        ..Default::default()
    });
    let mut b = batch(vec![sp]);
    b[0].resource
        .as_mut()
        .unwrap()
        .attributes
        .push(s("deploy.github_token", "plain-value"));
    let mut p = processor(ProcessorConfig::default());
    p.process(&mut b);

    let sp = &b[0].scope_spans[0].spans[0];
    for key in [
        "hermes.config.OPENAI-API-KEY",
        "my-service-token",
        "clientSecret",
        "password",
        "http.request.header.authorization",
    ] {
        assert_eq!(get_str(sp, key), "<redacted>", "{key}");
    }
    let Some(Value::KvlistValue(list)) = get(sp, "hermes.headers") else {
        panic!()
    };
    assert_eq!(
        list.values[0].value.as_ref().unwrap().value,
        Some(Value::StringValue("<redacted>".into()))
    );
    assert_eq!(
        list.values[1].value.as_ref().unwrap().value,
        Some(Value::StringValue("json".into()))
    );
    assert_eq!(get_str(sp, "gen_ai.request.max_tokens"), "plain-value");
    assert_eq!(get_int(sp, "gen_ai.usage.input_tokens"), 5);
    assert_eq!(
        sp.events[0].attributes[0].value.as_ref().unwrap().value,
        Some(Value::StringValue("<redacted>".into()))
    );
    let res = &b[0].resource.as_ref().unwrap().attributes;
    assert_eq!(
        res[2].value.as_ref().unwrap().value,
        Some(Value::StringValue("<redacted>".into()))
    );
    assert_eq!(p.stats().redacted_attributes(), 8);

    // Custom rules with inner wildcards.
    let mut p = processor(ProcessorConfig {
        redaction: RedactionConfig {
            key_names: vec!["x-*-key".into()],
            value_patterns: vec![],
            replacement: "***".into(),
        },
        ..Default::default()
    });
    let mut sp = span("x", false, vec![s("X_Tenant_Key", "v"), s("api_key", "v")]);
    p.process_span(&mut sp);
    assert_eq!(get_str(&sp, "X_Tenant_Key"), "***");
    assert_eq!(get_str(&sp, "api_key"), "v");
}

#[test]
fn openinference_and_langfuse_for_a_chat_span() {
    let sp = &through_all_sets(chat_span());

    assert_strs(
        sp,
        &[
            ("openinference.span.kind", "LLM"),
            ("llm.model_name", "claude-sonnet-4-20250514"),
            ("llm.provider", "anthropic"),
        ],
    );
    assert_eq!(get_int(sp, "llm.token_count.prompt"), 1200);
    assert_eq!(get_int(sp, "llm.token_count.completion"), 300);
    assert_eq!(get_int(sp, "llm.token_count.total"), 1500);
    assert_eq!(
        get_int(sp, "llm.token_count.prompt_details.cache_read"),
        1000
    );
    assert_eq!(
        get_int(sp, "llm.token_count.prompt_details.cache_write"),
        150
    );
    assert_eq!(
        get_int(sp, "llm.token_count.completion_details.reasoning"),
        100
    );
    assert_eq!(get_str(sp, "session.id"), "sess-1");
    assert_eq!(
        get_str(sp, "input.value"),
        get_str(sp, "gen_ai.input.messages")
    );
    assert_eq!(get_str(sp, "input.mime_type"), "application/json");
    assert_eq!(
        get_str(sp, "output.value"),
        get_str(sp, "gen_ai.output.messages")
    );
    assert_eq!(get_str(sp, "output.mime_type"), "application/json");

    assert_strs(
        sp,
        &[
            ("langfuse.observation.type", "generation"),
            ("langfuse.session.id", "sess-1"),
            (
                "langfuse.observation.model.name",
                "claude-sonnet-4-20250514",
            ),
        ],
    );
    let usage: serde_json::Value =
        serde_json::from_str(get_str(sp, "langfuse.observation.usage_details")).unwrap();
    assert_eq!(
        usage,
        json!({"input": 50, "input_cached_tokens": 1000, "input_cache_creation": 150,
               "output": 200, "output_reasoning_tokens": 100, "total": 1500})
    );
    assert_eq!(
        get_str(sp, "langfuse.observation.input"),
        get_str(sp, "gen_ai.input.messages")
    );
    // Trace-level properties on every observation, the root's or not.
    assert_eq!(get_str(sp, "langfuse.trace.name"), "hermes-agent");
    assert!(get(sp, "langfuse.observation.level").is_none());
    assert!(get(sp, "langfuse.user.id").is_none());
}

#[test]
fn openinference_and_langfuse_for_a_tool_span() {
    let sp = &through_all_sets(tool_span(r#"{"command":"ls"}"#));

    assert_strs(
        sp,
        &[
            ("openinference.span.kind", "TOOL"),
            ("tool.name", "terminal"),
            ("tool.id", "call_1"),
            ("input.value", r#"{"command":"ls"}"#),
            ("input.mime_type", "application/json"),
            ("output.value", "done"),
            ("output.mime_type", "text/plain"),
        ],
    );
    assert!(get(sp, "llm.model_name").is_none());

    assert_strs(
        sp,
        &[
            ("langfuse.observation.type", "tool"),
            ("langfuse.observation.input", r#"{"command":"ls"}"#),
            ("langfuse.observation.output", "done"),
        ],
    );
    assert!(get(sp, "langfuse.observation.usage_details").is_none());
}

#[test]
fn openinference_and_langfuse_for_a_turn_span() {
    let mut turn = turn_span();
    turn.attributes.push(s("user.id", "u-7"));
    let sp = &through_all_sets(turn);

    assert_strs(
        sp,
        &[
            ("openinference.span.kind", "AGENT"),
            ("agent.name", "hermes"),
            ("input.value", "list the files"),
            ("input.mime_type", "text/plain"),
            ("output.value", "{\"files\":[\"a\",\"b\"]}"),
            ("output.mime_type", "application/json"),
        ],
    );
    // No token counts on the root: backends would double count.
    assert!(get(sp, "llm.token_count.prompt").is_none());

    assert_eq!(get_str(sp, "langfuse.observation.type"), "agent");
    // The trace is named after the agent's service (`routing.langfuse`).
    assert_strs(
        sp,
        &[
            ("langfuse.trace.name", "hermes-agent"),
            ("langfuse.session.id", "sess-1"),
            ("langfuse.user.id", "u-7"),
            ("langfuse.observation.input", "list the files"),
            ("langfuse.observation.level", "ERROR"),
            ("langfuse.observation.status_message", "turn failed"),
        ],
    );
    assert!(get(sp, "langfuse.observation.model.name").is_none());
}

#[test]
fn other_spans_are_chains_and_sets_only_when_enabled() {
    let mut approval = span(
        "approval rm",
        false,
        vec![
            s("hermes.approval.pattern_key", "rm"),
            s("hermes.approval.choice", "once"),
        ],
    );
    let mut plain = approval.clone();
    processor(all_sets()).process_span(&mut approval);
    assert_eq!(get_str(&approval, "openinference.span.kind"), "CHAIN");
    assert_eq!(get_str(&approval, "langfuse.observation.type"), "span");
    assert_eq!(get_str(&approval, "output.value"), "once");
    assert!(get(&approval, "input.value").is_none());

    let before = plain.clone();
    processor(ProcessorConfig {
        attribute_sets: vec![AttributeSet::Langfuse],
        ..Default::default()
    })
    .process_span(&mut plain);
    assert!(get(&plain, "openinference.span.kind").is_none());
    // langfuse.observation.type and .output only.
    assert_eq!(plain.attributes.len(), before.attributes.len() + 2);
}

#[test]
fn spans_without_matches_are_unchanged() {
    let spans = vec![
        chat_span(),
        tool_span(r#"{"command":"ls -la"}"#),
        turn_span(),
    ];
    let original = batch(spans);
    let mut b = original.clone();
    let mut p = processor(ProcessorConfig::default());
    p.process(&mut b);
    assert_eq!(b, original);
    assert_eq!(p.stats().snapshot().spans, 3);
    assert_eq!(p.stats().redacted_attributes(), 0);
    assert_eq!(p.stats().truncated_attributes(), 0);

    // With every set on, the original attributes come first and unchanged.
    let mut b = original.clone();
    processor(all_sets()).process(&mut b);
    for (after, before) in b[0].scope_spans[0]
        .spans
        .iter()
        .zip(&original[0].scope_spans[0].spans)
    {
        assert_eq!(
            &after.attributes[..before.attributes.len()],
            &before.attributes[..]
        );
    }
}

#[test]
fn processing_twice_changes_nothing_more() {
    let mut long = tool_span(&json!({"data": "x".repeat(10_000), "token": "t"}).to_string());
    long.attributes.push(s("hermes.big", &"é".repeat(5000)));
    let mut p = processor(all_sets());
    let mut once = batch(vec![long, chat_span(), turn_span()]);
    p.process(&mut once);
    let mut twice = once.clone();
    p.process(&mut twice);
    assert_eq!(once, twice);
}

#[test]
fn truncation_marks_and_counts() {
    let args =
        json!({"files": (0..500).map(|n| format!("file-{n}.txt")).collect::<Vec<_>>()}).to_string();
    let mut sp = tool_span(&args);
    sp.attributes.push(kv(
        "hermes.list",
        Value::ArrayValue(ArrayValue {
            values: vec![AnyValue {
                value: Some(Value::StringValue("y".repeat(100).into())),
            }],
        }),
    ));
    sp.events.push(Event {
        name: "exception".into(),
        attributes: vec![s("exception.message", &"m".repeat(100))],
        ..Default::default()
    });
    let mut p = processor(ProcessorConfig {
        max_attribute_bytes: Some(64),
        ..Default::default()
    });
    let mut b = batch(vec![sp]);
    p.process(&mut b);
    let sp = &b[0].scope_spans[0].spans[0];

    let cut = get_str(sp, "gen_ai.tool.call.arguments");
    assert!(cut.len() <= 64);
    let v: serde_json::Value = serde_json::from_str(cut).unwrap();
    let files = v["files"].as_array().unwrap();
    // The middle of the array went, replaced by one element saying so.
    assert_eq!(files.len(), 3, "{cut}");
    assert_eq!(files[0], "file-0.txt");
    assert_eq!(files[1], "[498 elements elided]");
    assert_eq!(files[2], "file-499.txt");

    let Some(Value::ArrayValue(marked)) = get(sp, TRUNCATED_ATTRIBUTES) else {
        panic!("no {TRUNCATED_ATTRIBUTES}")
    };
    let marked: Vec<&str> = marked
        .values
        .iter()
        .map(|v| match &v.value {
            Some(Value::StringValue(s)) => s.as_str(),
            _ => panic!(),
        })
        .collect();
    assert_eq!(
        marked,
        [
            "gen_ai.tool.call.arguments",
            "hermes.list",
            "exception/exception.message"
        ]
    );
    assert_eq!(p.stats().truncated_attributes(), 3);

    // Unlimited.
    let mut sp = tool_span(&args);
    let before = sp.clone();
    processor(ProcessorConfig {
        max_attribute_bytes: None,
        ..Default::default()
    })
    .process_span(&mut sp);
    assert_eq!(sp, before);
}

#[test]
fn an_invalid_regex_names_its_path() {
    let config = ProcessorConfig {
        redaction: RedactionConfig {
            value_patterns: vec!["ok".into(), r"\bsk-\w+".into(), "(unclosed".into()],
            ..Default::default()
        },
        ..Default::default()
    };
    let err = config.validate().unwrap_err();
    assert!(matches!(
        err,
        ConfigError::InvalidValuePattern { index: 2, .. }
    ));
    assert_eq!(err.path(), "redaction.value_patterns[2]");
    assert!(
        err.to_string().starts_with("redaction.value_patterns[2]: "),
        "{err}"
    );
    assert!(SpanProcessor::new(&config).is_err());

    let empty = ProcessorConfig {
        redaction: RedactionConfig {
            value_patterns: vec!["a*".into()],
            ..Default::default()
        },
        ..Default::default()
    };
    assert_eq!(
        empty.validate().unwrap_err().path(),
        "redaction.value_patterns[0]"
    );

    let key = ProcessorConfig {
        redaction: RedactionConfig {
            key_names: vec!["token".into(), "*".into()],
            ..Default::default()
        },
        ..Default::default()
    };
    assert_eq!(key.validate().unwrap_err().path(), "redaction.key_names[1]");

    let small = ProcessorConfig {
        max_attribute_bytes: Some(8),
        ..Default::default()
    };
    assert_eq!(small.validate().unwrap_err().path(), "max_attribute_bytes");

    let twice = ProcessorConfig {
        attribute_sets: vec![AttributeSet::Langfuse, AttributeSet::Langfuse],
        ..Default::default()
    };
    assert_eq!(twice.validate().unwrap_err().path(), "attribute_sets[1]");

    ProcessorConfig::default().validate().unwrap();
}

#[test]
fn the_yaml_section_parses_and_rejects_unknown_fields() {
    let yaml = r#"
attribute_sets: [gen_ai, openinference, langfuse]
max_attribute_bytes: 2048
redaction:
  key_names: [api_key, "*_token"]
  value_patterns: ['(?i)bearer\s+\S+']
  replacement: "[x]"
"#;
    let config: ProcessorConfig = serde_yaml::from_str(yaml).unwrap();
    assert_eq!(config.attribute_sets.len(), 3);
    assert_eq!(config.max_attribute_bytes, Some(2048));
    assert_eq!(config.redaction.replacement, "[x]");
    config.validate().unwrap();

    let defaults: ProcessorConfig = serde_yaml::from_str("{}").unwrap();
    assert_eq!(defaults, ProcessorConfig::default());
    let unlimited: ProcessorConfig = serde_yaml::from_str("max_attribute_bytes: null").unwrap();
    assert_eq!(unlimited.max_attribute_bytes, None);
    let partial: ProcessorConfig = serde_yaml::from_str("redaction: {replacement: '#'}").unwrap();
    assert_eq!(
        partial.redaction.key_names,
        RedactionConfig::default().key_names
    );

    assert!(serde_yaml::from_str::<ProcessorConfig>("max_bytes: 1").is_err());
    assert!(serde_yaml::from_str::<ProcessorConfig>("redaction: {keys: []}").is_err());
    assert!(serde_yaml::from_str::<ProcessorConfig>("attribute_sets: [phoenix]").is_err());
}

#[test]
fn the_documented_example_is_the_defaults_with_every_set() {
    #[derive(serde::Deserialize)]
    struct File {
        processing: ProcessorConfig,
    }
    let readme = include_str!("../../../docs/TRACE_MODEL.md");
    let start = readme.find("```yaml\nprocessing:").unwrap() + "```yaml\n".len();
    let end = start + readme[start..].find("```").unwrap();
    let file: File = serde_yaml::from_str(&readme[start..end]).unwrap();
    assert_eq!(file.processing, all_sets());
}
