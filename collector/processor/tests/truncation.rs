//! Truncation keeps the shape of GenAI message documents: what Arize
//! Phoenix and the GenAI semantic conventions' message schemas need from a
//! value cut to `max_attribute_bytes`; any JSON value stays JSON within the
//! limit, and other text becomes its longest UTF-8 prefix that fits.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use hermes_e2e::json::arb_json;
use hermes_processor::{AttributeSet, MIN_ATTRIBUTE_BYTES, ProcessorConfig, SpanProcessor};
use hermes_span::common::v1::{AnyValue, KeyValue, any_value::Value};
use hermes_span::trace::v1::Span;
use proptest::prelude::*;
use serde_json::{Value as J, json};

const INPUT: &str = "gen_ai.input.messages";
const OUTPUT: &str = "gen_ai.output.messages";
const SYSTEM: &str = "gen_ai.system_instructions";

fn s(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(Value::StringValue(value.into())),
        }),
    }
}

fn get<'a>(span: &'a Span, key: &str) -> &'a str {
    match span
        .attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
    {
        Some(Value::StringValue(s)) => s,
        other => panic!("{key}: {other:?}"),
    }
}

/// A chat span holding the three content documents, processed at `limit`
/// with the OpenInference set (whose `input.value`/`output.value` copy the
/// messages).
fn process(input: &str, output: &str, system: &str, limit: usize) -> Span {
    let mut span = Span {
        trace_id: [1; 16].into(),
        span_id: [2; 8].into(),
        parent_span_id: [3; 8].into(),
        name: "chat m".into(),
        attributes: vec![
            s("gen_ai.operation.name", "chat"),
            s(INPUT, input),
            s(OUTPUT, output),
            s(SYSTEM, system),
        ],
        ..Default::default()
    };
    let mut p = SpanProcessor::new(&ProcessorConfig {
        attribute_sets: vec![AttributeSet::GenAi, AttributeSet::OpenInference],
        max_attribute_bytes: Some(limit),
        ..Default::default()
    })
    .unwrap();
    p.process_span(&mut span);
    span
}

/// Why `part` breaks the GenAI part schema, if it does.
fn part_error(part: &J) -> Option<String> {
    let o = part.as_object()?;
    let need = |key: &str, ok: fn(&J) -> bool| {
        (!o.get(key).is_some_and(ok)).then(|| format!("part without {key}: {part}"))
    };
    need("type", J::is_string).or_else(|| match o["type"].as_str() {
        Some("text") => need("content", J::is_string),
        Some("tool_call") => need("name", J::is_string),
        Some("tool_call_response") => need("response", |_| true),
        _ => None,
    })
}

/// Why `text` is not a GenAI message array (output messages need
/// `finish_reason`), if it is not.
fn messages_error(text: &str, output: bool) -> Option<String> {
    let v: J = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => return Some(format!("not JSON ({e}): {text}")),
    };
    let Some(messages) = v.as_array() else {
        return Some(format!("not an array: {text}"));
    };
    messages.iter().find_map(|m| {
        let Some(o) = m.as_object() else {
            return Some(format!("message not an object: {m}"));
        };
        if !o.get("role").is_some_and(J::is_string) {
            return Some(format!("message without role: {m}"));
        }
        if output && !o.get("finish_reason").is_some_and(J::is_string) {
            return Some(format!("output message without finish_reason: {m}"));
        }
        let Some(parts) = o.get("parts").and_then(J::as_array) else {
            return Some(format!("message without parts: {m}"));
        };
        parts.iter().find_map(|p| {
            p.as_object().map_or_else(
                || Some(format!("part not an object: {p}")),
                |_| part_error(p),
            )
        })
    })
}

/// Why `text` is not a GenAI system instructions array (of parts), if not.
fn parts_error(text: &str) -> Option<String> {
    let v: J = serde_json::from_str(text).ok()?;
    let parts = v.as_array()?;
    parts.iter().find_map(|p| {
        p.as_object().map_or_else(
            || Some(format!("part not an object: {p}")),
            |_| part_error(p),
        )
    })
}

