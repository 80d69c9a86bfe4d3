//! Emission: a closed turn, attempt or tool becomes its spans, and finished
//! spans are grouped by resource for export.

use super::*;

impl Correlator {
    pub(crate) fn emit_turn(
        &mut self,
        mut turn: Turn,
        end: u64,
        incomplete: bool,
        out: &mut Vec<FinishedSpan>,
    ) {
        let mut end = end.max(turn.start);
        // Close children that never got their end event.
        let nothing = view::Content::default();
        for (api_request_id, attempt) in attempts::open_attempts(&turn.requests) {
            let api = view::ApiCall {
                attempt,
                ..Default::default()
            };
            let mut span = close_attempt(
                &mut turn,
                &mut self.values,
                &api_request_id,
                &api,
                false,
                end,
                &nothing,
            );
            mark_incomplete(&mut span.span);
            out.push(span);
        }
        // Requests still waiting are unanswered; closed before their tools
        // so that they nest under them.
        approval::close_all(&mut turn, end, incomplete, out);
        let mut tools: Vec<_> = turn.tools.drain().collect();
        tools.sort_by(|a, b| a.0.cmp(&b.0));
        for (tool_call_id, open) in tools {
            let mut span = close_tool(
                &mut turn,
                &mut self.values,
                &tool_call_id,
                Some(open),
                &view::ToolCall::default(),
                end,
            );
            mark_incomplete(&mut span.span);
            out.push(span);
        }
        if turn.max_child_end > end {
            end = turn.max_child_end;
            turn.clock_adjusted = true;
        }
        let mut a = turn.common(14);
        a.fixed("gen_ai.operation.name", "invoke_agent")
            .shared("gen_ai.request.model", &turn.model)
            .opt_bool("hermes.turn.completed", turn.completed)
            .opt_bool("hermes.turn.interrupted", turn.interrupted)
            .str("hermes.turn.end_reason", &turn.end_reason)
            .uint("hermes.turn.api_attempts", turn.api_attempts)
            .uint("hermes.turn.tool_calls", turn.tool_calls)
            .uint("hermes.turn.usage.input_tokens", turn.input_tokens)
            .uint("hermes.turn.usage.output_tokens", turn.output_tokens);
        if let Some(text) = &turn.user_message {
            a.str("hermes.turn.user_message", text);
        }
        if let Some(text) = &turn.final_answer {
            a.str("hermes.turn.final_answer", text);
        }
        if incomplete || !turn.started {
            a.bool("hermes.incomplete", true);
        }
        if turn.clock_adjusted {
            a.bool("hermes.clock_adjusted", true);
        }
        let status = if turn.interrupted == Some(true) || turn.completed == Some(true) {
            None
        } else if let Some(error_type) = &turn.last_attempt_error {
            // Hermes gave up on the model: the turn failed with its error.
            a.str("error.type", error_type);
            Some(error_status(&format!(
                "the last API attempt failed: {error_type}"
            )))
        } else if turn.completed == Some(false) {
            Some(error_status("turn did not complete"))
        } else {
            None
        };
        if turn.parent.is_some() {
            self.note_child_end(&turn.instance, &turn.session_id, end);
        }
        turn.events
            .sort_by(|x, y| (x.time_unix_nano, &x.name).cmp(&(y.time_unix_nano, &y.name)));
        out.push(FinishedSpan {
            resource: turn.resource,
            span: Span {
                trace_id: turn.trace_id.into(),
                span_id: turn.span_id.into(),
                parent_span_id: turn.parent.map(Id::from).unwrap_or_default(),
                name: self.values.joined("invoke_agent ", &turn.agent_name),
                kind: span::SpanKind::Internal as i32,
                start_time_unix_nano: turn.start,
                end_time_unix_nano: end,
                attributes: a.0,
                events: turn.events,
                status,
                shared: turn.shared,
                ..Default::default()
            },
        });
    }
}

/// The most attributes [`Turn::common`] adds.
const COMMON_ATTRIBUTES: usize = 7;

