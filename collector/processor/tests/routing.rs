//! Per-backend routing (`processing.routing`): the Phoenix project and the
//! Langfuse trace-level attributes each agent's spans get.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use hermes_processor::{AttributeSet, LangfuseRoutingConfig, ProcessorConfig, SpanProcessor};
use hermes_span::common::v1::{AnyValue, ArrayValue, KeyValue, any_value::Value};
use hermes_span::resource::v1::Resource;
use hermes_span::trace::v1::{ResourceSpans, ScopeSpans, Span};

fn s(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_owned().into(),
        value: Some(AnyValue {
            value: Some(Value::StringValue(value.to_owned().into())),
        }),
    }
}

fn root_span() -> Span {
    Span {
        trace_id: [1; 16].into(),
        span_id: [2; 8].into(),
        name: "invoke_agent hermes".into(),
        attributes: vec![
            s("gen_ai.operation.name", "invoke_agent"),
            s("session.id", "sess-1"),
        ],
        ..Default::default()
    }
}

fn child_span() -> Span {
    Span {
        parent_span_id: [2; 8].into(),
        span_id: [3; 8].into(),
        name: "chat m".into(),
        ..root_span()
    }
}

fn resource_spans(resource: Vec<KeyValue>) -> ResourceSpans {
    ResourceSpans {
        resource: Some(Resource {
            attributes: resource,
            ..Default::default()
        }),
        scope_spans: vec![ScopeSpans {
            spans: vec![root_span(), child_span()],
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn sets(sets: &[AttributeSet]) -> ProcessorConfig {
    ProcessorConfig {
        attribute_sets: sets.to_vec(),
        ..Default::default()
    }
}

fn run(config: &ProcessorConfig, mut batch: Vec<ResourceSpans>) -> Vec<ResourceSpans> {
    SpanProcessor::new(config).unwrap().process(&mut batch);
    batch
}

fn value<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a Value> {
    attrs
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
}

fn string<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a str> {
    match value(attrs, key) {
        Some(Value::StringValue(v)) => Some(v),
        _ => None,
    }
}

fn strings(attrs: &[KeyValue], key: &str) -> Option<Vec<String>> {
    match value(attrs, key) {
        Some(Value::ArrayValue(ArrayValue { values })) => Some(
            values
                .iter()
                .map(|v| match &v.value {
                    Some(Value::StringValue(s)) => s.to_string(),
                    other => panic!("{key}: not a string: {other:?}"),
                })
                .collect(),
        ),
        _ => None,
    }
}

fn project(rs: &ResourceSpans) -> Option<&str> {
    string(
        &rs.resource.as_ref()?.attributes,
        "openinference.project.name",
    )
}

/// The spans of two agents, `coder` and `reviewer`, processed with `set`.
fn two_agents(set: AttributeSet) -> Vec<ResourceSpans> {
    let agents = vec![
        resource_spans(vec![s("service.name", "coder")]),
        resource_spans(vec![s("service.name", "reviewer")]),
    ];
    run(&sets(&[set]), agents)
}

#[test]
fn two_agents_land_in_two_phoenix_projects() {
    let out = two_agents(AttributeSet::OpenInference);
    assert_eq!(project(&out[0]), Some("coder"));
    assert_eq!(project(&out[1]), Some("reviewer"));
    // A resource attribute, not a span attribute: Phoenix reads the resource.
    for span in &out[0].scope_spans[0].spans {
        assert_eq!(string(&span.attributes, "openinference.project.name"), None);
    }
}

#[test]
fn the_configured_project_name_wins_over_the_service_name() {
    let mut config = sets(&[AttributeSet::OpenInference]);
    config.routing.project_name = Some("team-{team}-{service.name}".to_owned());
    let out = run(
        &config,
        vec![resource_spans(vec![
            s("service.name", "coder"),
            s("team", "a"),
        ])],
    );
    assert_eq!(project(&out[0]), Some("team-a-coder"));

    config.routing.project_name = Some("shared".to_owned());
    let out = run(
        &config,
        vec![resource_spans(vec![s("service.name", "coder")])],
    );
    assert_eq!(project(&out[0]), Some("shared"));

    // A template whose attribute is missing sets nothing (Phoenix's default
    // project) rather than half a name.
    config.routing.project_name = Some("{team}".to_owned());
    let out = run(
        &config,
        vec![resource_spans(vec![s("service.name", "coder")])],
    );
    assert_eq!(project(&out[0]), None);

    // `null` switches it off.
    config.routing.project_name = None;
    let out = run(
        &config,
        vec![resource_spans(vec![s("service.name", "coder")])],
    );
    assert_eq!(project(&out[0]), None);
}

#[test]
fn a_project_name_the_agent_sends_is_kept() {
    let out = run(
        &sets(&[AttributeSet::OpenInference]),
        vec![resource_spans(vec![
            s("service.name", "coder"),
            s("openinference.project.name", "mine"),
        ])],
    );
    assert_eq!(project(&out[0]), Some("mine"));
    let attrs = &out[0].resource.as_ref().unwrap().attributes;
    let count = attrs
        .iter()
        .filter(|kv| kv.key == "openinference.project.name")
        .count();
    assert_eq!(count, 1);
}

#[test]
fn no_routing_without_its_attribute_set() {
    let out = run(
        &sets(&[AttributeSet::GenAi]),
        vec![resource_spans(vec![s("service.name", "coder")])],
    );
    assert_eq!(project(&out[0]), None);
    let out = run(
        &sets(&[AttributeSet::Langfuse]),
        vec![resource_spans(vec![s("service.name", "coder")])],
    );
    assert_eq!(
        project(&out[0]),
        None,
        "langfuse alone sets no Phoenix project"
    );
    let root = &out[0].scope_spans[0].spans[0];
    assert_eq!(
        string(&root.attributes, "langfuse.trace.name"),
        Some("coder")
    );
}

/// Langfuse's OpenTelemetry property mapping for trace-level properties, as
/// documented at <https://langfuse.com/integrations/native/opentelemetry#property-mapping>
/// ("Trace-Level Attributes": `name` ← `langfuse.trace.name: string`,
/// `userId` ← `langfuse.user.id: string`, `sessionId` ←
/// `langfuse.session.id: string`, `tags` ← `langfuse.trace.tags: string[]`;
/// "They may be set on any span in the trace"):
/// (Langfuse trace property, OpenTelemetry span attribute, value type).
///
/// The same page ("Propagating Trace Attributes to All Spans") and
/// <https://langfuse.com/integrations/native/opentelemetry/migration-to-v4#propagate-trace-context-to-observations>
/// say each of them must be on every span to filter or aggregate
/// observations by it (Langfuse v4 queries observations, not traces).
const LANGFUSE_TRACE_MAPPING: &[(&str, &str, &str)] = &[
    ("name", "langfuse.trace.name", "string"),
    ("userId", "langfuse.user.id", "string"),
    ("sessionId", "langfuse.session.id", "string"),
    ("tags", "langfuse.trace.tags", "string[]"),
];

#[test]
fn langfuse_trace_attributes_follow_its_documented_mapping() {
    let mut config = sets(&[AttributeSet::Langfuse]);
    config.routing.langfuse = LangfuseRoutingConfig {
        trace_name: Some("{service.name}".to_owned()),
        user_id: Some("team-{team}".to_owned()),
        tags: vec![
            "{service.name}".to_owned(),
            "hermes".to_owned(),
            "{missing}".to_owned(),
        ],
    };
    let out = run(
        &config,
        vec![resource_spans(vec![
            s("service.name", "coder"),
            s("team", "a"),
        ])],
    );
    let expected = |property: &str| -> Value {
        match property {
            "name" => Value::StringValue("coder".into()),
            "userId" => Value::StringValue("team-a".into()),
            "sessionId" => Value::StringValue("sess-1".into()),
            "tags" => Value::ArrayValue(ArrayValue {
                values: ["coder", "hermes"]
                    .iter()
                    .map(|t| AnyValue {
                        value: Some(Value::StringValue((*t).into())),
                    })
                    .collect(),
            }),
            other => panic!("no expectation for {other}"),
        }
    };
    // Every property on every span, the root and its child alike.
    for (which, span) in out[0].scope_spans[0].spans.iter().enumerate() {
        for (property, attribute, kind) in LANGFUSE_TRACE_MAPPING {
            let got = value(&span.attributes, attribute)
                .unwrap_or_else(|| panic!("{property}: no `{attribute}` on span {which}"));
            match (*kind, got) {
                ("string", Value::StringValue(_)) | ("string[]", Value::ArrayValue(_)) => {}
                _ => panic!("{property}: `{attribute}` is not a {kind}: {got:?}"),
            }
            assert_eq!(
                got,
                &expected(property),
                "{property} (`{attribute}`) on span {which}"
            );
        }
    }
    assert_eq!(out[0].scope_spans[0].spans.len(), 2);
}

#[test]
fn langfuse_defaults_come_from_the_service_name() {
    let out = two_agents(AttributeSet::Langfuse);
    let root = |i: usize| &out[i].scope_spans[0].spans[0].attributes;
    assert_eq!(string(root(0), "langfuse.trace.name"), Some("coder"));
    assert_eq!(string(root(1), "langfuse.trace.name"), Some("reviewer"));
    assert_eq!(
        strings(root(0), "langfuse.trace.tags"),
        Some(vec!["coder".into()])
    );
    assert_eq!(
        strings(root(1), "langfuse.trace.tags"),
        Some(vec!["reviewer".into()])
    );
    // No user unless configured or sent.
    assert_eq!(string(root(0), "langfuse.user.id"), None);

    // `trace_name: null` names the trace after its root span.
    let mut config = sets(&[AttributeSet::Langfuse]);
    config.routing.langfuse.trace_name = None;
    let out = run(
        &config,
        vec![resource_spans(vec![s("service.name", "coder")])],
    );
    let root = &out[0].scope_spans[0].spans[0].attributes;
    assert_eq!(
        string(root, "langfuse.trace.name"),
        Some("invoke_agent hermes")
    );
    // A child cannot know its root's name: it carries none rather than its
    // own (which Langfuse would take as the trace's).
    let child = &out[0].scope_spans[0].spans[1].attributes;
    assert_eq!(string(child, "langfuse.trace.name"), None);
    assert_eq!(
        strings(child, "langfuse.trace.tags"),
        Some(vec!["coder".into()])
    );
}

#[test]
fn an_invalid_template_names_its_key() {
    for (yaml, path) in [
        (
            "routing: {project_name: '{service.name'}",
            "routing.project_name",
        ),
        (
            "routing: {langfuse: {trace_name: 'a}'}}",
            "routing.langfuse.trace_name",
        ),
        (
            "routing: {langfuse: {user_id: '{}'}}",
            "routing.langfuse.user_id",
        ),
        (
            "routing: {langfuse: {tags: [ok, '']}}",
            "routing.langfuse.tags[1]",
        ),
    ] {
        let config: ProcessorConfig = serde_yaml::from_str(yaml).unwrap();
        let err = config.validate().unwrap_err();
        assert_eq!(err.path(), path, "{yaml}");
        assert!(err.to_string().starts_with(path), "{err}");
    }
    assert!(serde_yaml::from_str::<ProcessorConfig>("routing: {project: x}").is_err());
}

#[test]
fn a_batch_without_a_resource_gets_one_only_for_a_fixed_project() {
    let mut batch = resource_spans(vec![]);
    batch.resource = None;
    let out = run(&sets(&[AttributeSet::OpenInference]), vec![batch.clone()]);
    assert!(out[0].resource.is_none(), "nothing to route by");

    let mut config = sets(&[AttributeSet::OpenInference]);
    config.routing.project_name = Some("shared".to_owned());
    let out = run(&config, vec![batch]);
    assert_eq!(project(&out[0]), Some("shared"));
}
