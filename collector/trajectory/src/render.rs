//! A trajectory as readable steps in the terminal (`hermes-collector view
//! --session`): a header (session, schema, agent, model, whether it is
//! complete), one block per step (number, source, model and tokens, the
//! message, each tool call `→` and each result `←`), the totals, then each
//! subagent's trajectory indented under it. Texts are cleaned of control
//! characters and cut; output is deterministic (no colors, no local time).

use std::fmt::Write as _;

use serde_json::Value;

use crate::atif::{Metrics, Source, Step, Trajectory};

/// Longest text shown of a message, argument list or result, in characters.
const MAX_TEXT: usize = 240;

/// `trajectory` as text, subagents indented under their parent.
pub fn render(trajectory: &Trajectory) -> String {
    let mut out = String::new();
    write_trajectory(&mut out, trajectory, 0);
    out
}

fn write_trajectory(out: &mut String, t: &Trajectory, depth: usize) {
    let pad = "  ".repeat(depth);
    let incomplete = t
        .extra
        .as_ref()
        .and_then(|e| e.get("incomplete"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let _ = writeln!(
        out,
        "{pad}session {}  {}  agent {} {}{}{}",
        t.session_id.as_deref().unwrap_or("?"),
        t.schema_version,
        t.agent.name,
        t.agent.version,
        t.agent
            .model_name
            .as_deref()
            .map(|m| format!("  model {m}"))
            .unwrap_or_default(),
        if incomplete { "  INCOMPLETE" } else { "" },
    );
    if let Some(notes) = &t.notes {
        let _ = writeln!(out, "{pad}  note: {}", clean(notes));
    }
    for step in &t.steps {
        write_step(out, step, &pad);
    }
    if let Some(m) = &t.final_metrics {
        let _ = writeln!(
            out,
            "{pad}totals: {} steps, {} prompt tokens ({} cached), {} completion tokens",
            m.total_steps.unwrap_or(t.steps.len() as u64),
            m.total_prompt_tokens.unwrap_or(0),
            m.total_cached_tokens.unwrap_or(0),
            m.total_completion_tokens.unwrap_or(0),
        );
    }
    if let Some(next) = &t.continued_trajectory_ref {
        let _ = writeln!(out, "{pad}continued in {next}");
    }
    for sub in t.subagent_trajectories.iter().flatten() {
        let _ = writeln!(
            out,
            "{pad}  subagent {}:",
            sub.trajectory_id.as_deref().unwrap_or("?")
        );
        write_trajectory(out, sub, depth + 2);
    }
}

fn write_step(out: &mut String, step: &Step, pad: &str) {
    let source = match step.source {
        Source::User => "user",
        Source::Agent => "agent",
        Source::System => "system",
    };
    let mut head = format!("{pad}#{} {source}", step.step_id);
    if let Some(model) = &step.model_name {
        let _ = write!(head, "  {model}");
    }
    if let Some(m) = &step.metrics {
        head.push_str(&tokens(m));
    }
    if let Some(failed) = step
        .extra
        .as_ref()
        .and_then(|e| e.get("failed_attempts"))
        .and_then(Value::as_array)
    {
        let _ = write!(head, "  after {} failed attempt(s)", failed.len());
    }
    let _ = writeln!(out, "{head}");
    if !step.message.is_empty() {
        let _ = writeln!(out, "{pad}    {}", clean(&step.message));
    }
    for call in step.tool_calls.iter().flatten() {
        let args = Value::Object(call.arguments.clone()).to_string();
        let _ = writeln!(
            out,
            "{pad}    → {} [{}] {}",
            call.function_name,
            call.tool_call_id,
            clean(&args)
        );
    }
    for result in step.observation.iter().flat_map(|o| o.results.iter()) {
        let id = result.source_call_id.as_deref().unwrap_or("-");
        let content = result.content.as_deref().unwrap_or("");
        let _ = writeln!(out, "{pad}    ← [{id}] {}", clean(content));
        for r in result.subagent_trajectory_ref.iter().flatten() {
            let _ = writeln!(
                out,
                "{pad}      subagent {}",
                r.trajectory_id.as_deref().unwrap_or("?")
            );
        }
    }
}

fn tokens(m: &Metrics) -> String {
    let mut s = format!(
        "  tokens {} in / {} out",
        m.prompt_tokens.unwrap_or(0),
        m.completion_tokens.unwrap_or(0)
    );
    if let Some(cached) = m.cached_tokens.filter(|c| *c > 0) {
        let _ = write!(s, " ({cached} cached)");
    }
    s
}

/// Control characters as spaces, cut to [`MAX_TEXT`] characters.
fn clean(s: &str) -> String {
    let cleaned: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    match cleaned.char_indices().nth(MAX_TEXT) {
        Some((cut, _)) => format!("{}…", &cleaned[..cut]),
        None => cleaned,
    }
}