impl Turn {
    /// Attributes every span of this turn carries, with room for `extra`
    /// more (the most the span adds: its list is never regrown). They are
    /// also the turn's shared block, which its spans point at: made again
    /// when they are no longer the block's (a field changed), and counted
    /// in what the turn holds.
    pub(crate) fn common(&mut self, extra: usize) -> Attrs {
        let mut a = Attrs::with_capacity(COMMON_ATTRIBUTES + extra);
        a.shared("session.id", &self.root_session_id)
            .shared("gen_ai.conversation.id", &self.root_session_id)
            .shared("hermes.turn_id", &self.turn_id)
            .shared("hermes.task_id", &self.task_id)
            .shared("hermes.platform", &self.platform)
            .shared("gen_ai.agent.name", &self.agent_name);
        if self.session_id != self.root_session_id {
            a.shared("hermes.session_id", &self.session_id);
        }
        if self.shared.len() != a.0.len() || !self.shared.leads(&a.0) {
            let old = std::mem::replace(&mut self.shared, SharedAttributes::new(&a.0));
            self.held = self.held.saturating_sub(old.approx_bytes()) + self.shared.approx_bytes();
        }
        a
    }
}

/// Completes `span` (ids, times, attributes set by the caller) as a child
/// of `turn`: fills the trace id and resource, and clamps it into the turn's
/// start (a synthesized turn grows to contain it instead).
pub(crate) fn child_span(turn: &mut Turn, mut span: Span) -> FinishedSpan {
    span.end_time_unix_nano = span.end_time_unix_nano.max(span.start_time_unix_nano);
    if span.start_time_unix_nano < turn.start && !turn.started {
        turn.start = span.start_time_unix_nano;
    } else if span.start_time_unix_nano < turn.start {
        span.start_time_unix_nano = turn.start;
        span.end_time_unix_nano = span.end_time_unix_nano.max(turn.start);
        span.attributes.push(attrs::kv(
            "hermes.clock_adjusted",
            any_value::Value::BoolValue(true),
        ));
    }
    turn.max_child_end = turn.max_child_end.max(span.end_time_unix_nano);
    span.trace_id = turn.trace_id.into();
    span.shared = turn.shared.clone();
    span.parent_span_id = if span.parent_span_id.is_empty() {
        turn.span_id.into()
    } else {
        span.parent_span_id
    };
    FinishedSpan {
        resource: turn.resource.clone(),
        span,
    }
}

