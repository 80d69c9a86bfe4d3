//! The default redaction rules against planted secrets: no planted secret
//! survives anywhere a span exports a string, the output stays within the
//! limits, ordinary text survives unchanged, and none of the correlator's
//! own attribute keys is taken for a secret.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use hermes_processor::{MAX_NAME_BYTES, ProcessorConfig, SpanProcessor};
use hermes_span::common::v1::{
    AnyValue, ArrayValue, InstrumentationScope, KeyValue, KeyValueList, any_value::Value,
};
use hermes_span::resource::v1::Resource;
use hermes_span::trace::v1::{
    ResourceSpans, ScopeSpans, Span, Status,
    span::{Event, Link},
    status::StatusCode,
};
use hermes_span::{SharedAttributes, Str};
use proptest::prelude::*;

/// One planted secret: the text as it appears (`planted`), and the part that
/// must not reach the output (`needle`).
struct Planted {
    kind: &'static str,
    planted: &'static str,
    needle: &'static str,
}

const fn p(kind: &'static str, planted: &'static str, needle: &'static str) -> Planted {
    Planted {
        kind,
        planted,
        needle,
    }
}

/// What secret scanners (gitleaks, trufflehog, detect-secrets) catch, as
/// it shows up in an agent's prompts, commands, tool output and errors.
const PLANTED: &[Planted] = &[
    p(
        "openai project key",
        "sk-proj-AbCdEf0123456789GhIjKlMnOp",
        "AbCdEf0123456789GhIjKlMnOp",
    ),
    p(
        "anthropic key",
        "sk-ant-api03-QwErTy0123456789AsDfGh",
        "QwErTy0123456789AsDfGh",
    ),
    p(
        "bearer token",
        "Bearer Zx9tokenValue77abc",
        "Zx9tokenValue77abc",
    ),
    p(
        "e-mail address",
        "jane.doe@example.org",
        "jane.doe@example.org",
    ),
    p(
        "aws access key id",
        "AKIAIOSFODNN7EXAMPLE",
        "AKIAIOSFODNN7EXAMPLE",
    ),
    p(
        "aws secret access key assignment",
        "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY aws s3 ls",
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    ),
    p(
        "export of a password",
        "export DB_PASSWORD=s3cr3tPassVal",
        "s3cr3tPassVal",
    ),
    p(
        "PGPASSWORD in a command",
        "PGPASSWORD=pgS3cretVal psql -h db",
        "pgS3cretVal",
    ),
    p(
        "--password flag",
        "mysql --password hunter2Flag -u root",
        "hunter2Flag",
    ),
    p(
        "--api-key= flag",
        "tool --api-key=apiKeyFlagVal9",
        "apiKeyFlagVal9",
    ),
    p(
        "basic auth header",
        "Authorization: Basic dXNlcjpwYXNz",
        "dXNlcjpwYXNz",
    ),
    p(
        "proxy basic auth header",
        "Proxy-Authorization: Basic cHJveHk6c2VjcmV0",
        "cHJveHk6c2VjcmV0",
    ),
    p(
        "url userinfo",
        "https://user:urlPassw0rd@host.example/path",
        "urlPassw0rd",
    ),
    p(
        "postgres url",
        "postgres://app:pgUrlPass1@db:5432/app",
        "pgUrlPass1",
    ),
    p(
        "mongodb+srv url",
        "mongodb+srv://admin:mongoPass2@cluster0.example.net/db",
        "mongoPass2",
    ),
    p(
        "redis url",
        "redis://:redisPass3@cache:6379/0",
        "redisPass3",
    ),
    p(
        "jwt",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    ),
    p(
        "google api key",
        "AIzaSyA1234567890abcdefghijklmnopqrstuv",
        "SyA1234567890abcdefghijklmnopqrstuv",
    ),
    p(
        "google oauth token",
        "ya29.a0AfH6SMBexampleTokenValue123",
        "a0AfH6SMBexampleTokenValue123",
    ),
    p(
        "github token",
        "ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789",
        "aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789",
    ),
    p(
        "github fine-grained token",
        "github_pat_11ABCDEFG0123456789_abcdefghijklmnop",
        "11ABCDEFG0123456789_abcdefghijklmnop",
    ),
    p(
        "gitlab token",
        "glpat-abcdefghij0123456789",
        "abcdefghij0123456789",
    ),
    p(
        "slack token",
        "xoxb-1234567890-abcdefghij",
        "1234567890-abcdefghij",
    ),
    p(
        "stripe secret key",
        "sk_live_4eC39HqLyjWDarjtT1zdp7dc",
        "4eC39HqLyjWDarjtT1zdp7dc",
    ),
    p(
        "stripe restricted key",
        "rk_test_51HabcdefGHIJKLmnopQRST",
        "51HabcdefGHIJKLmnopQRST",
    ),
    p(
        "sendgrid key",
        "SG.abcdefghijklmnopqrstuv.ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789abcdefg",
        "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789abcdefg",
    ),
    p(
        "hugging face token",
        "hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ01234567",
        "aBcDeFgHiJkLmNoPqRsTuVwXyZ01234567",
    ),
    p(
        "npm token",
        "npm_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789",
        "aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789",
    ),
    p(
        "pypi token",
        "pypi-AgEIcHlwaS5vcmcCJDAwMDAwMDAwLTAwMDAtMDAwMC0wMDAw",
        "CJDAwMDAwMDAwLTAwMDAtMDAwMC0wMDAw",
    ),
    p(
        "pem private key",
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAexampleKeyMaterial0\n-----END RSA PRIVATE KEY-----",
        "MIIEowIBAAKCAQEAexampleKeyMaterial0",
    ),
    p(
        "azure connection string",
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=azureKeyValue0123456789abcdef==;EndpointSuffix=core.windows.net",
        "azureKeyValue0123456789abcdef",
    ),
    p(
        "json db_password",
        r#"{"db_password": "jsonDbPass7"}"#,
        "jsonDbPass7",
    ),
    p("privateKey value", "privateKey: pkValue8877", "pkValue8877"),
    p(
        "private_key quoted",
        r#"private_key = "pkUnderscore42""#,
        "pkUnderscore42",
    ),
    p(
        "credentials",
        "credentials=credsValue5566",
        "credsValue5566",
    ),
    p(
        "client secret",
        "client_secret=clientSecretVal9",
        "clientSecretVal9",
    ),
    p(
        "github token variable",
        "GITHUB_TOKEN=ghTokenEnvValue1",
        "ghTokenEnvValue1",
    ),
];

