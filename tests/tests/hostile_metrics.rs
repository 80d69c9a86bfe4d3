//! Hostile metric labels and access to `/metrics`, against the collector
//! binary, with a raw gRPC client of the ingest:
//! - a turn with 20 000 distinct tool names and one with ten 500 KB tool
//!   names: `/metrics` stays under 1 MB and the resident set bounded, the
//!   values past the bounds are counted as overflows and cuts, and ingest
//!   is still accepted afterwards;
//! - an `sk-proj-…` key planted in a tool name and in the model never
//!   reaches `/metrics` (the derived metrics are recorded from the redacted
//!   spans);
//! - with `admin.metrics_auth`, a scrape without the token or with a wrong
//!   one gets 401 (counted), with it 200, while `/livez` and `/readyz`
//!   answer without it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use hermes_e2e::collector::{Collector, admin_request};
use hermes_e2e::fault::metric_sum;
use hermes_e2e::ingest::{batch_of, events_of, exchange, fixture_records};
use hermes_e2e::{wait_until, write_file};
use hermes_proto::v1::Event;
use prost::Message as _;
use serde_json::Value as Json;

const WAIT: Duration = Duration::from_secs(60);
/// The fixture's session id, replaced per turn so that turns differ.
const FIXTURE_SESSION: &str = "20261129_200230_bbf019";
/// A planted OpenAI project key.
const KEY: &str = "sk-proj-Vb7Qm2Xr9Lk4Tz8Wn3Hc6Jd1Fs5Pg0Ya";
/// The largest `/metrics` allowed, whatever the labels sent.
const MAX_METRICS_BYTES: usize = 1024 * 1024;

/// The basic fixture's turn (session `session`, model `model`) with its one
/// tool call replaced by one call per name of `tools`, as wire events
/// converted exactly as the shim does.
fn turn_events(session: &str, model: &str, tools: &[String]) -> Vec<Event> {
    let records: Vec<Json> = fixture_records("basic")
        .into_iter()
        .map(|r| serde_json::from_str(&r.to_string().replace(FIXTURE_SESSION, session)).unwrap())
        .collect();
    let hook_at = |hook: &str, from: usize| {
        from + records[from..]
            .iter()
            .position(|r| r["hook"] == hook)
            .unwrap()
    };
    let pre = hook_at("pre_tool_call", 0);
    let post = hook_at("post_tool_call", pre);
    let after = hook_at("pre_api_request", post);
    let mut turn: Vec<Json> = records[..pre].to_vec();
    for (i, name) in tools.iter().enumerate() {
        for template in [&records[pre], &records[post]] {
            let mut call = template.clone();
            call["kwargs"]["tool_name"] = name.as_str().into();
            call["kwargs"]["tool_call_id"] = format!("call-{i}").into();
            turn.push(call);
        }
    }
    turn.extend_from_slice(&records[after..]);
    for record in &mut turn {
        if record["kwargs"].get("model").is_some() {
            record["kwargs"]["model"] = model.into();
        }
    }
    events_of(&turn)
}

/// Sends `events` as one shim instance's stream, in batches of at most
/// 2 MB, and waits for every acknowledgement.
fn send(endpoint: &str, instance_id: &str, events: Vec<Event>) {
    let mut batches = Vec::new();
    let mut batch = Vec::new();
    let mut bytes = 0;
    for event in events {
        let len = event.encoded_len();
        if bytes + len > 2 * 1024 * 1024 && !batch.is_empty() {
            batches.push(std::mem::take(&mut batch));
            bytes = 0;
        }
        bytes += len;
        batch.push(event);
    }
    batches.push(batch);
    let expected = batches.len();
    let batches = batches
        .into_iter()
        .map(|events| batch_of(instance_id, events))
        .collect();
    let acks = exchange(endpoint, None, batches)
        .unwrap_or_else(|status| panic!("batches refused: {status:?}"));
    assert_eq!(acks.len(), expected, "not every batch was acknowledged");
}