/// A system prompt the size and make of Hermes' own (~12 KB: identity,
/// tool guidance, memory, skills, platform notes).
fn hermes_system_prompt() -> String {
    let mut p = String::from(
        "You are Hermes Agent, an intelligent AI assistant created by Nous Research. \
         You are helpful, knowledgeable, and direct.\n\n",
    );
    let sections = [
        (
            "Tool use",
            "When a task needs the terminal, call the `terminal` tool with the exact command; never invent output. Prefer `read_file` over `cat` for files under 2 MB, and `search_files` (ripgrep) before reading whole trees. ",
        ),
        (
            "Memory",
            "MEMORY.md holds durable facts about the user and their projects (§ separated). Save what will matter next week; never save secrets — « no API keys, no passwords ». ",
        ),
        (
            "Skills",
            "Skills live in ~/.hermes/skills; load one with `skill_view` before following it. Create a skill after a task of five or more tool calls that worked. ",
        ),
        (
            "Platform",
            "You are running in a CLI on Linux; answers render as Markdown, keep them short — émojis only when asked 🙂. ",
        ),
    ];
    while p.len() < 12_000 {
        for (title, body) in sections {
            p.push_str(&format!("## {title}\n{}\n\n", body.repeat(3)));
        }
    }
    p
}

#[test]
fn a_12kb_system_prompt_keeps_its_message_at_the_default_limit() {
    let prompt = hermes_system_prompt();
    assert!(prompt.len() > 12_000);
    let input = json!([
        {"role": "system", "parts": [{"type": "text", "content": prompt}]},
        {"role": "user", "parts": [{"type": "text", "content": "list the files in /tmp"}]},
    ])
    .to_string();
    let system = json!([{"type": "text", "content": prompt}]).to_string();
    let output = json!([{"role": "assistant", "parts": [{"type": "text", "content": "done"}],
        "finish_reason": "stop"}])
    .to_string();
    let span = process(&input, &output, &system, 4096);

    for key in [INPUT, "input.value"] {
        let cut = get(&span, key);
        assert!(cut.len() <= 4096, "{key}: {}", cut.len());
        assert_eq!(messages_error(cut, false), None, "{key}");
        let v: J = serde_json::from_str(cut).unwrap();
        assert_eq!(v[0]["role"], "system", "{key}");
        assert_eq!(v[0]["parts"][0]["type"], "text", "{key}");
        let content = v[0]["parts"][0]["content"].as_str().unwrap();
        assert!(content.starts_with("You are Hermes Agent"), "{key}");
        // A prefix of the prompt, then how much of it went.
        let (prefix, marker) = content.rsplit_once("…[truncated ").unwrap();
        let removed: usize = marker.strip_suffix(" bytes]").unwrap().parse().unwrap();
        assert!(prompt.starts_with(prefix), "{key}");
        assert_eq!(prefix.len() + removed, prompt.len(), "{key}");
        // The short user message is untouched: only the longest string is cut.
        assert_eq!(
            v[1],
            json!({"role": "user", "parts": [{"type": "text", "content": "list the files in /tmp"}]})
        );
        // The cut uses the room: the document is close to the limit.
        assert!(cut.len() > 4000, "{key}: {}", cut.len());
    }
    let cut = get(&span, SYSTEM);
    assert_eq!(parts_error(cut), None);
    let v: J = serde_json::from_str(cut).unwrap();
    assert_eq!(v[0]["type"], "text");
    assert!(
        v[0]["content"]
            .as_str()
            .unwrap()
            .starts_with("You are Hermes Agent")
    );
    // Untouched below the limit.
    assert_eq!(get(&span, OUTPUT), output);
}