/// Keys whose whole value must be replaced, whatever it is.
const SECRET_KEYS: &[&str] = &[
    "db_password",
    "privateKey",
    "private_key",
    "credentials",
    "AWS_SECRET_ACCESS_KEY",
    "x-api-key",
    "authorization",
    "github_token",
    "client_secret",
    "mysql_passwd",
];

/// Text that must survive the default rules unchanged.
const ORDINARY: &[&str] = &[
    "task-management-system-design-notes",
    "mask-rcnn-model",
    "Reset your password at the password reset page",
    "The secret of a good plan is a good list",
    "tokens_used: 1234",
    "gen_ai.usage.input_tokens=52",
    "max_tokens: 4096",
    "token_count=12",
    "Authorization required for this page",
    "basic usage of the API",
    "http://127.0.0.1:45501/v1",
    "https://example.com/path?q=1&page=2",
    "postgres://db.example:5432/app",
    "fake-model-1",
    "claude-sonnet-4-20250514",
    "execute_tool terminal",
    "chat gpt-4o",
    "invoke_agent hermes",
    "20261129_200230_bbf019:944cce63-cb11-40a2-b2b0-df8cd6066fd5:1b06e77d",
    "/home/user/project/src/main.rs",
    "ls -la --color=auto",
    "grep --password-file=/etc/pw",
    "-----BEGIN PUBLIC KEY-----",
    "sk-short ghp_short AKIA1234",
    "Bearer",
    r#"{"role":"user","parts":[{"type":"text","content":"hi"}]}"#,
    r#"{"max_tokens":100,"tokens_used":9,"input_tokens":3}"#,
];

fn s(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(Value::StringValue(value.into())),
        }),
    }
}

fn kv(key: &str, value: Value) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(value) }),
    }
}