pub(crate) fn close_attempt(
    turn: &mut Turn,
    values: &mut Interner,
    api_request_id: &str,
    api: &view::ApiCall<'_>,
    failed: bool,
    t: u64,
    captured: &view::Content<'_>,
) -> FinishedSpan {
    let attempt = api.attempt.max(1);
    let end = if api.ended_at_unix_nano > 0 {
        api.ended_at_unix_nano
    } else {
        t
    };
    let (request_id, request) = match turn.requests.get_key_value_mut(api_request_id) {
        Some((id, request)) => (id.clone(), request),
        None => {
            let id = Str::from(api_request_id);
            (id.clone(), turn.requests.entry(id).or_default())
        }
    };
    let mut open = request.close(attempt);
    let last_end = request.last_end.replace(end);
    if let Some(o) = &open {
        turn.held = turn.held.saturating_sub(o.bytes() + api_request_id.len());
    }
    if last_end.is_none() {
        turn.held += RECORD_BYTES / 2 + api_request_id.len();
    }
    let start = match &open {
        Some(o) => o.start,
        None if attempt <= 1 && api.started_at_unix_nano > 0 => api.started_at_unix_nano,
        None => last_end.unwrap_or(if api.started_at_unix_nano > 0 {
            api.started_at_unix_nano
        } else {
            end
        }),
    };
    // The pre event's content, taken rather than copied: the attempt is
    // closed.
    let pre_input = open.as_mut().map(|o| std::mem::take(&mut o.input));
    turn.api_attempts += 1;
    // The post (or error) event's value, else the pre event's: borrowed,
    // the attributes copy them once.
    fn pick<'a>(post: &'a str, pre: Option<&'a str>) -> &'a str {
        if post.is_empty() {
            pre.unwrap_or_default()
        } else {
            post
        }
    }
    let model = pick(api.model, open.as_ref().map(|o| o.model.as_str()));
    let provider = pick(api.provider, open.as_ref().map(|o| o.provider.as_str()));
    let base_url = pick(api.base_url, open.as_ref().map(|o| o.base_url.as_str()));
    let max_tokens = api.max_tokens.or(open.as_ref().and_then(|o| o.max_tokens));
    let api_call_count = if api.api_call_count > 0 {
        api.api_call_count
    } else {
        open.as_ref().map_or(0, |o| o.api_call_count)
    };
    if turn.model.is_empty() {
        turn.model = values.get(model);
    }
    let mut a = turn.common(21);
    let turn_model = turn.model.clone();
    a.fixed("gen_ai.operation.name", "chat")
        .common_str("gen_ai.provider.name", provider, values)
        .shared_or_str("gen_ai.request.model", &turn_model, model)
        .opt_uint("gen_ai.request.max_tokens", max_tokens)
        .shared("hermes.api_request_id", &request_id)
        .uint("hermes.api_call_count", api_call_count)
        .uint("hermes.attempt", u64::from(attempt));
    if let Some((host, port)) = server_address(base_url) {
        a.common_str("server.address", host, values);
        if let Some(port) = port {
            a.int("server.port", i64::from(port));
        }
    }
    // Content: the request of the pre event, else of the error event.
    let input = match pre_input {
        Some((None, None)) | None => captured
            .get(content::REQUEST)
            .map_or((None, None), content::chat_input),
        Some(input) => input,
    };
    if let Some(messages) = &input.0 {
        a.str("gen_ai.input.messages", messages);
    }
    if let Some(system) = &input.1 {
        a.str("gen_ai.system_instructions", system);
    }
    if let Some(output) = captured
        .get(content::RESPONSE)
        .and_then(content::chat_output)
    {
        a.str("gen_ai.output.messages", &output);
    }
    let mut status = None;
    let mut events = Vec::new();
    if failed {
        let error_type = if api.reason.is_empty() {
            api.error_type
        } else {
            api.reason
        };
        a.str(
            "error.type",
            if error_type.is_empty() {
                "_OTHER"
            } else {
                error_type
            },
        );
        if let Some(code) = api.status_code {
            a.int("http.response.status_code", i64::from(code));
        }
        a.opt_bool("hermes.retryable", api.retryable)
            .uint("hermes.retry_count", u64::from(api.retry_count));
        let mut ev = Attrs::default();
        ev.str("exception.type", api.error_type)
            .str("exception.message", api.error_message);
        events.push(span::Event {
            time_unix_nano: end,
            name: Str::from_static("exception"),
            attributes: ev.0,
            dropped_attributes_count: 0,
        });
        status = Some(error_status(api.error_message));
        turn.last_attempt_error = Some(if error_type.is_empty() {
            "_OTHER".to_owned()
        } else {
            error_type.to_owned()
        });
    } else {
        if api.ended_at_unix_nano > 0 || api.usage.is_some() {
            // A real response (not an attempt closed for lack of one).
            turn.last_attempt_error = None;
        }
        a.common_str("gen_ai.response.model", api.response_model, values);
        if !api.finish_reason.is_empty() {
            a.common_str_array(
                "gen_ai.response.finish_reasons",
                &[api.finish_reason],
                values,
            );
        }
        if let Some(u) = &api.usage {
            a.uint("gen_ai.usage.input_tokens", u.prompt_tokens)
                .uint("gen_ai.usage.output_tokens", u.output_tokens)
                .uint("gen_ai.usage.cache_read.input_tokens", u.cache_read_tokens)
                .uint(
                    "gen_ai.usage.cache_creation.input_tokens",
                    u.cache_write_tokens,
                )
                .uint("gen_ai.usage.reasoning.output_tokens", u.reasoning_tokens);
            turn.input_tokens = turn.input_tokens.saturating_add(u.prompt_tokens);
            turn.output_tokens = turn.output_tokens.saturating_add(u.output_tokens);
        }
    }
    let span_id = span_id(SpanKey::Chat {
        api_request_id,
        attempt,
    });
    child_span(
        turn,
        Span {
            span_id: span_id.into(),
            name: values.joined("chat ", model),
            kind: span::SpanKind::Client as i32,
            start_time_unix_nano: start,
            end_time_unix_nano: end,
            attributes: a.0,
            events,
            status,
            ..Default::default()
        },
    )
}

