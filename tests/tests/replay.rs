//! Replays the recorded hook calls of real Hermes 0.19.0 runs
//! (`tests/fixtures/hermes-0.19.0/*.jsonl`, copied from the team's shared
//! recordings) through the shim's conversion
//! (kwargs → wire events, attempt numbering) and the correlator, and checks
//! the trees they give; shuffled and redelivered arrivals go through the
//! collector's correlation stage itself (`hermes_pipeline`'s driver).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use hermes_collector_shim::config::CaptureLevel;
use hermes_correlator::sequencer::{Sequencer, SequencerConfig};
use hermes_correlator::{Config, Correlation, Correlator, FinishedSpan, to_resource_spans};
use hermes_e2e::ingest::{FIXTURES, events_at, events_of, fixture_records};
use hermes_e2e::{AttrsExt, SpanTree};
use hermes_pipeline::clock::TokioClock;
use hermes_pipeline::driver::Driver;
use hermes_processor::{ProcessorConfig, SpanProcessor};
use hermes_proto::v1;
use hermes_receiver::Ingested;
use opentelemetry_proto::tonic::trace::v1::{Span, status::StatusCode};
use proptest::prelude::*;
use proptest::sample::Index;
use prost::Message;
use serde_json::Value as Json;
use tokio_util::sync::CancellationToken;

fn shim() -> v1::ShimInfo {
    v1::ShimInfo {
        instance_id: "replay".into(),
        service_name: "hermes-agent".into(),
        host_name: "host".into(),
        pid: 1,
        shim_version: "test".into(),
        capture: "metadata".into(),
    }
}

fn correlate(events: &[v1::Event]) -> Vec<FinishedSpan> {
    let mut c = Correlator::new(Config::default());
    let mut out = Vec::new();
    for e in events {
        c.ingest(&shim(), e, &mut out);
    }
    c.flush_all(&mut out);
    out
}

fn int(span: &Span, key: &str) -> i64 {
    span.int_attr(key)
        .unwrap_or_else(|| panic!("no int {key} on {}", span.name))
}

fn string<'a>(span: &'a Span, key: &str) -> &'a str {
    span.str_attr(key)
        .unwrap_or_else(|| panic!("no string {key} on {}", span.name))
}

/// The fixture's `records` captured at `level`, correlated, as the tree of
/// OTLP spans the collector exports. Checks what every replay must hold: a
/// well formed tree (see [`SpanTree::problems`]) of unique spans, each with
/// a `session.id`, none incomplete.
fn replay(records: &[Json], level: CaptureLevel) -> SpanTree {
    tree_of(correlate(&events_at(records, level)))
}

fn tree_of(spans: Vec<FinishedSpan>) -> SpanTree {
    let batch = hermes_span::convert::to_otlp(&to_resource_spans(spans));
    let tree = SpanTree::new(batch.into_iter().flat_map(|rs| {
        let resource = rs.resource.unwrap_or_default();
        rs.scope_spans
            .into_iter()
            .flat_map(|ss| ss.spans)
            .map(move |span| (resource.clone(), span))
    }));
    tree.assert_well_formed();
    assert!(tree.duplicates().is_empty(), "span ids are unique");
    for span in tree.spans() {
        assert!(!string(span, "session.id").is_empty());
        assert!(
            !span.has_attr("hermes.incomplete"),
            "{} is incomplete",
            span.name
        );
    }
    tree
}

/// `prompt_tokens`/`output_tokens` of every post_api_request, in order.
fn usages(records: &[Json]) -> Vec<(i64, i64)> {
    records
        .iter()
        .filter(|r| r["hook"] == "post_api_request")
        .map(|r| {
            let u = &r["kwargs"]["usage"];
            (
                u["prompt_tokens"].as_i64().expect("prompt_tokens"),
                u["output_tokens"].as_i64().expect("output_tokens"),
            )
        })
        .collect()
}