/// Where a string can be exported.
#[derive(Debug, Clone, Copy)]
enum Place {
    StatusMessage,
    SpanName,
    EventName,
    SpanAttribute,
    SharedAttribute,
    EventAttribute,
    LinkAttribute,
    ResourceAttribute,
    ScopeAttribute,
    ScopeName,
    JsonInValue,
    KvList,
    Array,
    AttributeKey,
}

const PLACES: [Place; 14] = [
    Place::StatusMessage,
    Place::SpanName,
    Place::EventName,
    Place::SpanAttribute,
    Place::SharedAttribute,
    Place::EventAttribute,
    Place::LinkAttribute,
    Place::ResourceAttribute,
    Place::ScopeAttribute,
    Place::ScopeName,
    Place::JsonInValue,
    Place::KvList,
    Place::Array,
    Place::AttributeKey,
];

/// A batch with one span that holds `text` at `place`, everything else
/// ordinary; three copies of it for [`Place::SharedAttribute`], a turn's
/// leading attribute that its spans share (the processor works on such a
/// block once per pass when it finds it clean).
fn batch_with(place: Place, text: &str) -> Vec<ResourceSpans> {
    let mut span = Span {
        trace_id: [1; 16].into(),
        span_id: [2; 8].into(),
        name: "chat fake-model-1".into(),
        attributes: vec![s("gen_ai.operation.name", "chat")],
        events: vec![Event {
            name: "exception".into(),
            attributes: vec![s("exception.type", "APIError")],
            ..Default::default()
        }],
        links: vec![Link {
            trace_id: [3; 16].into(),
            span_id: [4; 8].into(),
            attributes: vec![s("hermes.link", "parent session")],
            ..Default::default()
        }],
        status: Some(Status {
            code: StatusCode::Error as i32,
            message: "Error code: 500".to_owned(),
        }),
        ..Default::default()
    };
    let mut resource = vec![s("service.name", "hermes-agent")];
    let mut scope = InstrumentationScope {
        name: "hermes-collector".into(),
        ..Default::default()
    };
    match place {
        Place::StatusMessage => span.status.as_mut().unwrap().message = text.to_owned(),
        Place::SpanName => span.name = text.into(),
        Place::EventName => span.events[0].name = text.into(),
        Place::SpanAttribute => span.attributes.push(s("hermes.note", text)),
        Place::SharedAttribute => {
            let lead = [KeyValue {
                key: Str::from_static("hermes.task_id"),
                value: Some(AnyValue {
                    value: Some(Value::StringValue(Str::from(text))),
                }),
            }];
            span.attributes.splice(0..0, lead.iter().cloned());
            span.shared = SharedAttributes::new(&lead);
        }
        Place::EventAttribute => span.events[0].attributes.push(s("exception.message", text)),
        Place::LinkAttribute => span.links[0].attributes.push(s("hermes.link.note", text)),
        Place::ResourceAttribute => resource.push(s("host.name", text)),
        Place::ScopeAttribute => scope.attributes.push(s("scope.note", text)),
        Place::ScopeName => scope.version = text.into(),
        Place::JsonInValue => span.attributes.push(s(
            "gen_ai.input.messages",
            &serde_json::json!([{"role": "user", "parts": [{"type": "text", "content": text}]}])
                .to_string(),
        )),
        Place::KvList => span.attributes.push(kv(
            "hermes.headers",
            Value::KvlistValue(KeyValueList {
                values: vec![s("accept", "json"), s("x-note", text)],
            }),
        )),
        Place::Array => span.attributes.push(kv(
            "hermes.list",
            Value::ArrayValue(ArrayValue {
                values: vec![AnyValue {
                    value: Some(Value::StringValue(text.into())),
                }],
            }),
        )),
        Place::AttributeKey => span.attributes.push(s(text, "v")),
    }
    vec![ResourceSpans {
        resource: Some(Resource {
            attributes: resource,
            ..Default::default()
        }),
        scope_spans: vec![ScopeSpans {
            scope: Some(scope),
            spans: if matches!(place, Place::SharedAttribute) {
                vec![span.clone(), span.clone(), span]
            } else {
                vec![span]
            },
            ..Default::default()
        }],
        ..Default::default()
    }]
}