pub(crate) fn close_tool(
    turn: &mut Turn,
    values: &mut Interner,
    tool_call_id: &Str,
    open: Option<OpenTool>,
    tool: &view::ToolCall<'_>,
    t: u64,
) -> FinishedSpan {
    let name = match &open {
        Some(o) if tool.tool_name.is_empty() => o.name.as_str(),
        _ => tool.tool_name,
    };
    let start = match &open {
        Some(o) => o.start,
        None => t.saturating_sub(
            tool.duration_ms
                .unwrap_or(0)
                .saturating_mul(NANOS_PER_MILLI),
        ),
    };
    turn.tool_calls += 1;
    let mut a = turn.common(10);
    a.fixed("gen_ai.operation.name", "execute_tool")
        .common_str("gen_ai.tool.name", name, values)
        .shared("gen_ai.tool.call.id", tool_call_id)
        .fixed("gen_ai.tool.type", "function")
        .common_str("hermes.tool.status", tool.status, values)
        .opt_uint("hermes.tool.duration_ms", tool.duration_ms);
    if let Some(arguments) = open.as_ref().and_then(|o| o.arguments.as_deref()) {
        a.str("gen_ai.tool.call.arguments", arguments);
    }
    let status = if tool.status == "error" {
        a.str(
            "error.type",
            if tool.error_type.is_empty() {
                "_OTHER"
            } else {
                tool.error_type
            },
        );
        Some(error_status(tool.error_message))
    } else {
        None
    };
    let span_id = span_id(SpanKey::Tool {
        turn_id: &turn.turn_id,
        tool_call_id,
    });
    child_span(
        turn,
        Span {
            span_id: span_id.into(),
            name: values.joined("execute_tool ", name),
            kind: span::SpanKind::Internal as i32,
            start_time_unix_nano: start,
            end_time_unix_nano: t,
            attributes: a.0,
            status,
            ..Default::default()
        },
    )
}

fn mark_incomplete(span: &mut Span) {
    span.attributes.push(attrs::kv(
        "hermes.incomplete",
        any_value::Value::BoolValue(true),
    ));
}

pub(crate) fn error_status(message: &str) -> Status {
    Status {
        message: message.to_owned(),
        code: status::StatusCode::Error as i32,
    }
}

pub(crate) fn scalar_kv(key: &str, v: v1::scalar::Value) -> KeyValue {
    use v1::scalar::Value as S;
    let value = match v {
        S::StringValue(s) => any_value::Value::StringValue(s.into()),
        S::BoolValue(b) => any_value::Value::BoolValue(b),
        S::IntValue(i) => any_value::Value::IntValue(i),
        S::DoubleValue(d) => any_value::Value::DoubleValue(d),
    };
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(value) }),
    }
}

/// Host and port of an `http(s)://host[:port]/...` base URL.
///
/// Scans bytes rather than searching with `str` patterns: it runs on every
/// chat span, and a substring searcher's set-up for `"://"` plus two
/// `rsplit_once` cost more than the whole scan of a short URL.
fn server_address(base_url: &str) -> Option<(&str, Option<u16>)> {
    let colon = base_url.as_bytes().windows(3).position(|w| w == b"://")?;
    let (scheme, rest) = (&base_url[..colon], &base_url[colon + 3..]);
    let end = rest
        .bytes()
        .position(|b| matches!(b, b'/' | b'?' | b'#'))
        .unwrap_or(rest.len());
    let authority = &rest[..end];
    let authority = match authority.bytes().rposition(|b| b == b'@') {
        Some(at) => &authority[at + 1..],
        None => authority,
    };
    let default_port = match scheme {
        "https" => Some(443),
        "http" => Some(80),
        _ => None,
    };
    if let Some(v6) = authority.strip_prefix('[') {
        let (host, rest) = v6.split_once(']')?;
        let port = rest
            .strip_prefix(':')
            .and_then(|p| p.parse().ok())
            .or(default_port);
        return Some((host, port));
    }
    match authority.bytes().rposition(|b| b == b':') {
        Some(at) => Some((
            &authority[..at],
            authority[at + 1..].parse().ok().or(default_port),
        )),
        None if authority.is_empty() => None,
        None => Some((authority, default_port)),
    }
}

