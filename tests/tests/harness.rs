//! Self-tests of the harness against the real Hermes 0.19.0 in the venv:
//! the scripted server speaks the protocol the OpenAI SDK expects, Hermes
//! runs a tool and answers through it, the Python API works, and auxiliary
//! calls do not eat script entries.
//!
//! These need the venv (`tests/setup_venv.sh`, run once per process by
//! `ensure_venv`). While the shim does not build yet: `SKIP_SHIM=1`.

use std::process::Output;
use std::time::Duration;

use hermes_e2e::fake_openai::{messages, tool_messages, tool_names};
use hermes_e2e::hermes::PY_AGENT_PRELUDE;
use hermes_e2e::{FakeOpenAi, HermesHome, venv_bin};
use serde_json::{Value, json};

fn usage(prompt: u64, completion: u64) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion})
}

/// The script of the basic scenario: one terminal call, then the answer.
fn echo_hi_script() -> Value {
    json!([
        {"tool_calls": [{"name": "terminal", "arguments": {"command": "echo hi"}}], "usage": usage(120, 10)},
        {"content": "The command printed hi.", "usage": {"prompt_tokens": 150, "completion_tokens": 8, "cached_tokens": 100}}
    ])
}

/// A Hermes run's status and output, and the requests `server` got, for
/// assertion messages.
fn describe(out: &Output, server: &FakeOpenAi) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}\nrequests:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        server.describe_requests()
    )
}

#[test]
fn hermes_chat_runs_the_tool_and_prints_the_answer() {
    let server = FakeOpenAi::start(echo_hi_script());
    let home = HermesHome::new(&server.base_url(), server.model());
    let config = home.config_yaml();
    for expected in [
        "provider: custom",
        &server.base_url(),
        "default: fake-model",
        "tirith_enabled: false",
    ] {
        assert!(
            config.contains(expected),
            "config.yaml lacks {expected:?}:\n{config}"
        );
    }

    let out = home.run_chat("Please run echo hi", &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let context = || {
        format!(
            "{}\nagent.log:\n{}",
            describe(&out, &server),
            home.agent_log()
        )
    };
    assert!(out.status.success(), "{}", context());
    assert!(stdout.contains("The command printed hi."), "{}", context());
    assert!(stderr.contains("session_id: "), "{}", context());

    let main = server.main_requests();
    assert_eq!(main.len(), 2, "{}", context());
    // What Hermes sends: streaming with usage, the terminal tool offered.
    for body in &main {
        assert_eq!(body["stream"], json!(true));
        assert_eq!(body["stream_options"]["include_usage"], json!(true));
        assert_eq!(body["model"], json!("fake-model"));
        assert!(tool_names(body).contains(&"terminal".to_string()), "{body}");
    }
    let first = messages(&main[0]);
    assert_eq!(
        first.last().and_then(|m| m["content"].as_str()),
        Some("Please run echo hi")
    );
    // The second request carries the assistant tool call and its result.
    let second = &main[1];
    let assistant_call = messages(second)
        .into_iter()
        .find(|m| m["role"] == "assistant")
        .unwrap_or_else(|| panic!("no assistant message: {second}"));
    assert_eq!(assistant_call["tool_calls"][0]["id"], json!("call_1"));
    assert_eq!(
        assistant_call["tool_calls"][0]["function"]["name"],
        json!("terminal")
    );
    let tools = tool_messages(second);
    assert_eq!(tools.len(), 1, "{second}");
    assert_eq!(tools[0]["tool_call_id"], json!("call_1"));
    let result = tools[0]["content"].as_str().unwrap_or_default();
    let result: Value =
        serde_json::from_str(result).unwrap_or_else(|e| panic!("tool result {result:?}: {e}"));
    assert_eq!(result["output"], json!("hi"), "{result}");
    assert_eq!(result["exit_code"], json!(0), "{result}");

    // `hermes chat -Q` makes no auxiliary LLM call (no title generation in
    // quiet one-shot mode); its only other requests are model-metadata GETs.
    assert!(server.aux_requests().is_empty(), "{}", context());
}

#[test]
fn python_api_two_turns_and_a_title_call_that_does_not_eat_the_script() {
    let server = FakeOpenAi::start(json!([
        {"tool_calls": [{"name": "terminal", "arguments": {"command": "echo one"}}]},
        {"content": "first answer"},
        {"tool_calls": [{"name": "terminal", "arguments": {"command": "echo two"}}]},
        {"content": "second answer"}
    ]));
    let home = HermesHome::new(&server.base_url(), server.model());
    let code = format!(
        r#"{PY_AGENT_PRELUDE}
import json
from agent.title_generator import generate_title
agent = make_agent(skip_memory=True)
r1 = agent.run_conversation("run echo one")
# Auxiliary call between the turns: must not consume "echo two".
title = generate_title("run echo one", r1.get("final_response"), timeout=30)
r2 = agent.run_conversation("run echo two", conversation_history=r1.get("messages"))
print(json.dumps({{"r1": r1.get("final_response"), "r2": r2.get("final_response"), "title": title}}))
"#
    );
    let out = home.run_python(&code, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let context = || describe(&out, &server);
    assert!(out.status.success(), "{}", context());
    let last = stdout.lines().last().unwrap_or_default();
    let result: Value = serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}\n{}", context()));
    assert_eq!(result["r1"], json!("first answer"), "{}", context());
    assert_eq!(result["r2"], json!("second answer"), "{}", context());
    assert_eq!(
        result["title"],
        json!("Scripted Test Session"),
        "{}",
        context()
    );

    let main = server.main_requests();
    assert_eq!(main.len(), 4, "{}", context());
    let aux = server.aux_requests();
    assert_eq!(aux.len(), 1, "{}", context());
    // What a Hermes 0.19.0 title request looks like: non-streaming, no tools.
    assert!(
        aux[0].get("tools").is_none() && aux[0].get("stream").is_none(),
        "{}",
        aux[0]
    );
    let system = messages(&aux[0])[0]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        system.starts_with("Generate a short, descriptive title"),
        "{system}"
    );
    let outputs: Vec<String> = main
        .iter()
        .flat_map(tool_messages)
        .filter_map(|m| m["content"].as_str().map(String::from))
        .collect();
    assert!(
        outputs.last().is_some_and(|o| o.contains("two")),
        "{outputs:?}"
    );
}

