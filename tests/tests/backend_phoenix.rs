//! The README's Arize Phoenix recipe against a real Phoenix server
//! (`arize-phoenix` from PyPI, `tests/setup_phoenix.sh`): the real
//! `hermes-agent==0.19.0` with our shim, against the scripted OpenAI server,
//! through the real collector (OTLP/HTTP protobuf to Phoenix' `/v1/traces`,
//! `attribute_sets: [gen_ai, openinference]`), then Phoenix' own REST API
//! asked what it stored, as a user would see it.
//!
//! Two agents with two service names share one collector: one at the
//! default capture level, one at `content`. Each runs a turn with a tool, a
//! turn whose request is retried (500, 429, answer) and a `hermes -z` turn
//! that delegates to a subagent. Phoenix must hold every span the collector
//! exported (its file exporter beside `otlp` says which), in the project
//! named after the agent's service, with kinds AGENT/LLM/TOOL, the
//! subagent under `delegate_task`, token counts, failed attempts as errors,
//! and, with content capture only, the system and user messages in its
//! parsed input messages of every LLM span (at the default
//! `max_attribute_bytes`, which cuts Hermes' system prompt) and input and
//! output on every turn.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use hermes_e2e::collector::Collector;
use hermes_e2e::hermes::DEFAULT_RUN_TIMEOUT;
use hermes_e2e::{FakeOpenAi, HermesHome, PhoenixServer, PhoenixSpan, free_port, wait_until};
use serde_json::{Value, json};

/// Bound on the export of finished runs to the file and to Phoenix.
const EXPORT_WAIT: Duration = Duration::from_secs(90);

/// Spans of one agent: 4 (tool turn) + 4 (retried turn) + 9 (subagent).
const SPANS_PER_AGENT: usize = 17;

/// What the prompts and answers hold, to find content where none may be.
const PROMPT_MARK: &str = "zebra-prompt";
const ANSWER_MARK: &str = "quokka-answer";

/// The three turns' script, consumed in order (auxiliary requests do not
/// consume entries; the delegation under `hermes -z` is synchronous).
fn script() -> Value {
    json!([
        // 1. A tool call, then the answer.
        {"tool_calls": [{"name": "terminal", "arguments": {"command": "echo from-tool"}}],
         "usage": {"prompt_tokens": 120, "completion_tokens": 10}},
        {"content": format!("Tool ran: {ANSWER_MARK} one."),
         "usage": {"prompt_tokens": 150, "completion_tokens": 15}},
        // 2. Two failed attempts, then the answer.
        {"error": 500},
        {"error": 429, "retry_after": 0.1},
        {"content": format!("Recovered: {ANSWER_MARK} two."),
         "usage": {"prompt_tokens": 321, "completion_tokens": 12}},
        // 3. Delegation: the parent's call, the child's two, the parent's answer.
        {"tool_calls": [{"name": "delegate_task",
                         "arguments": {"goal": format!("Run echo from-child ({PROMPT_MARK} goal)")}}],
         "usage": {"prompt_tokens": 111, "completion_tokens": 11}},
        {"tool_calls": [{"name": "terminal", "arguments": {"command": "echo from-child"}}],
         "usage": {"prompt_tokens": 200, "completion_tokens": 20}},
        {"content": "The child printed from-child.",
         "usage": {"prompt_tokens": 300, "completion_tokens": 30}},
        {"content": format!("Parent done: {ANSWER_MARK} three."),
         "usage": {"prompt_tokens": 444, "completion_tokens": 44}}
    ])
}

/// Token counts of the successful LLM spans, (prompt, completion).
const USAGE: [(i64, i64); 7] = [
    (120, 10),
    (150, 15),
    (321, 12),
    (111, 11),
    (200, 20),
    (300, 30),
    (444, 44),
];

/// The first ```yaml block after the line `marker` in `file` (repo-relative).
fn yaml_block(file: &str, marker: &str) -> String {
    let text = std::fs::read_to_string(hermes_e2e::repo_root().join(file))
        .unwrap_or_else(|e| panic!("read {file}: {e}"));
    let after = text
        .lines()
        .skip_while(|l| l.trim() != marker)
        .skip(1)
        .skip_while(|l| l.trim() != "```yaml")
        .skip(1);
    let body: Vec<&str> = after.take_while(|l| l.trim() != "```").collect();
    assert!(
        !body.is_empty(),
        "{file}: no ```yaml block after {marker:?}"
    );
    body.join("\n") + "\n"
}