#[test]
fn basic_fixture_is_one_turn_with_two_chats_and_a_tool() {
    let records = fixture_records("basic");
    let tree = replay(&records, CaptureLevel::Metadata);
    assert_eq!(tree.len(), 4);
    let roots = tree.find_all("invoke_agent hermes");
    assert_eq!(roots.len(), 1);
    let root = roots[0];
    assert!(root.parent_span_id.is_empty());
    assert_eq!(
        root.events
            .iter()
            .filter(|e| e.name == "hermes.session.start")
            .count(),
        1
    );
    let chats = tree.find_all("chat fake-model-1");
    assert_eq!(chats.len(), 2);
    let got: Vec<(i64, i64)> = chats
        .iter()
        .map(|c| {
            (
                int(c, "gen_ai.usage.input_tokens"),
                int(c, "gen_ai.usage.output_tokens"),
            )
        })
        .collect();
    assert_eq!(got, usages(&records));
    let tools = tree.find_all("execute_tool terminal");
    assert_eq!(tools.len(), 1);
    assert_eq!(string(tools[0], "gen_ai.tool.call.id"), "call_542ef10e36a7");
    assert_eq!(int(root, "hermes.turn.tool_calls"), 1);
    assert_eq!(int(root, "hermes.turn.api_attempts"), 2);
    assert_eq!(string(root, "hermes.platform"), "cli");
}

#[test]
fn retry_fixture_has_one_span_per_attempt() {
    let records = fixture_records("retry");
    let tree = replay(&records, CaptureLevel::Metadata);
    let chats = tree.find_all("chat fake-model-1");
    assert_eq!(
        chats.len(),
        4,
        "two requests, each failed once then succeeded"
    );
    let failed: Vec<&&Span> = chats
        .iter()
        .filter(|c| {
            c.status
                .as_ref()
                .is_some_and(|s| s.code == StatusCode::Error as i32)
        })
        .collect();
    assert_eq!(failed.len(), 2);
    let codes: Vec<i64> = failed
        .iter()
        .map(|c| int(c, "http.response.status_code"))
        .collect();
    assert_eq!(codes, vec![500, 429]);
    assert_eq!(string(failed[0], "error.type"), "server_error");
    assert_eq!(string(failed[1], "error.type"), "rate_limit");
    let attempts: Vec<(&str, i64)> = chats
        .iter()
        .map(|c| (string(c, "hermes.api_request_id"), int(c, "hermes.attempt")))
        .collect();
    assert!(attempts[0].0.ends_with(":api:1") && attempts[0].1 == 1);
    assert!(attempts[1].0.ends_with(":api:1") && attempts[1].1 == 2);
    assert!(attempts[2].0.ends_with(":api:2") && attempts[2].1 == 1);
    assert!(attempts[3].0.ends_with(":api:2") && attempts[3].1 == 2);
    // The retry starts at its own pre_api_request, after the failure ended.
    assert!(chats[1].start_time_unix_nano >= chats[0].end_time_unix_nano);
    assert_eq!(tree.find_all("execute_tool terminal").len(), 1);
}

#[test]
fn lean_level_still_gives_every_attempt() {
    let records = fixture_records("retry");
    let tree = replay(&records, CaptureLevel::Lean);
    assert_eq!(tree.find_all("chat fake-model-1").len(), 4);
}

#[test]
fn parallel_fixture_has_two_tools_from_worker_threads() {
    let records = fixture_records("parallel");
    let events = events_at(&records, CaptureLevel::Metadata);
    assert!(
        events
            .iter()
            .any(|e| e.thread.starts_with("ThreadPoolExecutor")),
        "posts come from workers"
    );
    let tree = tree_of(correlate(&events));
    let tools = tree.find_all("execute_tool read_file");
    assert_eq!(tools.len(), 2);
    assert_ne!(
        string(tools[0], "gen_ai.tool.call.id"),
        string(tools[1], "gen_ai.tool.call.id")
    );
    assert_eq!(tree.find_all("chat fake-model-1").len(), 2);
}