#[test]
fn hermes_retries_scripted_errors_then_answers() {
    let server = FakeOpenAi::start(json!([
        {"error": 500},
        {"error": 429, "retry_after": 0.1},
        {"content": "recovered"}
    ]));
    let home = HermesHome::new(&server.base_url(), server.model());
    let out = home.run_chat("Say something", &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let context = || describe(&out, &server);
    assert!(out.status.success(), "{}", context());
    assert!(stdout.contains("recovered"), "{}", context());
    let statuses: Vec<Value> = server
        .requests()
        .into_iter()
        .filter(|r| r["kind"] == "main")
        .map(|r| r["status"].clone())
        .collect();
    assert_eq!(
        statuses,
        vec![json!(500), json!(429), json!(200)],
        "{}",
        context()
    );
    // A retry resends the same conversation.
    let main = server.main_requests();
    assert_eq!(messages(&main[0]), messages(&main[2]));
}

/// The scripted server against the OpenAI Python SDK that Hermes uses:
/// streaming chunks, usage, tool call ids, errors, aux detection, exhaustion.
#[test]
fn fake_server_speaks_the_openai_sdk_protocol() {
    let server = FakeOpenAi::start(json!({
        "model": "scripted-model",
        "responses": [
            {"tool_calls": [{"name": "terminal", "arguments": {"command": "ls"}},
                            {"name": "terminal", "arguments": {"command": "pwd"}}],
             "usage": {"prompt_tokens": 11, "completion_tokens": 7, "cached_tokens": 5, "reasoning_tokens": 3}},
            {"error": 500},
            {"error": 429},
            {"content": "plain answer"},
            {"content": "last answer"}
        ]
    }));
    let code = r#"
import json, os, openai
client = openai.OpenAI(base_url=os.environ["BASE_URL"], api_key="x", max_retries=0)
tools = [{"type": "function", "function": {"name": "terminal", "parameters": {"type": "object"}}}]
msgs = [{"role": "user", "content": "hi"}]
out = {"models": [m.id for m in client.models.list()]}
stream = client.chat.completions.create(model="scripted-model", messages=msgs, tools=tools, stream=True,
                                        stream_options={"include_usage": True})
calls, usage, finish = {}, None, None
for chunk in stream:
    if chunk.usage:
        usage = chunk.usage.model_dump()
    for choice in chunk.choices:
        finish = choice.finish_reason or finish
        for tc in choice.delta.tool_calls or []:
            c = calls.setdefault(tc.index, {"id": None, "name": "", "args": ""})
            c["id"] = tc.id or c["id"]
            if tc.function and tc.function.name:
                c["name"] = tc.function.name
            if tc.function and tc.function.arguments:
                c["args"] += tc.function.arguments
out["calls"] = [calls[i] for i in sorted(calls)]
out["usage"], out["finish"] = usage, finish
errors = []
for _ in range(2):
    try:
        client.chat.completions.create(model="scripted-model", messages=msgs, tools=tools, stream=True)
    except openai.APIStatusError as e:
        errors.append([e.status_code, e.body.get("type") if isinstance(e.body, dict) else None])
out["errors"] = errors
aux = client.chat.completions.create(model="scripted-model", messages=[
    {"role": "system", "content": "Generate a short, descriptive title (3-7 words) for ..."},
    {"role": "user", "content": "User: hi"}])
out["aux"] = aux.choices[0].message.content
texts = []
for _ in range(3):
    r = client.chat.completions.create(model="scripted-model", messages=msgs, tools=tools)
    texts.append(r.choices[0].message.content)
out["texts"] = texts
print(json.dumps(out))
"#;
    let mut cmd = std::process::Command::new(venv_bin("python"));
    cmd.arg("-c")
        .arg(code)
        .env("BASE_URL", server.base_url())
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT");
    let out = hermes_e2e::run_with_timeout(&mut cmd, Duration::from_secs(60));
    assert!(
        out.success(),
        "{}\nrequests:\n{}",
        out.describe(),
        server.describe_requests()
    );
    let stdout = out.stdout();
    let result: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {}", out.describe()));

    assert_eq!(result["models"], json!(["scripted-model"]));
    assert_eq!(
        result["calls"],
        json!([
            {"id": "call_1", "name": "terminal", "args": "{\"command\": \"ls\"}"},
            {"id": "call_2", "name": "terminal", "args": "{\"command\": \"pwd\"}"}
        ])
    );
    assert_eq!(result["finish"], json!("tool_calls"));
    let usage = &result["usage"];
    assert_eq!(usage["prompt_tokens"], json!(11));
    assert_eq!(usage["completion_tokens"], json!(7));
    assert_eq!(usage["total_tokens"], json!(18));
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], json!(5));
    assert_eq!(
        usage["completion_tokens_details"]["reasoning_tokens"],
        json!(3)
    );
    assert_eq!(
        result["errors"],
        json!([[500, "server_error"], [429, "rate_limit_error"]])
    );
    assert_eq!(result["aux"], json!("Scripted Test Session"));
    // Non-streaming; then the script is exhausted and the last content repeats.
    assert_eq!(
        result["texts"],
        json!(["plain answer", "last answer", "last answer"])
    );

    let main = server.main_requests();
    assert_eq!(main.len(), 6, "{}", server.describe_requests());
    assert_eq!(server.aux_requests().len(), 1);
}

#[test]
#[should_panic(expected = "must never be set for the agent")]
fn otel_endpoint_is_refused_for_the_agent() {
    let home = HermesHome::new("http://127.0.0.1:9/v1", "fake-model");
    let _ = home.command(
        "hermes",
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")],
    );
}