/// README.md's Phoenix recipe (which deploy/README.md repeats), as the
/// collector runs it here: its ports changed, the admin server on an
/// ephemeral port and a file exporter added to record what was exported.
fn collector_yaml(listen: &str, phoenix: &str, spans_file: &str) -> String {
    let recipe = yaml_block("README.md", "<!-- tested: backend_phoenix -->");
    assert_eq!(
        yaml_block("deploy/README.md", "### Arize Phoenix"),
        recipe,
        "deploy/README.md's Phoenix recipe is README.md's"
    );
    for (needle, what) in [
        ("listen: 127.0.0.1:4319\n", "the receiver"),
        ("endpoint: http://127.0.0.1:6006\n", "Phoenix"),
    ] {
        assert_eq!(recipe.matches(needle).count(), 1, "{what} in:\n{recipe}");
    }
    assert!(
        recipe.trim_end().ends_with("protocol: http/protobuf"),
        "the recipe ends with its otlp exporter (the file exporter is added after it):\n{recipe}"
    );
    let yaml = recipe
        .replace("listen: 127.0.0.1:4319\n", &format!("listen: {listen}\n"))
        .replace(
            "endpoint: http://127.0.0.1:6006\n",
            &format!("endpoint: {phoenix}\n"),
        );
    format!("{yaml}  file:\n    path: {spans_file}\nadmin:\n  listen: 127.0.0.1:0\n")
}

/// Runs the three turns as the agent `service` at `capture` level.
fn run_agent(collector: &Collector, service: &str, capture: Option<&str>) {
    let server = FakeOpenAi::start(script());
    let home = HermesHome::new(&server.base_url(), server.model());
    home.enable_plugin("hermes_collector");
    let mut env = vec![
        ("HERMES_COLLECTOR_ENDPOINT", collector.endpoint.as_str()),
        ("HERMES_COLLECTOR_SERVICE_NAME", service),
    ];
    if let Some(level) = capture {
        env.push(("HERMES_COLLECTOR_CAPTURE", level));
    }
    let runs: [(&[&str], &str); 3] = [
        (&["chat", "-Q", "-t", "terminal"], "Run echo from-tool"),
        (&["chat", "-Q", "-t", "terminal"], "Say hello"),
        (&["-z"], "Delegate running echo from-child to a subagent"),
    ];
    for (i, (args, query)) in runs.iter().enumerate() {
        let query = format!("{query} ({PROMPT_MARK} {i})");
        let mut argv: Vec<&str> = args.to_vec();
        if argv[0] == "chat" {
            argv.extend(["-q", &query]);
        } else {
            argv.push(&query);
            argv.extend(["-t", "terminal,delegation"]);
        }
        let out = home.hermes(&argv, &env, DEFAULT_RUN_TIMEOUT);
        assert!(
            out.success() && out.stdout().contains(ANSWER_MARK),
            "{service}: hermes {argv:?}\n{}\n--- requests ---\n{}",
            out.describe(),
            server.describe_requests()
        );
    }
    assert_eq!(
        server.main_requests().len(),
        9,
        "{}",
        server.describe_requests()
    );
}

/// An exported span, from the collector's file exporter.
struct Exported {
    service: String,
    project: Option<String>,
    trace_id: String,
    span_id: String,
}

/// Every span in the file exporter's OTLP JSON lines.
fn exported(path: &std::path::Path) -> Vec<Exported> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let batch: Value = serde_json::from_str(line).expect("file exporter line is JSON");
        for rs in batch["resourceSpans"].as_array().into_iter().flatten() {
            let resource = |key: &str| {
                rs["resource"]["attributes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|kv| kv["key"] == key)
                    .and_then(|kv| kv["value"]["stringValue"].as_str())
                    .map(String::from)
            };
            let service = resource("service.name").unwrap_or_default();
            let project = resource("openinference.project.name");
            for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
                for span in ss["spans"].as_array().into_iter().flatten() {
                    out.push(Exported {
                        service: service.clone(),
                        project: project.clone(),
                        trace_id: span["traceId"].as_str().unwrap_or("").to_string(),
                        span_id: span["spanId"].as_str().unwrap_or("").to_string(),
                    });
                }
            }
        }
    }
    out
}

