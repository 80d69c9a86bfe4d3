//! Approval spans: one per `(tool_call_id, pattern_key, surface)` a turn
//! asked about.
//!
//! Hermes 0.19's smart review fires `pre_approval_request` with
//! `surface: smart`; when it decides, its `post_approval_response` follows
//! with the same surface; when it escalates, a second request and its
//! response follow with `surface: cli` (or `gateway`). Each request is its
//! own span, so the escalated review and the question the user answered are
//! both visible. A request that never gets its response (an escalated smart
//! review, an interrupt, a timeout) is still a span: it is closed when its
//! tool ends (or, without an open tool, when its turn ends), marked
//! `hermes.approval.answered=false`, without a choice.
//!
//! Owns the open approvals of a [`Turn`] (the map `Turn::approvals`) and
//! the bytes they are charged.

use hermes_proto::view;
use hermes_span::Str;
use hermes_span::trace::v1::{Span, span};

use crate::fair::RECORD_BYTES;
use crate::ids::{SpanKey, span_id};
use crate::{FinishedSpan, Turn, child_span, sorted_keys};

/// `(tool_call_id, pattern_key, surface)`.
pub(crate) type ApprovalKey = (String, String, String);

/// A request waiting for its response.
pub(crate) struct OpenApproval {
    start: u64,
    command: String,
}

impl OpenApproval {
    fn bytes(&self, key: &ApprovalKey) -> usize {
        RECORD_BYTES + self.command.len() + key.0.len() + key.1.len() + key.2.len()
    }
}

/// `pre_approval_request`: opens the request's span. A repeated request
/// (same tool call, pattern and surface) keeps the first one's start.
pub(crate) fn request(turn: &mut Turn, ids: &view::Ids<'_>, appr: &view::Approval<'_>, t: u64) {
    let key = (
        ids.tool_call_id.to_owned(),
        appr.pattern_key.to_owned(),
        appr.surface.to_owned(),
    );
    if turn.approvals.contains_key(&key) {
        return;
    }
    let open = OpenApproval {
        start: t,
        command: appr.command.to_owned(),
    };
    turn.held += open.bytes(&key);
    turn.approvals.insert(key, open);
}

/// `post_approval_response`: closes the request it answers (same tool
/// call, pattern and surface; a response without a surface answers the
/// latest open request of its tool call and pattern). A response without
/// its request is a span of its own, from the response's time.
pub(crate) fn respond(
    turn: &mut Turn,
    ids: &view::Ids<'_>,
    appr: &view::Approval<'_>,
    t: u64,
) -> FinishedSpan {
    let exact = (
        ids.tool_call_id.to_owned(),
        appr.pattern_key.to_owned(),
        appr.surface.to_owned(),
    );
    let key = if appr.surface.is_empty() && !turn.approvals.contains_key(&exact) {
        turn.approvals
            .iter()
            .filter(|(k, _)| k.0 == exact.0 && k.1 == exact.1)
            .max_by(|a, b| a.1.start.cmp(&b.1.start).then_with(|| a.0.cmp(b.0)))
            .map(|(k, _)| k.clone())
            .unwrap_or(exact)
    } else {
        exact
    };
    let open = take(turn, &key);
    close(turn, key, open, Some(appr), t, false)
}

/// Closes, unanswered, the open requests of `tool_call_id` at `t` (its
/// tool's end), in key order. Call while the tool is still open, so that
/// the spans nest under it.
pub(crate) fn close_for_tool(
    turn: &mut Turn,
    tool_call_id: &str,
    t: u64,
    out: &mut Vec<FinishedSpan>,
) {
    let keys = sorted_keys(&turn.approvals, |k, _| k.0 == tool_call_id);
    for key in keys {
        let open = take(turn, &key);
        out.push(close(turn, key, open, None, t, false));
    }
}

/// Closes, unanswered, every open request of a turn ending at `t`, in key
/// order; `incomplete` when the turn itself is.
pub(crate) fn close_all(turn: &mut Turn, t: u64, incomplete: bool, out: &mut Vec<FinishedSpan>) {
    let keys = sorted_keys(&turn.approvals, |_, _| true);
    for key in keys {
        let open = take(turn, &key);
        out.push(close(turn, key, open, None, t, incomplete));
    }
}

fn take(turn: &mut Turn, key: &ApprovalKey) -> Option<OpenApproval> {
    let open = turn.approvals.remove(key);
    if let Some(o) = &open {
        turn.held = turn.held.saturating_sub(o.bytes(key));
    }
    open
}

/// The span of one request; `response` is `None` for an unanswered one.
fn close(
    turn: &mut Turn,
    key: ApprovalKey,
    open: Option<OpenApproval>,
    response: Option<&view::Approval<'_>>,
    t: u64,
    incomplete: bool,
) -> FinishedSpan {
    let (tool_call_id, pattern_key, surface) = key;
    let start = open.as_ref().map_or(t, |o| o.start);
    let command = response
        .map(|r| r.command)
        .filter(|c| !c.is_empty())
        .or(open.as_ref().map(|o| o.command.as_str()))
        .unwrap_or_default()
        .to_owned();
    let mut a = turn.common(9);
    a.str("hermes.approval.pattern_key", &pattern_key)
        .str("hermes.approval.surface", &surface)
        .bool("hermes.approval.answered", response.is_some());
    if let Some(r) = response {
        a.str("hermes.approval.choice", r.choice)
            .str("hermes.approval.decided_by", r.decided_by);
    }
    a.str("hermes.approval.command", &command)
        .str("gen_ai.tool.call.id", &tool_call_id);
    if incomplete {
        a.bool("hermes.incomplete", true);
    }
    let turn_id = turn.turn_id.clone();
    // Under its tool while that tool is open (Hermes asks while the tool
    // runs); else under the turn, so that the parent is always a span that
    // gets emitted.
    let parent = if turn.tools.contains_key(tool_call_id.as_str()) {
        span_id(SpanKey::Tool {
            turn_id: &turn_id,
            tool_call_id: &tool_call_id,
        })
    } else {
        turn.span_id
    };
    let sid = span_id(SpanKey::Approval {
        turn_id: &turn_id,
        tool_call_id: &tool_call_id,
        pattern_key: &pattern_key,
        surface: &surface,
    });
    let name = if pattern_key.is_empty() {
        Str::from_static("approval")
    } else {
        format!("approval {pattern_key}").into()
    };
    child_span(
        turn,
        Span {
            span_id: sid.into(),
            parent_span_id: parent.into(),
            name,
            kind: span::SpanKind::Internal as i32,
            start_time_unix_nano: start,
            end_time_unix_nano: t,
            attributes: a.0,
            ..Default::default()
        },
    )
}