/// Groups finished spans into OTLP `ResourceSpans`, one per resource, in
/// first-seen order, under the collector's instrumentation scope.
///
/// Each group's list is allocated once at its size: a first pass finds each
/// span's group (a batch holds few resources, usually one), the second moves
/// every span once, into its place.
pub fn to_resource_spans(spans: Vec<FinishedSpan>) -> Vec<ResourceSpans> {
    let mut resources: Vec<(Arc<Resource>, usize)> = Vec::new();
    let mut group_of = Vec::with_capacity(spans.len());
    for FinishedSpan { resource, .. } in &spans {
        let group = match resources
            .iter()
            .position(|(r, _)| Arc::ptr_eq(r, resource) || **r == **resource)
        {
            Some(group) => group,
            None => {
                resources.push((Arc::clone(resource), 0));
                resources.len() - 1
            }
        };
        resources[group].1 += 1;
        group_of.push(group);
    }
    let mut lists: Vec<Vec<Span>> = resources
        .iter()
        .map(|(_, len)| Vec::with_capacity(*len))
        .collect();
    for (finished, group) in spans.into_iter().zip(group_of) {
        lists[group].push(finished.span);
    }
    resources
        .into_iter()
        .zip(lists)
        .map(|((resource, _), spans)| ResourceSpans {
            resource: Some(Arc::unwrap_or_clone(resource)),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: Str::from_static(SCOPE_NAME),
                    version: Str::from_static(env!("CARGO_PKG_VERSION")),
                    ..Default::default()
                }),
                spans,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_are_grouped_by_resource_in_first_seen_order() {
        let resource = |service: &str| {
            let mut a = Attrs::default();
            a.str("service.name", service);
            Arc::new(Resource {
                attributes: a.0,
                ..Default::default()
            })
        };
        let (a, b) = (resource("a"), resource("b"));
        let finished = |resource: &Arc<Resource>, name: &'static str| FinishedSpan {
            resource: Arc::clone(resource),
            span: Span {
                name: Str::from_static(name),
                ..Default::default()
            },
        };
        let batch = to_resource_spans(vec![
            finished(&b, "1"),
            finished(&a, "2"),
            // Equal to `b` but not the same allocation.
            finished(&resource("b"), "3"),
            finished(&b, "4"),
        ]);
        let groups: Vec<(String, Vec<String>)> = batch
            .iter()
            .map(|rs| {
                let resource = rs.resource.as_ref().map(|r| &r.attributes);
                let service = resource
                    .and_then(|attrs| attrs.first())
                    .and_then(|kv| kv.value.as_ref())
                    .and_then(|v| match &v.value {
                        Some(any_value::Value::StringValue(s)) => Some(s.to_string()),
                        _ => None,
                    })
                    .unwrap_or_default();
                let names = rs.scope_spans[0]
                    .spans
                    .iter()
                    .map(|s| s.name.to_string())
                    .collect();
                (service, names)
            })
            .collect();
        assert_eq!(
            groups,
            vec![
                (
                    "b".to_owned(),
                    vec!["1".to_owned(), "3".to_owned(), "4".to_owned()]
                ),
                ("a".to_owned(), vec!["2".to_owned()]),
            ]
        );
        assert_eq!(
            batch[0].scope_spans[0].spans.capacity(),
            3,
            "allocated at its size"
        );
    }

    #[test]
    fn server_address_parses_common_urls() {
        assert_eq!(
            server_address("http://127.0.0.1:45501/v1"),
            Some(("127.0.0.1", Some(45501)))
        );
        assert_eq!(
            server_address("https://api.openai.com/v1"),
            Some(("api.openai.com", Some(443)))
        );
        assert_eq!(
            server_address("http://[::1]:8080"),
            Some(("::1", Some(8080)))
        );
        assert_eq!(server_address("nonsense"), None);
        assert_eq!(
            server_address("https://user:pw@proxy.local:8443?x=1"),
            Some(("proxy.local", Some(8443)))
        );
        assert_eq!(server_address("http://host#frag"), Some(("host", Some(80))));
        assert_eq!(
            server_address("grpc://h:bad/x"),
            Some(("h", None)),
            "an unknown scheme has no default port"
        );
        assert_eq!(
            server_address("a:b://c:9"),
            Some(("c", Some(9))),
            "the first `://` ends the scheme"
        );
        assert_eq!(server_address("https:///v1"), None);
    }
}