/// `hermes_collector_exporter_sent_spans_total{exporter="NAME"}`.
fn sent(collector: &Collector, exporter: &str) -> f64 {
    let metrics = collector.admin_get("/metrics");
    let prefix = format!("hermes_collector_exporter_sent_spans_total{{exporter=\"{exporter}\"");
    metrics
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| l.rsplit(' ').next()?.trim().parse::<f64>().ok())
        .sum()
}

fn render(spans: &[PhoenixSpan]) -> String {
    let mut lines: Vec<String> = spans
        .iter()
        .map(|s| {
            format!(
                "{} {} {} parent={:?} {} {}",
                s.trace_id(),
                s.span_id(),
                s.name(),
                s.parent_id(),
                s.kind(),
                s.status_code()
            )
        })
        .collect();
    lines.sort();
    lines.join("\n")
}

/// What every project must show, whatever the capture level.
fn assert_structure(service: &str, spans: &[PhoenixSpan]) {
    let ctx = || format!("project {service}:\n{}", render(spans));
    let by_id: BTreeMap<&str, &PhoenixSpan> = spans.iter().map(|s| (s.span_id(), s)).collect();

    // Kinds: nothing UNKNOWN (nor CHAIN: these turns have no approval).
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for s in spans {
        *kinds.entry(s.kind()).or_default() += 1;
        let expected = match s.name() {
            n if n.starts_with("invoke_agent ") => "AGENT",
            n if n.starts_with("chat ") => "LLM",
            n if n.starts_with("execute_tool ") => "TOOL",
            _ => "?",
        };
        assert_eq!(s.kind(), expected, "{} kind\n{}", s.name(), ctx());
    }
    assert_eq!(
        kinds,
        BTreeMap::from([("AGENT", 5), ("LLM", 9), ("TOOL", 3)]),
        "{}",
        ctx()
    );

    // Three traces, one root each, every parent stored in the same trace.
    let roots: Vec<&PhoenixSpan> = spans.iter().filter(|s| s.parent_id().is_none()).collect();
    assert_eq!(roots.len(), 3, "{}", ctx());
    let traces: BTreeSet<&str> = spans.iter().map(|s| s.trace_id()).collect();
    assert_eq!(traces.len(), 3, "{}", ctx());
    for s in spans {
        if let Some(parent) = s.parent_id() {
            let p = by_id
                .get(parent)
                .unwrap_or_else(|| panic!("{}: parent {parent} not stored\n{}", s.name(), ctx()));
            assert_eq!(p.trace_id(), s.trace_id(), "{}", ctx());
        }
    }

    // Nesting: the subagent under `execute_tool delegate_task`, the child
    // turn under the subagent, the child's calls under the child turn.
    let delegate = spans
        .iter()
        .find(|s| s.name() == "execute_tool delegate_task")
        .unwrap_or_else(|| panic!("no delegate_task span\n{}", ctx()));
    let sub: Vec<&PhoenixSpan> = spans
        .iter()
        .filter(|s| s.parent_id() == Some(delegate.span_id()))
        .collect();
    assert_eq!(sub.len(), 1, "one subagent under delegate_task\n{}", ctx());
    let sub = sub[0];
    assert_eq!(sub.name(), "invoke_agent leaf", "{}", ctx());
    assert_eq!(sub.kind(), "AGENT", "{}", ctx());
    assert_eq!(sub.str_attr("agent.name"), Some("leaf"), "{}", ctx());
    let child: Vec<&PhoenixSpan> = spans
        .iter()
        .filter(|s| s.parent_id() == Some(sub.span_id()))
        .collect();
    assert_eq!(child.len(), 1, "one child turn\n{}", ctx());
    let mut grandchildren: Vec<&str> = spans
        .iter()
        .filter(|s| s.parent_id() == Some(child[0].span_id()))
        .map(|s| s.name())
        .collect();
    grandchildren.sort_unstable();
    assert_eq!(
        grandchildren,
        [
            "chat fake-model",
            "chat fake-model",
            "execute_tool terminal"
        ],
        "{}",
        ctx()
    );

    // Failed attempts are errors; the rest are not.
    let errors: Vec<&PhoenixSpan> = spans
        .iter()
        .filter(|s| s.status_code() == "ERROR")
        .collect();
    assert_eq!(errors.len(), 2, "two failed attempts\n{}", ctx());
    for e in &errors {
        assert_eq!(e.kind(), "LLM", "{}", ctx());
        assert!(
            e.status_message().contains("fake_openai scripted error"),
            "{}: {}\n{}",
            e.name(),
            e.status_message(),
            ctx()
        );
        assert!(e.int_attr("llm.token_count.prompt").is_none());
    }
    let retried = errors[0].trace_id();
    assert!(errors.iter().all(|e| e.trace_id() == retried));
    assert_eq!(
        spans
            .iter()
            .filter(|s| s.trace_id() == retried && s.kind() == "LLM")
            .count(),
        3,
        "three attempts in the retried turn\n{}",
        ctx()
    );

    // Token counts of every successful LLM span.
    let mut usage: Vec<(i64, i64)> = spans
        .iter()
        .filter(|s| s.kind() == "LLM" && s.status_code() != "ERROR")
        .map(|s| {
            let p = s.int_attr("llm.token_count.prompt").unwrap_or(-1);
            let c = s.int_attr("llm.token_count.completion").unwrap_or(-1);
            assert_eq!(
                s.int_attr("llm.token_count.total"),
                Some(p + c),
                "{} total\n{}",
                s.name(),
                ctx()
            );
            (p, c)
        })
        .collect();
    usage.sort_unstable();
    let mut expected = USAGE.to_vec();
    expected.sort_unstable();
    assert_eq!(usage, expected, "token counts\n{}", ctx());
    for s in spans.iter().filter(|s| s.kind() == "LLM") {
        assert_eq!(
            s.str_attr("llm.model_name"),
            Some("fake-model"),
            "{}",
            ctx()
        );
    }
    for s in spans.iter().filter(|s| s.kind() == "TOOL") {
        assert!(s.str_attr("tool.name").is_some(), "{}", ctx());
    }
}