#[test]
fn a_long_history_keeps_its_first_and_newest_messages_and_counts_the_rest() {
    let message = |i: usize| {
        json!({"role": if i.is_multiple_of(2) { "user" } else { "assistant" },
            "parts": [{"type": "text", "content": format!("message {i}: {}", "x".repeat(200))}]})
    };
    let input = J::Array((0..300).map(message).collect()).to_string();
    let span = process(&input, "[]", "[]", 4096);
    let cut = get(&span, INPUT);
    assert!(cut.len() <= 4096);
    assert_eq!(messages_error(cut, false), None);
    let v: J = serde_json::from_str(cut).unwrap();
    let kept = v.as_array().unwrap();
    let text = |m: &J| m["parts"][0]["content"].as_str().unwrap().to_owned();
    assert!(text(&kept[0]).starts_with("message 0: "), "{cut}");
    assert_eq!(kept[1]["role"], "system");
    let elided: usize = text(&kept[1])
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(" messages elided]"))
        .unwrap()
        .parse()
        .unwrap();
    assert!(text(kept.last().unwrap()).starts_with("message 299: "));
    // Every message is either kept or counted, the newest ones kept.
    assert_eq!(kept.len() - 1 + elided, 300);
    for (m, n) in kept[2..].iter().zip(300 - (kept.len() - 2)..) {
        assert!(text(m).starts_with(&format!("message {n}: ")), "{m}");
    }
}

#[test]
fn output_messages_elided_keep_finish_reason() {
    let msg = |i: usize| {
        json!({"role": "assistant", "parts": [{"type": "text", "content": format!("{i}")}],
            "finish_reason": "stop"})
    };
    let output = J::Array((0..100).map(msg).collect()).to_string();
    let span = process("[]", &output, "[]", 256);
    let cut = get(&span, OUTPUT);
    assert!(cut.len() <= 256);
    assert_eq!(messages_error(cut, true), None, "{cut}");
    assert!(cut.contains("messages elided]"), "{cut}");
}

#[test]
fn other_json_prefers_cutting_strings_to_dropping_members() {
    let args = json!({"command": "cat", "path": "/etc/hosts", "content": "y".repeat(10_000),
        "flags": {"force": true}})
    .to_string();
    let mut span = Span {
        attributes: vec![
            s("gen_ai.operation.name", "execute_tool"),
            s("gen_ai.tool.call.arguments", &args),
        ],
        ..Default::default()
    };
    let mut p = SpanProcessor::new(&ProcessorConfig {
        max_attribute_bytes: Some(200),
        ..Default::default()
    })
    .unwrap();
    p.process_span(&mut span);
    let cut = get(&span, "gen_ai.tool.call.arguments");
    assert!(cut.len() <= 200);
    let v: J = serde_json::from_str(cut).unwrap();
    assert_eq!(v["command"], "cat");
    assert_eq!(v["path"], "/etc/hosts");
    assert_eq!(v["flags"], json!({"force": true}));
    assert!(v["content"].as_str().unwrap().ends_with(" bytes]"));
}

/// Text of any size: short random unicode, or a fragment repeated to a few
/// kilobytes (prompts, tool results).
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        ".{0,40}",
        (".{1,12}", 1usize..600).prop_map(|(s, n)| s.repeat(n)),
    ]
}

fn part() -> impl Strategy<Value = J> {
    prop_oneof![
        text().prop_map(|t| json!({"type": "text", "content": t})),
        ("[a-z0-9_]{1,12}", "[a-z_]{1,20}", text()).prop_map(|(id, name, a)| {
            json!({"type": "tool_call", "id": id, "name": name, "arguments": {"command": a}})
        }),
        ("[a-z0-9_]{1,12}", text())
            .prop_map(|(id, r)| json!({"type": "tool_call_response", "id": id, "response": r})),
        ("[a-z0-9_]{1,12}", text(), text()).prop_map(|(id, a, b)| {
            json!({"type": "tool_call_response", "id": id, "response": {"output": a, "lines": [b, "ok"]}})
        }),
    ]
}

