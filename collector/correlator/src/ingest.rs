//! [`Correlator::ingest`]: each hook event to the state it opens, updates
//! or closes, by hook family.

use std::borrow::Cow;

use super::*;

impl Correlator {
    /// Correlates one event of `shim`'s. An event that does not decode
    /// is counted ([`Stats::undecodable_events`]) and changes nothing.
    pub fn ingest<E: Source + ?Sized>(
        &mut self,
        shim: &v1::ShimInfo,
        event: &E,
        out: &mut Vec<FinishedSpan>,
    ) {
        // Matched by case: binding the `Cow` would move the whole view (a
        // few hundred bytes) for every event, where a borrowed one is a
        // pointer.
        match event.view() {
            Ok(Cow::Borrowed(event)) => self.ingest_view(shim, event, out),
            Ok(Cow::Owned(event)) => self.ingest_view(shim, &event, out),
            Err(_) => self.stats.undecodable_events += 1,
        }
    }

    /// Correlates one event, its strings borrowed: what the state keeps of
    /// them is copied.
    pub fn ingest_view(
        &mut self,
        shim: &v1::ShimInfo,
        event: &view::Event<'_>,
        out: &mut Vec<FinishedSpan>,
    ) {
        self.stats.events += 1;
        let before = out.len();
        let instance = shim.instance_id.as_str();
        // Missing ids or a missing body read as empty: each handler below
        // takes what the event has.
        let ids = match &event.ids {
            Some(ids) => ids,
            None => &view::Ids::default(),
        };
        let t = event.time_unix_nano;
        let platform = match event.body.as_ref() {
            Some(Body::Session(b)) => b.platform,
            Some(Body::Turn(b)) => b.platform,
            Some(Body::Api(b)) => b.platform,
            _ => "",
        };
        self.note_resource(shim, event.schema_version);
        let at = At {
            instance,
            ids,
            shim,
            schema_version: event.schema_version,
            t,
            platform,
        };
        match (event.hook, event.body.as_ref()) {
            (hooks::ON_SESSION_START, body) => {
                let (model, platform) = match body {
                    Some(Body::Session(s)) => {
                        (self.values.get(s.model), self.values.get(s.platform))
                    }
                    _ => Default::default(),
                };
                self.session_start(instance, ids.session_id, t, model, platform);
            }
            (hooks::PRE_LLM_CALL, body) => {
                self.close_superseded(ids, instance, out);
                if let Some((mut turn, values)) = self.turn_and_values(at, out) {
                    if !turn.started {
                        // pre_llm_call is the turn's real start, whatever
                        // events arrived before it.
                        turn.started = true;
                        turn.start = t;
                    }
                    if let Some(Body::Turn(b)) = body
                        && !b.model.is_empty()
                    {
                        turn.model = values.get(b.model);
                    }
                    if let Some(text) = event.content.get(content::USER_MESSAGE) {
                        let text = content::text(text);
                        turn.held += text.len();
                        if let Some(old) = turn.user_message.replace(text) {
                            turn.held = turn.held.saturating_sub(old.len());
                        }
                    }
                }
                self.attach_session_start(instance, ids.session_id);
            }
            (hooks::POST_LLM_CALL, _) => {
                let clock = self.clock;
                if let Some(mut turn) = self.turn(at, out) {
                    turn.end = Some(turn.end.map_or(t, |e| e.max(t)));
                    turn.end_seen = t.max(clock);
                    if let Some(text) = event.content.get(content::ASSISTANT_RESPONSE) {
                        let text = content::text(text);
                        turn.held += text.len();
                        if let Some(old) = turn.final_answer.replace(text) {
                            turn.held = turn.held.saturating_sub(old.len());
                        }
                    }
                }
            }
            (hooks::ON_SESSION_END, body) => {
                if ids.turn_id.is_empty() {
                    // Shutdown variant: no turn id; closes the session.
                    self.close_session(ids.session_id, instance, t, out);
                } else {
                    // The turn's loan ends (and charges it) before it is taken.
                    let end = self.turn(at, out).map(|mut turn| {
                        if let Some(Body::Turn(b)) = body {
                            turn.completed = b.completed;
                            turn.interrupted = b.interrupted;
                            turn.end_reason = b.reason.to_owned();
                        }
                        turn.end.unwrap_or(t)
                    });
                    if let Some(end) = end
                        && let Some(turn) = self.take_turn_of(instance, ids.turn_id)
                    {
                        self.emit_turn(turn, end, false, out);
                    }
                }
            }
            (hooks::ON_SESSION_FINALIZE, _) => {
                self.close_session(ids.session_id, instance, t, out);
                self.session_ended(instance, ids.session_id);
            }
            (hooks::ON_SESSION_RESET, _) => {
                // Carries the new session's id; the old one's end is the
                // finalize the host fires before it.
                self.close_session(ids.session_id, instance, t, out);
            }
            (hooks::PRE_API_REQUEST, Some(Body::Api(api))) => {
                if let Some((mut turn, values)) = self.turn_and_values(at, out) {
                    let start = if api.attempt <= 1 && api.started_at_unix_nano > 0 {
                        api.started_at_unix_nano
                    } else {
                        t
                    };
                    let attempt = OpenAttempt {
                        start,
                        model: values.get(api.model),
                        provider: values.get(api.provider),
                        base_url: values.get(api.base_url),
                        api_call_count: api.api_call_count,
                        max_tokens: api.max_tokens,
                        input: event
                            .content
                            .get(content::REQUEST)
                            .map_or((None, None), content::chat_input),
                    };
                    turn.held += attempt.bytes() + ids.api_request_id.len();
                    let request = match turn.requests.get_mut(ids.api_request_id) {
                        Some(request) => request,
                        None => turn
                            .requests
                            .entry(Str::from(ids.api_request_id))
                            .or_default(),
                    };
                    let old = request.open(api.attempt.max(1), attempt);
                    if let Some(old) = old {
                        turn.held = turn
                            .held
                            .saturating_sub(old.bytes() + ids.api_request_id.len());
                    }
                }
            }
            (hooks::POST_API_REQUEST | hooks::API_REQUEST_ERROR, Some(Body::Api(api))) => {
                let failed = event.hook == hooks::API_REQUEST_ERROR;
                if let Some((mut turn, values)) = self.turn_and_values(at, out) {
                    let span = close_attempt(
                        &mut turn,
                        values,
                        ids.api_request_id,
                        api,
                        failed,
                        t,
                        &event.content,
                    );
                    out.push(span);
                }
            }
            (hooks::PRE_TOOL_CALL, body) => {
                if let Some((mut turn, values)) = self.turn_and_values(at, out) {
                    let name = match body {
                        Some(Body::Tool(b)) => values.get(b.tool_name),
                        _ => Str::default(),
                    };
                    let tool = OpenTool {
                        start: t,
                        name,
                        arguments: event.content.get(content::ARGS).map(str::to_owned),
                    };
                    turn.held += tool.bytes() + ids.tool_call_id.len();
                    if let Some(old) = turn.tools.insert(ids.tool_call_id.into(), tool) {
                        turn.held = turn
                            .held
                            .saturating_sub(old.bytes() + ids.tool_call_id.len());
                    }
                }
            }
            (hooks::POST_TOOL_CALL, body) => {
                let tool = match body {
                    Some(Body::Tool(b)) => b,
                    _ => &view::ToolCall::default(),
                };
                if let Some((mut turn, values)) = self.turn_and_values(at, out) {
                    // Requests of this tool still waiting are unanswered:
                    // closed with it, under it.
                    approval::close_for_tool(&mut turn, ids.tool_call_id, t, out);
                    let (id, open) = match turn.tools.remove_entry(ids.tool_call_id) {
                        Some((id, o)) => {
                            turn.held = turn.held.saturating_sub(o.bytes() + id.len());
                            (id, Some(o))
                        }
                        None => (ids.tool_call_id.into(), None),
                    };
                    let mut span = close_tool(&mut turn, values, &id, open, tool, t);
                    if let Some(result) = event.content.get(content::RESULT) {
                        span.span.attributes.push(attrs::kv(
                            "gen_ai.tool.call.result",
                            any_value::Value::StringValue(content::text(result).into()),
                        ));
                    }
                    out.push(span);
                }
            }
            (hooks::SUBAGENT_START | hooks::SUBAGENT_STOP, body) => {
                let sub = match body {
                    Some(Body::Subagent(s)) => s,
                    _ => &view::Subagent::default(),
                };
                if event.hook == hooks::SUBAGENT_START {
                    self.subagent_start(at, sub, out);
                } else {
                    self.subagent_stop(at, sub, out);
                }
            }
            (hooks::PRE_APPROVAL_REQUEST | hooks::POST_APPROVAL_RESPONSE, body) => {
                let appr = match body {
                    Some(Body::Approval(a)) => a,
                    _ => &view::Approval::default(),
                };
                if let Some(mut turn) = self.turn(at, out) {
                    if event.hook == hooks::PRE_APPROVAL_REQUEST {
                        approval::request(&mut turn, ids, appr, t);
                    } else {
                        out.push(approval::respond(&mut turn, ids, appr, t));
                    }
                }
            }
            (hooks::PROCESS_EXIT, _) => self.process_exit(instance, t, out),
            (hook, body) => {
                self.stats.unknown_hooks += 1;
                let turn_key = key(instance, ids.turn_id);
                if self.closed.contains(&turn_key) {
                    self.stats.late_events_dropped += 1;
                    self.closed_unit(instance, 0, self.max_lsn);
                }
                if let Some(turn) = self.turns.get_mut(&turn_key) {
                    let mut attrs = Attrs::default();
                    if let Some(Body::Other(other)) = body {
                        for (k, v) in &other.fields {
                            if let Some(v) = v.value.clone() {
                                attrs.0.push(scalar_kv(k, v));
                            }
                        }
                    }
                    turn.last_seen = turn.last_seen.max(t);
                    turn.active_seen = turn.active_seen.max(t).max(self.clock);
                    turn.min_lsn = turn.min_lsn.min(self.lsn);
                    turn.max_lsn = turn.max_lsn.max(self.max_lsn);
                    turn.held += RECORD_BYTES
                        + hook.len()
                        + attrs.0.iter().map(attrs::approx_bytes).sum::<usize>();
                    turn.events.push(span::Event {
                        time_unix_nano: t,
                        name: format!("hermes.hook.{hook}").into(),
                        attributes: attrs.0,
                        dropped_attributes_count: 0,
                    });
                    self.charge_key(&turn_key);
                }
            }
        }
        // Each turn the event changed was charged as its handler let it go
        // (`TurnMut`): hold every budget.
        self.enforce_budgets(instance, out);
        self.stats.spans += (out.len() - before) as u64;
    }
}
