//! Per-backend routing: which Arize Phoenix project and which Langfuse trace
//! name, user and tags a batch's spans get.
//!
//! Owns the `processing.routing` templates, compiled once, and their
//! rendering against a resource's attributes. A template is text with
//! `{key}` placeholders naming resource attributes (`{service.name}`,
//! `{deployment.environment}`); it renders only when every placeholder's
//! attribute is a non-empty string, so a half-filled name is never sent.
//!
//! By default everything derives from the agent's `service.name` (the
//! shim's `HERMES_COLLECTOR_SERVICE_NAME`), so two agents land in two
//! Phoenix projects and carry two Langfuse tags without any configuration.
//!
//! Attribute names:
//! - Phoenix groups traces into projects by the resource attribute
//!   `openinference.project.name` (Phoenix docs, "Resource" and "Setup
//!   Projects": <https://arize.com/docs/phoenix/tracing/concepts-tracing/otel-openinference/resource>;
//!   `SEMRESATTRS_PROJECT_NAME` of `@arizeai/phoenix-otel`).
//! - Langfuse reads trace-level properties from span attributes: its
//!   OpenTelemetry property mapping
//!   (<https://langfuse.com/integrations/native/opentelemetry>, and the
//!   `LangfuseOtelSpanAttributes` enum of its JS SDK) maps
//!   `langfuse.trace.name` to the trace name, `langfuse.user.id`/`user.id`
//!   to its user, `langfuse.session.id`/`session.id` to its session and
//!   `langfuse.trace.tags` (a string array) to its tags.
//!
//! Invariant, as for the attribute sets: routing only adds attributes, never
//! overwrites one the resource or span already has (an agent that sets its
//! own project name keeps it), so processing twice adds nothing.

use hermes_span::Str;
use hermes_span::common::v1::{AnyValue, ArrayValue, KeyValue, any_value::Value};

use crate::config::{ConfigError, RoutingConfig};

/// The resource attribute naming a Phoenix project.
pub(crate) const PROJECT_NAME: &str = "openinference.project.name";
/// Langfuse's trace name attribute.
pub(crate) const LANGFUSE_TRACE_NAME: &str = "langfuse.trace.name";
/// Langfuse's user id attribute.
pub(crate) const LANGFUSE_USER_ID: &str = "langfuse.user.id";
/// Langfuse's trace tags attribute (string array).
pub(crate) const LANGFUSE_TRACE_TAGS: &str = "langfuse.trace.tags";

/// One piece of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Attribute(String),
}

/// A compiled template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Template(Vec<Piece>);

impl Template {
    /// Parses `text`; `path` names the setting in errors.
    pub(crate) fn parse(path: String, text: &str) -> Result<Self, ConfigError> {
        let invalid = |reason: &'static str| ConfigError::InvalidTemplate {
            path: path.clone(),
            template: text.to_owned(),
            reason,
        };
        if text.trim().is_empty() {
            return Err(invalid("is empty"));
        }
        let mut pieces = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find(['{', '}']) {
            if rest[open..].starts_with('}') {
                return Err(invalid("has a `}` without its `{`"));
            }
            if open > 0 {
                pieces.push(Piece::Text(rest[..open].to_owned()));
            }
            let after = &rest[open + 1..];
            let Some(close) = after.find('}') else {
                return Err(invalid("has a `{` without its `}`"));
            };
            let key = after[..close].trim();
            if key.is_empty() || key.contains('{') {
                return Err(invalid("has a placeholder that names no attribute"));
            }
            pieces.push(Piece::Attribute(key.to_owned()));
            rest = &after[close + 1..];
        }
        if !rest.is_empty() {
            pieces.push(Piece::Text(rest.to_owned()));
        }
        Ok(Self(pieces))
    }

    /// The text with every placeholder filled from `resource`, or `None`
    /// when one names an attribute that is missing, empty or not a string.
    pub(crate) fn render(&self, resource: &[KeyValue]) -> Option<String> {
        let mut out = String::new();
        for piece in &self.0 {
            match piece {
                Piece::Text(t) => out.push_str(t),
                Piece::Attribute(key) => out.push_str(string_attribute(resource, key)?),
            }
        }
        (!out.trim().is_empty()).then_some(out)
    }
}

fn string_attribute<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a str> {
    attrs
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| match &v.value {
            Some(Value::StringValue(s)) if !s.is_empty() => Some(s.as_str()),
            _ => None,
        })
}