fn messages(output: bool) -> impl Strategy<Value = J> {
    let role = prop_oneof![
        Just("system"),
        Just("user"),
        Just("assistant"),
        Just("tool")
    ];
    let message = (role, prop::collection::vec(part(), 1..5)).prop_map(move |(role, parts)| {
        let mut m = json!({"role": role, "parts": parts});
        if output {
            m["finish_reason"] = json!("stop");
        }
        m
    });
    prop::collection::vec(message, 0..40).prop_map(J::Array)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn any_messages_document_keeps_its_schema_within_the_limit(
        input in messages(false),
        output in messages(true),
        system in prop::collection::vec(part(), 0..6),
        limit in MIN_ATTRIBUTE_BYTES..6000,
    ) {
        let (input, output) = (input.to_string(), output.to_string());
        let system = J::Array(system).to_string();
        let span = process(&input, &output, &system, limit);
        for (key, original, output) in [
            (INPUT, &input, false),
            ("input.value", &input, false),
            (OUTPUT, &output, true),
            ("output.value", &output, true),
        ] {
            let cut = get(&span, key);
            prop_assert!(cut.len() <= limit.max(original.len().min(limit)), "{}: {} > {}", key, cut.len(), limit);
            if original.len() <= limit {
                prop_assert_eq!(cut, original.as_str());
            }
            prop_assert_eq!(messages_error(cut, output), None, "{} at {}", key, limit);
        }
        let cut = get(&span, SYSTEM);
        prop_assert!(cut.len() <= limit);
        prop_assert!(serde_json::from_str::<J>(cut).is_ok(), "{}", cut);
        prop_assert_eq!(parts_error(cut), None);
    }
}

/// `text` as the one attribute of a span, through a processor without
/// redaction rules that cuts values at `limit`.
fn cut_through_processor(text: &str, limit: usize) -> String {
    let mut config = ProcessorConfig {
        max_attribute_bytes: Some(limit),
        ..Default::default()
    };
    config.redaction.key_names.clear();
    config.redaction.value_patterns.clear();
    let mut p = SpanProcessor::new(&config).unwrap();
    let mut sp = Span {
        trace_id: [1; 16].into(),
        span_id: [2; 8].into(),
        parent_span_id: [3; 8].into(),
        name: "x".into(),
        attributes: vec![s("v", text)],
        ..Default::default()
    };
    p.process_span(&mut sp);
    get(&sp, "v").to_owned()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn json_values_stay_json_within_the_limit(
        doc in arb_json(),
        pretty in any::<bool>(),
        limit_seed in any::<prop::sample::Index>(),
    ) {
        let text = if pretty {
            serde_json::to_string_pretty(&doc).unwrap()
        } else {
            doc.to_string()
        };
        let limit = MIN_ATTRIBUTE_BYTES
            + limit_seed.index(text.len() + 16);
        let out = cut_through_processor(&text, limit);
        if text.len() <= limit {
            prop_assert_eq!(&out, &text);
        } else {
            prop_assert!(out.len() <= limit, "{} > {}: {}", out.len(), limit, out);
            let parsed = serde_json::from_str::<serde_json::Value>(&out);
            prop_assert!(parsed.is_ok(), "invalid JSON at limit {}: {}", limit, out);
            // The same kind of document comes out.
            let parsed = parsed.unwrap();
            prop_assert_eq!(parsed.is_object(), doc.is_object());
        }
    }

    #[test]
    fn other_strings_become_a_utf8_prefix_within_the_limit(
        text in "\\PC{0,400}",
        limit in MIN_ATTRIBUTE_BYTES..600,
    ) {
        // Not JSON containers: strings starting with `{`/`[` may be JSON.
        prop_assume!(!text.trim_start().starts_with(['{', '[']));
        let out = cut_through_processor(&text, limit);
        prop_assert!(out.len() <= limit);
        prop_assert!(text.starts_with(&out));
        if text.len() > limit {
            // The longest such prefix: one more char would exceed the limit.
            let next = text[out.len()..].chars().next().unwrap();
            prop_assert!(out.len() + next.len_utf8() > limit);
        } else {
            prop_assert_eq!(out, text);
        }
    }

    #[test]
    fn broken_json_is_cut_as_text(
        doc in arb_json(),
        cut in any::<prop::sample::Index>(),
        limit in MIN_ATTRIBUTE_BYTES..200,
    ) {
        let text = doc.to_string();
        let broken = &text[..text.floor_char_boundary(cut.index(text.len()))];
        let out = cut_through_processor(broken, limit);
        // A strict prefix of a container is never valid JSON: plain cut.
        prop_assert!(out.len() <= limit);
        prop_assert!(broken.starts_with(&out));
    }
}
