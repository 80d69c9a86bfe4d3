//! The correlator's failed API attempt, processed with the default config:
//! the error text it puts in the span's status message and in the
//! `exception` event is redacted and cut alike.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use hermes_correlator::{Config, Correlator, to_resource_spans};
use hermes_processor::{ProcessorConfig, SpanProcessor};
use hermes_proto::v1::{self, event::Body};
use hermes_span::common::v1::any_value::Value;
use hermes_span::trace::v1::status::StatusCode;

const MS: u64 = 1_000_000;
const T0: u64 = 1_800_000_000_000 * MS;
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
    v1::Ids {
        session_id: "20261129_200230_bbf019".into(),
        task_id: "task-1".into(),
        turn_id: TURN.into(),
        api_request_id: api.into(),
        ..Default::default()
    }
}

fn event(seq: u64, hook: &str, t_ms: u64, ids: v1::Ids, body: Body) -> v1::Event {
    v1::Event {
        seq,
        hook: hook.into(),
        schema_version: "hermes.observer.v1".into(),
        time_unix_nano: T0 + t_ms * MS,
        mono_nano: t_ms * MS,
        thread: "MainThread".into(),
        ids: Some(Box::new(ids)),
        body: Some(body),
        content: Default::default(),
    }
}

fn api(ended_ms: u64) -> v1::ApiCall {
    v1::ApiCall {
        model: "fake-model-1".into(),
        platform: "cli".into(),
        provider: "openai".into(),
        api_call_count: 1,
        started_at_unix_nano: T0 + 8 * MS,
        ended_at_unix_nano: if ended_ms == 0 { 0 } else { T0 + ended_ms * MS },
        attempt: 1,
        ..Default::default()
    }
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
    let shim = v1::ShimInfo {
        instance_id: "inst-1".into(),
        service_name: "hermes-agent".into(),
        host_name: "host".into(),
        pid: 42,
        shim_version: "0.1.0".into(),
        capture: "metadata".into(),
    };
    let mut c = Correlator::new(Config::default());
    let mut out = Vec::new();
    let turn = Body::Turn(v1::Turn {
        model: "fake-model-1".into(),
        platform: "cli".into(),
        ..Default::default()
    });
    for e in [
        event(1, "pre_llm_call", 0, ids(""), turn),
        event(
            2,
            "pre_api_request",
            10,
            ids(API),
            Body::Api(Box::new(api(0))),
        ),
        event(
            3,
            "api_request_error",
            300,
            ids(API),
            Body::Api(Box::new(v1::ApiCall {
                status_code: Some(401),
                reason: "auth".into(),
                error_type: "AuthenticationError".into(),
                error_message: error.clone(),
                ..api(299)
            })),
        ),
    ] {
        c.ingest(&shim, &e, &mut out);
    }
    c.flush_all(&mut out);
    let mut batch = to_resource_spans(out);
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