/// `processing.routing`, compiled.
#[derive(Debug, Clone, Default)]
pub(crate) struct Routing {
    project_name: Option<Template>,
    trace_name: Option<Template>,
    user_id: Option<Template>,
    tags: Vec<Template>,
}

/// What routing adds to the spans of one resource, rendered once per
/// resource.
#[derive(Debug, Clone, Default)]
pub(crate) struct Rendered {
    pub(crate) trace_name: Option<String>,
    pub(crate) user_id: Option<String>,
    pub(crate) tags: Vec<String>,
}

impl Routing {
    pub(crate) fn new(config: &RoutingConfig) -> Result<Self, ConfigError> {
        let one = |path: &str, text: &Option<String>| {
            text.as_deref()
                .map(|t| Template::parse(path.to_owned(), t))
                .transpose()
        };
        let mut tags = Vec::with_capacity(config.langfuse.tags.len());
        for (index, tag) in config.langfuse.tags.iter().enumerate() {
            tags.push(Template::parse(
                format!("routing.langfuse.tags[{index}]"),
                tag,
            )?);
        }
        Ok(Self {
            project_name: one("routing.project_name", &config.project_name)?,
            trace_name: one("routing.langfuse.trace_name", &config.langfuse.trace_name)?,
            user_id: one("routing.langfuse.user_id", &config.langfuse.user_id)?,
            tags,
        })
    }

    /// Adds `openinference.project.name` to a resource's attributes, unless
    /// it has one or the template does not render.
    pub(crate) fn add_project_name(&self, resource: &mut Vec<KeyValue>) {
        if resource.iter().any(|kv| kv.key == PROJECT_NAME) {
            return;
        }
        if let Some(name) = self.project_name.as_ref().and_then(|t| t.render(resource)) {
            resource.push(string_kv(PROJECT_NAME, name));
        }
    }

    /// The Langfuse trace-level values for the spans of `resource`.
    pub(crate) fn langfuse(&self, resource: &[KeyValue]) -> Rendered {
        let mut tags: Vec<String> = Vec::with_capacity(self.tags.len());
        for tag in self.tags.iter().filter_map(|t| t.render(resource)) {
            if !tags.contains(&tag) {
                tags.push(tag);
            }
        }
        Rendered {
            trace_name: self.trace_name.as_ref().and_then(|t| t.render(resource)),
            user_id: self.user_id.as_ref().and_then(|t| t.render(resource)),
            tags,
        }
    }
}

pub(crate) fn string_kv(key: &'static str, value: String) -> KeyValue {
    KeyValue {
        key: Str::from_static(key),
        value: Some(AnyValue {
            value: Some(Value::StringValue(value.into())),
        }),
    }
}

pub(crate) fn string_array_kv(key: &'static str, values: &[String]) -> KeyValue {
    KeyValue {
        key: Str::from_static(key),
        value: Some(AnyValue {
            value: Some(Value::ArrayValue(ArrayValue {
                values: values
                    .iter()
                    .map(|v| AnyValue {
                        value: Some(Value::StringValue(v.clone().into())),
                    })
                    .collect(),
            })),
        }),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn resource(pairs: &[(&str, &str)]) -> Vec<KeyValue> {
        pairs
            .iter()
            .map(|(k, v)| KeyValue {
                key: (*k).to_owned().into(),
                value: Some(AnyValue {
                    value: Some(Value::StringValue((*v).to_owned().into())),
                }),
            })
            .collect()
    }

    #[test]
    fn templates_fill_from_resource_attributes() {
        let t = Template::parse("p".into(), "{service.name}-{deployment.environment}").unwrap();
        let r = resource(&[
            ("service.name", "coder"),
            ("deployment.environment", "prod"),
        ]);
        assert_eq!(t.render(&r).as_deref(), Some("coder-prod"));
        // A missing attribute renders nothing rather than half a name.
        let r = resource(&[("service.name", "coder")]);
        assert_eq!(t.render(&r), None);
        let fixed = Template::parse("p".into(), "team-a").unwrap();
        assert_eq!(fixed.render(&[]).as_deref(), Some("team-a"));
    }

    #[test]
    fn bad_templates_name_their_key() {
        for (text, reason) in [
            ("", "is empty"),
            ("{service.name", "without its `}`"),
            ("a}b", "without its `{`"),
            ("x{}", "names no attribute"),
            ("{a{b}", "names no attribute"),
        ] {
            let err = Template::parse("routing.project_name".into(), text).unwrap_err();
            assert_eq!(err.path(), "routing.project_name", "{text}");
            assert!(err.to_string().contains(reason), "{text}: {err}");
        }
    }
}