/// The whole batch as OTLP JSON: every exported string is in it.
fn encoded(batch: &[ResourceSpans]) -> String {
    serde_json::to_string(&hermes_span::convert::to_otlp(batch)).unwrap()
}

thread_local! {
    /// One processor with the default config per test thread: compiling the
    /// rules for each case would dominate the test's time.
    static DEFAULT: std::cell::RefCell<SpanProcessor> =
        std::cell::RefCell::new(SpanProcessor::new(&ProcessorConfig::default()).unwrap());
}

/// Runs the default processor over `b`; returns how many strings it redacted.
fn process(b: &mut [ResourceSpans]) -> u64 {
    DEFAULT.with_borrow_mut(|p| {
        let before = p.stats().redacted_attributes();
        p.process(b);
        p.stats().redacted_attributes() - before
    })
}

fn processed(place: Place, text: &str) -> Vec<ResourceSpans> {
    let mut b = batch_with(place, text);
    process(&mut b);
    b
}

/// Every string of the batch is within its limit.
fn assert_within_limits(b: &[ResourceSpans]) {
    let limit = ProcessorConfig::default().max_attribute_bytes.unwrap();
    fn values(v: &AnyValue, limit: usize) {
        match &v.value {
            Some(Value::StringValue(s)) => assert!(s.len() <= limit, "{} bytes", s.len()),
            Some(Value::ArrayValue(a)) => a.values.iter().for_each(|v| values(v, limit)),
            Some(Value::KvlistValue(l)) => l.values.iter().for_each(|kv| attrs(kv, limit)),
            _ => {}
        }
    }
    fn attrs(kv: &KeyValue, limit: usize) {
        assert!(
            kv.key.len() <= MAX_NAME_BYTES,
            "key of {} bytes",
            kv.key.len()
        );
        if let Some(v) = &kv.value {
            values(v, limit);
        }
    }
    for rs in b {
        rs.resource
            .iter()
            .flat_map(|r| &r.attributes)
            .for_each(|kv| attrs(kv, limit));
        for ss in &rs.scope_spans {
            if let Some(scope) = &ss.scope {
                assert!(scope.name.len() <= MAX_NAME_BYTES);
                assert!(scope.version.len() <= MAX_NAME_BYTES);
                scope.attributes.iter().for_each(|kv| attrs(kv, limit));
            }
            for span in &ss.spans {
                assert!(span.name.len() <= MAX_NAME_BYTES);
                if let Some(status) = &span.status {
                    assert!(status.message.len() <= limit);
                }
                span.attributes.iter().for_each(|kv| attrs(kv, limit));
                for e in &span.events {
                    assert!(e.name.len() <= MAX_NAME_BYTES);
                    e.attributes.iter().for_each(|kv| attrs(kv, limit));
                }
                for l in &span.links {
                    l.attributes.iter().for_each(|kv| attrs(kv, limit));
                }
            }
        }
    }
}

#[test]
fn the_table_covers_at_least_29_kinds() {
    assert!(PLANTED.len() >= 29, "{}", PLANTED.len());
    for planted in PLANTED {
        assert!(planted.planted.contains(planted.needle), "{}", planted.kind);
    }
}

#[test]
fn every_planted_secret_is_redacted_in_every_place() {
    for planted in PLANTED {
        for place in PLACES {
            let text = format!("see {} now", planted.planted);
            let out = encoded(&processed(place, &text));
            assert!(
                !out.contains(planted.needle),
                "{} survived in {place:?}: {out}",
                planted.kind
            );
        }
    }
}

#[test]
fn values_under_secret_keys_are_replaced() {
    for key in SECRET_KEYS {
        let json = serde_json::json!({ *key: "plainValue1", "note": "x" }).to_string();
        for b in [
            {
                let mut b = batch_with(Place::SpanAttribute, "x");
                b[0].scope_spans[0].spans[0]
                    .attributes
                    .push(s(key, "plainValue1"));
                b
            },
            batch_with(Place::SpanAttribute, &json),
            {
                let mut b = batch_with(Place::SpanAttribute, "x");
                b[0].scope_spans[0].spans[0].attributes.push(kv(
                    "hermes.kv",
                    Value::KvlistValue(KeyValueList {
                        values: vec![s(key, "plainValue1")],
                    }),
                ));
                b
            },
        ] {
            let mut b = b;
            process(&mut b);
            let out = encoded(&b);
            assert!(!out.contains("plainValue1"), "{key}: {out}");
        }
    }
}