/// Every stored attribute value as text, for "no content" checks.
fn all_values(span: &PhoenixSpan) -> String {
    span.0["attributes"].to_string()
}

fn assert_no_content(service: &str, spans: &[PhoenixSpan]) {
    for s in spans {
        let keys = s.attr_keys();
        for prefix in ["llm.input_messages", "llm.output_messages", "input.value"] {
            assert!(
                !keys.iter().any(|k| k.starts_with(prefix)),
                "{service}: {} has {prefix} at the default capture level: {keys:?}",
                s.name()
            );
        }
        let values = all_values(s);
        for mark in [PROMPT_MARK, ANSWER_MARK, "from-tool"] {
            assert!(
                !values.contains(mark),
                "{service}: {} shows content ({mark}) at the default capture level: {values}",
                s.name()
            );
        }
    }
}

fn assert_content(service: &str, spans: &[PhoenixSpan]) {
    for s in spans.iter().filter(|s| s.kind() == "LLM") {
        let roles = s.input_roles();
        let ctx = || {
            format!(
                "{service}: {} ({}) parsed input roles {roles:?}; attributes: {}",
                s.name(),
                s.span_id(),
                all_values(s)
            )
        };
        let system = roles
            .iter()
            .position(|r| r == "system")
            .unwrap_or_else(|| panic!("no system message\n{}", ctx()));
        let user = roles
            .iter()
            .position(|r| r == "user")
            .unwrap_or_else(|| panic!("no user message\n{}", ctx()));
        let system_text = s.input_text(system);
        assert!(
            system_text.len() > 200 && !system_text.contains("elided]"),
            "the system message is Hermes' system prompt (cut), not a marker: {system_text:?}\n{}",
            ctx()
        );
        assert!(
            s.input_text(user).contains(PROMPT_MARK),
            "the user message is the prompt (or the delegated goal): {:?}\n{}",
            s.input_text(user),
            ctx()
        );
    }
    // Input and output on every turn, the root's being the user's prompt
    // and the final answer.
    for s in spans.iter().filter(|s| s.kind() == "AGENT") {
        let input = s.str_attr("input.value").unwrap_or("");
        let output = s.str_attr("output.value").unwrap_or("");
        assert!(
            input.contains(PROMPT_MARK) && !output.is_empty(),
            "{service}: {} input {input:?} output {output:?}",
            s.name()
        );
        if s.parent_id().is_none() {
            assert!(
                output.contains(ANSWER_MARK),
                "{service}: root output {output:?}"
            );
        }
    }
}