#[test]
fn multiturn_fixture_is_one_trace_per_turn_in_one_session() {
    let records = fixture_records("multiturn");
    let tree = replay(&records, CaptureLevel::Metadata);
    let roots = tree.find_all("invoke_agent hermes");
    assert_eq!(roots.len(), 3);
    let traces: std::collections::HashSet<&Vec<u8>> = roots.iter().map(|r| &r.trace_id).collect();
    assert_eq!(traces.len(), 3, "one trace per turn");
    let sessions: std::collections::HashSet<&str> = tree
        .spans()
        .iter()
        .map(|s| string(s, "session.id"))
        .collect();
    assert_eq!(sessions.len(), 1, "all turns share the session");
    let with_start = roots
        .iter()
        .filter(|r| r.events.iter().any(|e| e.name == "hermes.session.start"))
        .count();
    assert_eq!(
        with_start, 1,
        "the session start belongs to the first turn only"
    );
    let tools: Vec<i64> = roots
        .iter()
        .map(|r| int(r, "hermes.turn.tool_calls"))
        .collect();
    let mut sorted = tools.clone();
    sorted.sort();
    assert_eq!(sorted, vec![0, 1, 1]);
}

#[test]
fn replay_is_deterministic() {
    for name in FIXTURES {
        let records = fixture_records(name);
        let a = correlate(&events_at(&records, CaptureLevel::Metadata));
        let b = correlate(&events_at(&records, CaptureLevel::Metadata));
        assert_eq!(a, b, "{name}");
    }
}

/// Feeds `events` one by one in the given arrival order through the
/// collector's correlation stage itself (`hermes_pipeline`'s driver, on
/// tokio's paused clock, with the default processing), then ends it;
/// returns every exported span in [`canonical`] form.
fn correlate_arrivals(arrivals: &[v1::Event]) -> Vec<Vec<u8>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(async {
        let driver = Driver::in_memory(
            Correlation::new(
                Sequencer::new(SequencerConfig::default()),
                Correlator::new(Config::default()),
            ),
            SpanProcessor::new(&ProcessorConfig::default()).unwrap(),
            TokioClock::starting_at(0),
        );
        let (ingest, ingest_rx) = tokio::sync::mpsc::channel(arrivals.len() + 1);
        let (export, mut exported) = tokio::sync::mpsc::channel(arrivals.len() + 1);
        for e in arrivals {
            let batch = v1::EventBatch {
                shim: Some(shim()),
                events: vec![e.clone()],
                ..Default::default()
            };
            ingest
                .try_send(Ingested::new(
                    hermes_proto::wire::WireBatch::encode(&batch).unwrap(),
                ))
                .unwrap();
        }
        drop(ingest);
        let stage = tokio::spawn(driver.run(ingest_rx, export, CancellationToken::new()));
        let mut spans = Vec::new();
        while let Some(batch) = exported.recv().await {
            spans.extend(canonical(
                batch
                    .into_spans()
                    .expect("no encoder: the spans as they are"),
            ));
        }
        stage.await.unwrap();
        spans.sort();
        spans
    })
}

/// Each span as OTLP bytes with its resource and scope, in a fixed order,
/// whichever export message carried it.
fn canonical(batch: Vec<hermes_span::trace::v1::ResourceSpans>) -> Vec<Vec<u8>> {
    let mut spans = Vec::new();
    for rs in hermes_span::convert::to_otlp(&batch) {
        for ss in &rs.scope_spans {
            for span in &ss.spans {
                let mut bytes = rs
                    .resource
                    .as_ref()
                    .map(Message::encode_to_vec)
                    .unwrap_or_default();
                bytes.extend(
                    ss.scope
                        .as_ref()
                        .map(Message::encode_to_vec)
                        .unwrap_or_default(),
                );
                bytes.extend(span.encode_to_vec());
                spans.push(bytes);
            }
        }
    }
    spans.sort();
    spans
}

/// What the stage exports of `spans`: processed as it processes them.
fn processed(spans: Vec<FinishedSpan>) -> Vec<Vec<u8>> {
    let mut batch = to_resource_spans(spans);
    SpanProcessor::new(&ProcessorConfig::default())
        .unwrap()
        .process(&mut batch);
    canonical(batch)
}