#[test]
fn ordinary_text_survives_unchanged_everywhere() {
    for text in ORDINARY {
        // Not as an attribute key: prose about passwords is a key the key
        // rules match (and `no_key_the_collector_writes_is_redacted` checks
        // the real keys).
        for place in PLACES
            .into_iter()
            .filter(|p| !matches!(p, Place::AttributeKey))
        {
            let before = batch_with(place, text);
            let mut after = before.clone();
            let redacted = process(&mut after);
            assert_eq!(after, before, "{text:?} in {place:?} changed");
            assert_eq!(redacted, 0, "{text:?}");
        }
    }
}

/// Every attribute key the correlator and the attribute sets write, read
/// from their sources: none may be taken for a secret.
#[test]
fn no_key_the_collector_writes_is_redacted() {
    let sources = [
        include_str!("../../correlator/src/lib.rs"),
        include_str!("../../correlator/src/approval.rs"),
        include_str!("../../correlator/src/attrs.rs"),
        include_str!("../../correlator/src/content.rs"),
        include_str!("../../correlator/src/emit.rs"),
        include_str!("../../correlator/src/exit.rs"),
        include_str!("../../correlator/src/ids.rs"),
        include_str!("../../correlator/src/ingest.rs"),
        include_str!("../../correlator/src/sequencer.rs"),
        include_str!("../../correlator/src/sessions.rs"),
        include_str!("../../correlator/src/subagents.rs"),
        include_str!("../../correlator/src/timers.rs"),
        include_str!("../../correlator/src/turns.rs"),
        include_str!("../src/sets.rs"),
    ];
    let key = regex::Regex::new(r#""([a-z][a-z0-9_]*(?:\.[a-z0-9_]+)+)""#).unwrap();
    let mut keys: Vec<&str> = sources
        .iter()
        .flat_map(|src| key.captures_iter(src).map(|c| c.get(1).unwrap().as_str()))
        .collect();
    keys.sort_unstable();
    keys.dedup();
    assert!(keys.len() > 80, "found only {} keys", keys.len());
    assert!(keys.contains(&"gen_ai.usage.input_tokens"));
    assert!(keys.contains(&"hermes.approval.pattern_key"));
    let mut span = Span {
        attributes: keys.iter().map(|k| s(k, "plain value")).collect(),
        ..Default::default()
    };
    let before = span.clone();
    SpanProcessor::new(&ProcessorConfig::default())
        .unwrap()
        .process_span(&mut span);
    let changed: Vec<&str> = span
        .attributes
        .iter()
        .zip(&before.attributes)
        .filter(|(a, b)| a != b)
        .map(|(_, b)| b.key.as_str())
        .collect();
    assert!(changed.is_empty(), "redacted keys: {changed:?}");
}

fn surrounding() -> impl Strategy<Value = String> {
    // Words and punctuation that cannot glue onto a secret: a planted value
    // is always set off by spaces.
    proptest::collection::vec("[a-zA-Z0-9.,:;!?()é中-]{0,12}", 0..8).prop_map(|w| w.join(" "))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A planted secret at a random position inside random text, in any
    /// place a span exports a string, never survives the default rules,
    /// and the output is within the limits.
    #[test]
    fn no_planted_secret_survives_anywhere(
        index in 0..PLANTED.len(),
        place in 0..PLACES.len(),
        before in surrounding(),
        after in surrounding(),
        padding in 0usize..6000,
    ) {
        let planted = &PLANTED[index];
        let place = PLACES[place];
        // Sometimes long enough to be cut: the secret is redacted before.
        let filler = "x".repeat(padding % 3 * padding);
        let text = format!("{before} {} {after} {filler}", planted.planted);
        let b = processed(place, &text);
        let out = encoded(&b);
        prop_assert!(!out.contains(planted.needle), "{} survived in {:?}: {}", planted.kind, place, out);
        assert_within_limits(&b);
    }
}