/// The collector with a span file as its only exporter and the admin
/// server on an ephemeral port; `extra` is appended to its configuration.
fn start(work: &Path, extra: &str) -> Collector {
    let sections = format!(
        "{extra}exporters:\n  file:\n    path: {}\nbatch:\n  timeout_ms: 50\n",
        work.join("spans.jsonl").display()
    );
    Collector::start_with_sections(work, &sections)
}

/// The resident set of `pid` in KiB (`VmRSS` of `/proc/<pid>/status`).
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// The body of an HTTP response.
fn body(response: &str) -> &str {
    response.split_once("\r\n\r\n").map_or("", |(_, b)| b)
}

/// The overflows of the tool metric's labels counted in `text`.
fn tool_overflows(text: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(
                "hermes_collector_metrics_label_overflows_total{metric=\"hermes_tool_duration\"} ",
            )
        })
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no tool overflows in:\n{text}"))
}

/// The tool calls recorded under the tool name `other` in `text`.
fn tool_calls_as_other(text: &str) -> f64 {
    metric_sum(
        &text
            .lines()
            .filter(|l| l.contains("gen_ai_tool_name=\"other\""))
            .collect::<Vec<_>>()
            .join("\n"),
        "hermes_tool_duration_seconds_count",
    )
}

/// Waits until `/metrics` counts `calls` tool calls; the last scrape.
fn wait_for_tool_calls(collector: &Collector, calls: f64) -> String {
    let mut scrape = String::new();
    let counted = wait_until(WAIT, Duration::from_millis(200), || {
        scrape = collector.admin_get("/metrics");
        metric_sum(body(&scrape), "hermes_tool_duration_seconds_count") >= calls
    });
    assert!(
        counted,
        "{calls} tool calls not counted:\n{}\n{}",
        body(&scrape)
            .lines()
            .take(50)
            .collect::<Vec<_>>()
            .join("\n"),
        collector.guard.stderr_text()
    );
    scrape
}

#[test]
fn hostile_tool_names_leave_metrics_and_memory_bounded() {
    let work = tempfile::tempdir().unwrap();
    let mut collector = start(work.path(), "");
    let pid = collector.guard.pid();
    let idle_kib = rss_kib(pid);

    // 20 000 distinct tool names in one turn, one of them with a key.
    let mut tools: Vec<String> = (0..20_000).map(|i| format!("tool-{i:05}")).collect();
    tools[3] = format!("deploy-{KEY}");
    send(
        &collector.endpoint,
        "i-many",
        turn_events("s-many", &format!("model-{KEY}"), &tools),
    );
    let scrape = wait_for_tool_calls(&collector, 20_000.0);
    let text = body(&scrape);
    assert!(
        text.len() < MAX_METRICS_BYTES,
        "/metrics is {} bytes",
        text.len()
    );
    assert!(!scrape.contains(&KEY[8..]), "the key reached /metrics");
    assert!(
        text.contains("gen_ai_tool_name=\"deploy-<redacted>\""),
        "the redacted name is the label"
    );
    assert!(text.contains("gen_ai_request_model=\"model-<redacted>\""));
    // 100 tool names kept (the default max_label_values), the rest `other`,
    // each such call counted.
    let names: std::collections::HashSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("hermes_tool_duration_seconds_count{gen_ai_tool_name=\""))
        .filter_map(|l| l.split('"').next())
        .collect();
    assert_eq!(names.len(), 101, "{names:?}");
    assert!(names.contains("other"));
    let overflows = tool_overflows(text);
    assert!(overflows >= 19_900.0, "{text}");
    assert_eq!(overflows, tool_calls_as_other(text), "{text}");
    // The log reaches the test through a pipe reader thread: wait for it.
    assert!(
        collector
            .guard
            .wait_for_stderr(Duration::from_secs(10), |l| l.contains("overflows=16384")),
        "logged at powers of two: {}",
        collector.guard.stderr_text()
    );

    // Ten tool names of 500 KB each.
    let huge: Vec<String> = (0..10)
        .map(|i| format!("{i}{}", "n".repeat(500 * 1024)))
        .collect();
    send(
        &collector.endpoint,
        "i-huge",
        turn_events("s-huge", "model-huge", &huge),
    );
    let calls = metric_sum(text, "hermes_tool_duration_seconds_count");
    let scrape = wait_for_tool_calls(&collector, calls + 10.0);
    let text = body(&scrape);
    assert!(
        text.len() < MAX_METRICS_BYTES,
        "/metrics is {} bytes",
        text.len()
    );
    assert!(
        text.lines().all(|l| l.len() < 4096),
        "no label value longer than its bound"
    );
    assert!(metric_sum(text, "hermes_collector_metrics_label_values_cut_total") >= 10.0);
    assert!(tool_overflows(text) >= overflows + 10.0, "{text}");
    assert_eq!(tool_overflows(text), tool_calls_as_other(text), "{text}");
    let calls = metric_sum(text, "hermes_tool_duration_seconds_count");

    // Scrapes allocate nothing that stays, and ingest is still accepted.
    for _ in 0..5 {
        assert!(body(&collector.admin_get("/metrics")).len() < MAX_METRICS_BYTES);
    }
    let rss = rss_kib(pid);
    assert!(
        rss < idle_kib + 150 * 1024,
        "resident set {idle_kib} KiB idle, {rss} KiB after"
    );
    send(
        &collector.endpoint,
        "i-after",
        turn_events("s-after", "model-after", &["terminal".to_owned()]),
    );
    wait_for_tool_calls(&collector, calls + 1.0);
    assert_eq!(
        metric_sum(
            body(&collector.admin_get("/metrics")),
            "hermes_collector_receiver_memory_refusals_total"
        ),
        0.0
    );
}