fn fixture_events() -> Vec<(&'static str, Vec<v1::Event>)> {
    FIXTURES
        .into_iter()
        .map(|name| (name, events_of(&fixture_records(name))))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any arrival order, with any events delivered again, gives
    /// byte-identical exported spans.
    #[test]
    fn any_arrival_order_and_delivery_count_gives_the_same_spans(
        fixture in 0usize..4,
        order in Just(()).prop_perturb(|_, mut rng| rng.next_u64()),
        duplicates in proptest::collection::vec((any::<Index>(), any::<Index>()), 0..40),
    ) {
        let fixtures = fixture_events();
        let (name, events) = &fixtures[fixture];
        let expected = processed(correlate(events));
        // A deterministic shuffle from the drawn seed (Fisher-Yates on an LCG).
        let mut arrivals = events.clone();
        let mut state = order | 1;
        for i in (1..arrivals.len()).rev() {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let j = (state >> 33) as usize % (i + 1);
            arrivals.swap(i, j);
        }
        for (which, at) in &duplicates {
            let event = events[which.index(events.len())].clone();
            let at = at.index(arrivals.len() + 1);
            arrivals.insert(at, event);
        }
        let got = correlate_arrivals(&arrivals);
        prop_assert!(got == expected, "{name}: output differs for this arrival order");
    }
}

#[test]
fn content_level_adds_messages_arguments_and_answers() {
    let records = fixture_records("basic");
    let tree = replay(&records, CaptureLevel::Content);
    let chats = tree.find_all("chat fake-model-1");
    let input: Json =
        serde_json::from_str(string(chats[0], "gen_ai.input.messages")).expect("input JSON");
    assert_eq!(input[0]["role"], "user");
    assert_eq!(
        input[0]["parts"][0]["content"],
        "Please run echo hermes-hook-test"
    );
    let system: Json =
        serde_json::from_str(string(chats[0], "gen_ai.system_instructions")).expect("system JSON");
    assert!(
        system[0]["content"]
            .as_str()
            .is_some_and(|s| s.starts_with("You are Hermes Agent"))
    );
    let output: Json =
        serde_json::from_str(string(chats[0], "gen_ai.output.messages")).expect("output JSON");
    assert_eq!(output[0]["parts"][0]["type"], "tool_call");
    assert_eq!(output[0]["parts"][0]["name"], "terminal");
    assert_eq!(
        output[0]["parts"][0]["arguments"]["command"],
        "echo hermes-hook-test"
    );
    let second: Json =
        serde_json::from_str(string(chats[1], "gen_ai.input.messages")).expect("input JSON");
    assert_eq!(
        second[2]["parts"][0]["type"], "tool_call_response",
        "{second}"
    );
    let tool = tree.find_all("execute_tool terminal")[0];
    let args: Json =
        serde_json::from_str(string(tool, "gen_ai.tool.call.arguments")).expect("args JSON");
    assert_eq!(
        args,
        serde_json::json!({"command": "echo hermes-hook-test"})
    );
    assert!(string(tool, "gen_ai.tool.call.result").contains("hermes-hook-test"));
    let root = tree.find_all("invoke_agent hermes")[0];
    assert_eq!(
        string(root, "hermes.turn.user_message"),
        "Please run echo hermes-hook-test"
    );
    assert!(string(root, "hermes.turn.final_answer").starts_with("Final answer"));

    // The default level carries none of it.
    let tree = replay(&records, CaptureLevel::Metadata);
    for span in tree.spans() {
        for key in [
            "gen_ai.input.messages",
            "gen_ai.output.messages",
            "gen_ai.system_instructions",
            "gen_ai.tool.call.arguments",
            "gen_ai.tool.call.result",
            "hermes.turn.user_message",
            "hermes.turn.final_answer",
        ] {
            assert!(
                !span.has_attr(key),
                "{key} on {} at level metadata",
                span.name
            );
        }
    }
}
