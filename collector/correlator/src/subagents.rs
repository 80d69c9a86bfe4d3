//! Subagents: the `delegate_task` span and the links its child's turns
//! hang from.

use super::*;

impl Correlator {
    pub(crate) fn subagent_start(
        &mut self,
        at: At<'_>,
        sub: &view::Subagent<'_>,
        out: &mut Vec<FinishedSpan>,
    ) {
        let At {
            instance, ids, t, ..
        } = at;
        // Without a child session nothing can hang from the subagent, and a
        // session cannot be its own subagent (hostile or broken ids). A
        // second start for a child whose subagent is still open is ignored
        // too: the child's turns already hang from the first one, in its
        // trace, and moving the link would orphan them.
        let child_key = key(instance, ids.child_session_id);
        if ids.child_session_id.is_empty()
            || ids.child_session_id == ids.parent_session_id
            || self.subagents.contains_key(&child_key)
        {
            self.stats.unknown_hooks += 1;
            return;
        }
        let parent_ids = view::Ids {
            session_id: ids.parent_session_id,
            turn_id: ids.parent_turn_id,
            ..Default::default()
        };
        let parent_at = At {
            ids: &parent_ids,
            platform: "",
            ..at
        };
        let Some(parent_turn) = self.turn(parent_at, out) else {
            return;
        };
        let delegates: Vec<&Str> = parent_turn
            .tools
            .iter()
            .filter(|(_, tool)| tool.name == "delegate_task")
            .map(|(id, _)| id)
            .collect();
        let parent = match delegates.as_slice() {
            [only] => span_id(SpanKey::Tool {
                turn_id: ids.parent_turn_id,
                tool_call_id: only,
            }),
            _ => parent_turn.span_id,
        };
        let trace = parent_turn.trace_id;
        let root_session = parent_turn.root_session_id.clone();
        let task_id = parent_turn.task_id.clone();
        let platform = parent_turn.platform.clone();
        drop(parent_turn);
        let role = if sub.child_role.is_empty() {
            Str::from_static("subagent")
        } else {
            self.values.get(sub.child_role)
        };
        let mut common = Attrs::with_capacity(6);
        common
            .str("session.id", &root_session)
            .str("gen_ai.conversation.id", &root_session)
            .str("hermes.turn_id", ids.parent_turn_id)
            .str("hermes.task_id", &task_id)
            .str("gen_ai.agent.name", &role)
            .str("hermes.platform", &platform)
            .str("hermes.session_id", ids.parent_session_id);
        let span = span_id(SpanKey::Subagent {
            child_session_id: ids.child_session_id,
        });
        self.remove_link(&child_key);
        let bytes = 2 * RECORD_BYTES
            + 3 * ids.child_session_id.len()
            + ids.parent_turn_id.len()
            + ids.parent_session_id.len()
            + ids.child_subagent_id.len()
            + sub.child_goal.len()
            + role.len();
        self.ledger.add(instance, 0, 1, bytes);
        self.track(Kind::Link, instance, t, ids.child_session_id);
        self.links.insert(
            child_key.clone(),
            SubagentLink {
                instance: instance.into(),
                bytes,
                trace_id: trace,
                span_id: span,
                root_session_id: root_session,
                role,
                last_seen: t,
            },
        );
        let resource = self.resource(at.shim, at.schema_version);
        self.subagents.insert(
            child_key,
            OpenSubagent {
                parent,
                resource,
                common,
                start: t,
                child_session_id: ids.child_session_id.to_owned(),
                child_subagent_id: ids.child_subagent_id.to_owned(),
                goal: sub.child_goal.to_owned(),
                child_seen: 0,
                min_lsn: self.lsn,
            },
        );
    }

    pub(crate) fn subagent_stop(
        &mut self,
        at: At<'_>,
        sub: &view::Subagent<'_>,
        out: &mut Vec<FinishedSpan>,
    ) {
        let (ids, t) = (at.ids, at.t);
        let child_key = key(at.instance, ids.child_session_id);
        if !self.subagents.contains_key(&child_key) {
            // Missing start: build the span from the stop event and its duration.
            let start =
                t.saturating_sub(sub.duration_ms.unwrap_or(0).saturating_mul(NANOS_PER_MILLI));
            let mut start_ids = ids.clone();
            start_ids.child_subagent_id = "";
            let start_at = At {
                ids: &start_ids,
                t: start,
                ..at
            };
            self.subagent_start(start_at, sub, out);
        }
        self.subagent_stop_at(&child_key, sub, t, false, out);
    }
    pub(crate) fn subagent_stop_at(
        &mut self,
        child: &str,
        sub: &view::Subagent<'_>,
        t: u64,
        incomplete: bool,
        out: &mut Vec<FinishedSpan>,
    ) {
        let Some(open) = self.subagents.remove(child) else {
            return;
        };
        let Some(link) = self.links.get(child).cloned() else {
            return;
        };
        self.closed_unit(&link.instance, open.min_lsn, self.max_lsn);
        let mut a = open.common.clone();
        a.fixed("gen_ai.operation.name", "invoke_agent")
            .str("gen_ai.agent.id", &open.child_subagent_id)
            .str("hermes.child_session_id", &open.child_session_id)
            .str("hermes.subagent.status", sub.child_status)
            .str(
                "hermes.subagent.goal",
                if open.goal.is_empty() {
                    sub.child_goal
                } else {
                    &open.goal
                },
            )
            .str("hermes.subagent.summary", sub.child_summary)
            .opt_uint("hermes.subagent.duration_ms", sub.duration_ms);
        if incomplete {
            a.bool("hermes.incomplete", true);
        }
        let failed = matches!(sub.child_status, "error" | "failed");
        out.push(FinishedSpan {
            resource: open.resource,
            span: Span {
                trace_id: link.trace_id.into(),
                span_id: link.span_id.into(),
                parent_span_id: open.parent.into(),
                name: format!("invoke_agent {}", link.role).into(),
                kind: span::SpanKind::Internal as i32,
                start_time_unix_nano: open.start,
                end_time_unix_nano: t.max(open.start),
                attributes: a.0,
                status: failed.then(|| error_status(sub.child_status)),
                ..Default::default()
            },
        });
    }
}