#[test]
fn phoenix_shows_each_agent_in_its_project_with_and_without_content() {
    let phoenix = PhoenixServer::start();
    let work = tempfile::tempdir().expect("tempdir");
    let spans_file = work.path().join("spans.jsonl");
    let listen = format!("127.0.0.1:{}", free_port());
    let collector = Collector::start_with_config(
        work.path(),
        &listen,
        &collector_yaml(&listen, &phoenix.base_url(), &spans_file.to_string_lossy()),
    );

    let agents = [
        ("hermes-phoenix-metadata", None),
        ("hermes-phoenix-content", Some("content")),
    ];
    for (service, capture) in agents {
        run_agent(&collector, service, capture);
    }

    // Everything exported, to the file and to Phoenix alike.
    let total = SPANS_PER_AGENT * agents.len();
    let done = wait_until(EXPORT_WAIT, Duration::from_millis(200), || {
        exported(&spans_file).len() >= total && sent(&collector, "otlp_http") >= total as f64
    });
    let exported = exported(&spans_file);
    assert!(
        done,
        "exported {} of {total} spans (otlp_http sent {}); collector log:\n{}",
        exported.len(),
        sent(&collector, "otlp_http"),
        collector.guard.stderr_text()
    );
    assert_eq!(exported.len(), total);
    assert_eq!(sent(&collector, "otlp_http"), total as f64);
    assert_eq!(
        collector.metric("hermes_collector_exporter_send_failed_spans_total"),
        0.0
    );

    for (service, capture) in agents {
        let mine: Vec<&Exported> = exported.iter().filter(|e| e.service == service).collect();
        assert_eq!(mine.len(), SPANS_PER_AGENT, "{service}");
        assert!(
            mine.iter().all(|e| e.project.as_deref() == Some(service)),
            "{service}: openinference.project.name on the resource"
        );
        let stored = phoenix.wait_for_spans(service, SPANS_PER_AGENT, EXPORT_WAIT);
        let want: BTreeSet<(String, String)> = mine
            .iter()
            .map(|e| (e.trace_id.clone(), e.span_id.clone()))
            .collect();
        let got: BTreeSet<(String, String)> = stored
            .iter()
            .map(|s| (s.trace_id().to_string(), s.span_id().to_string()))
            .collect();
        assert_eq!(
            got,
            want,
            "{service}: Phoenix stores exactly the exported spans\n{}\n{}",
            render(&stored),
            phoenix.log()
        );
        println!("Phoenix project {service}:\n{}", render(&stored));
        for s in stored.iter().filter(|s| s.kind() == "LLM") {
            let roles = s.input_roles();
            let lens: Vec<usize> = (0..roles.len()).map(|i| s.input_text(i).len()).collect();
            println!(
                "  {} parsed input roles {roles:?}, text bytes {lens:?}",
                s.span_id()
            );
        }
        assert_structure(service, &stored);
        match capture {
            None => assert_no_content(service, &stored),
            Some(_) => assert_content(service, &stored),
        }
    }

    // Two agents, two projects; nothing in Phoenix' default project.
    let projects = phoenix.projects();
    for (service, _) in agents {
        assert!(
            projects.iter().any(|p| p == service),
            "{service} in {projects:?}"
        );
    }
    assert!(
        phoenix.spans("default").is_empty(),
        "nothing lands in `default`: {}",
        render(&phoenix.spans("default"))
    );
}
