//! The correlator's failed API attempt, processed with the default config:
//! the error text it puts in the span's status message and in the
//! `exception` event is redacted and cut alike.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use hermes_correlator::{Config, Correlator, FinishedSpan, to_resource_spans};
use hermes_e2e::events::{self, api_body, event, shim, turn_body};
use hermes_processor::{ProcessorConfig, SpanProcessor};
use hermes_proto::v1::{self, event::Body};
use hermes_span::common::v1::any_value::Value;
use hermes_span::trace::v1::status::StatusCode;

const TURN: &str = "20261129_200230_bbf019:task-1:1b06e77d";
const API: &str = "20261129_200230_bbf019:task-1:1b06e77d:api:1";

const SECRETS: [&str; 5] = [
    "sk-proj-AbCdEf0123456789GhIjKlMnOp",
    "Zx9bearerTokenValue77",
    "jane.doe@example.org",
    "dXNlcjpwYXNz",
    "pgS3cretVal",
];

fn ids(api: &str) -> v1::Ids {
    let turn = events::ids("20261129_200230_bbf019", "task-1", TURN);
    events::with_api(turn, api)
}

fn api(ended_ms: u64) -> v1::ApiCall {
    v1::ApiCall {
        platform: "cli".into(),
        provider: "openai".into(),
        api_call_count: 1,
        ..events::api_call("fake-model-1", 1, 8, ended_ms)
    }
}

/// The spans one correlator closes from these events of one agent, fed in
/// order, then flushed.
fn correlate(hooks: Vec<(&str, u64, v1::Ids, Option<Body>)>) -> Vec<FinishedSpan> {
    let mut correlator = Correlator::new(Config::default());
    let mut out = Vec::new();
    for (seq, (hook, t_ms, ids, body)) in (1..).zip(hooks) {
        let e = v1::Event {
            seq,
            ..event(hook, t_ms, ids, body)
        };
        correlator.ingest(&shim("inst-1"), &e, &mut out);
    }
    correlator.flush_all(&mut out);
    out
}

#[test]
fn an_api_error_with_secrets_gives_a_redacted_cut_status_message() {
    let error = format!(
        "Error code: 401 - invalid key {} (Authorization: Bearer {}) for {}; \
         retry with curl -H 'Authorization: Basic {}' or PGPASSWORD={} psql {}",
        SECRETS[0],
        SECRETS[1],
        SECRETS[2],
        SECRETS[3],
        SECRETS[4],
        "x".repeat(100_000),
    );
    let spans = correlate(vec![
        ("pre_llm_call", 0, ids(""), turn_body()),
        ("pre_api_request", 10, ids(API), api_body(api(0))),
        (
            "api_request_error",
            300,
            ids(API),
            api_body(v1::ApiCall {
                status_code: Some(401),
                reason: "auth".into(),
                error_type: "AuthenticationError".into(),
                error_message: error.clone(),
                ..api(299)
            }),
        ),
    ]);
    let mut batch = to_resource_spans(spans);
    let mut processor = SpanProcessor::new(&ProcessorConfig::default()).unwrap();
    processor.process(&mut batch);

    let limit = ProcessorConfig::default().max_attribute_bytes.unwrap();
    let chat = batch
        .iter()
        .flat_map(|rs| &rs.scope_spans)
        .flat_map(|ss| &ss.spans)
        .find(|s| s.name.starts_with("chat"))
        .expect("a chat span");
    let status = chat.status.as_ref().expect("a status");
    assert_eq!(status.code, StatusCode::Error as i32);
    assert!(status.message.len() <= limit, "{}", status.message.len());
    assert!(
        status
            .message
            .starts_with("Error code: 401 - invalid key <redacted>")
    );
    let exception = chat
        .events
        .iter()
        .find(|e| e.name == "exception")
        .and_then(|e| e.attributes.iter().find(|kv| kv.key == "exception.message"))
        .and_then(|kv| kv.value.as_ref()?.value.as_ref());
    let Some(Value::StringValue(exception)) = exception else {
        panic!("no exception.message: {:?}", chat.events);
    };
    assert_eq!(exception.as_str(), status.message, "redacted and cut alike");
    let all = serde_json::to_string(&hermes_span::convert::to_otlp(&batch)).unwrap();
    for secret in SECRETS {
        assert!(!all.contains(secret), "{secret} survived");
    }
}