#[test]
fn metrics_require_the_token_when_configured_and_probes_stay_open() {
    const TOKEN: &str = "6d1f0c9e2b7a458391c0e7d2f6a8b4c1-scrape-token";
    let work = tempfile::tempdir().unwrap();
    let token_file = write_file(work.path(), "metrics-token", format!("{TOKEN}\n"));
    let mut collector = start(
        work.path(),
        &format!(
            "  metrics_auth:\n    token_file: {}\n",
            token_file.display()
        ),
    );
    let get = |path: &str, headers: &[(&str, &str)]| admin_request(&collector.guard, path, headers);
    let status = |response: &str| response.lines().next().unwrap_or("").to_owned();

    let missing = get("/metrics", &[]);
    assert!(status(&missing).contains("401"), "{missing}");
    assert!(missing.contains("www-authenticate: Bearer"), "{missing}");
    assert!(!missing.contains("hermes_collector"), "no metric leaks");
    let wrong = get(
        "/metrics",
        &[(
            "Authorization",
            "Bearer 6d1f0c9e2b7a458391c0e7d2f6a8b4c1-scrape-tokem",
        )],
    );
    assert!(status(&wrong).contains("401"), "{wrong}");
    let basic = get("/metrics", &[("Authorization", &format!("Basic {TOKEN}"))]);
    assert!(status(&basic).contains("401"), "{basic}");

    for probe in ["/livez", "/readyz"] {
        let response = get(probe, &[]);
        assert!(status(&response).contains("200"), "{probe}: {response}");
    }
    let bearer = format!("Bearer {TOKEN}");
    let scrape = get("/metrics", &[("Authorization", &bearer)]);
    assert!(status(&scrape).contains("200"), "{scrape}");
    assert_eq!(
        metric_sum(body(&scrape), "hermes_collector_admin_auth_failures_total"),
        3.0,
        "{scrape}"
    );
    // The log reaches the test through a pipe reader thread: wait for it.
    let logged = collector
        .guard
        .wait_for_stderr(Duration::from_secs(10), |l| l.contains("auth_failures=2"));
    let log = collector.guard.stderr_text();
    assert!(logged, "{log}");
    assert!(log.contains("metrics_auth=true"), "{log}");
    assert!(!log.contains(TOKEN), "the token is never logged");
}
