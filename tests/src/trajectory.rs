//! Trajectory tests' support: the `exporters.atif` section of a rig's
//! configuration, waiting for a session's trajectory file, validating it
//! with the pinned ATIF models (`atif==1.8.0` in the venv, run by the
//! venv's Python), and checking its steps against the spans the hooks made.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::Span;
use serde_json::Value;

use crate::otlp_logs_receiver::ReceivedLog;
use crate::span_tree::AttrsExt;
use crate::{run_with_timeout, wait_until};

/// YAML continuing a rig's `exporters:` section with the trajectory
/// exporter writing to `dir` (see [`crate::rig::AgentRig::start_configured`]).
pub fn atif_section(dir: &Path, idle_ms: u64) -> String {
    format!(
        "  atif:\n    dir: {}\n    idle_ms: {idle_ms}\n",
        dir.display()
    )
}

/// YAML continuing [`atif_section`] with its OTLP log export to
/// `endpoint` (`protocol`: `grpc` or `http/protobuf`), giving up a record
/// after `max_elapsed_secs`.
pub fn otlp_logs_section(endpoint: &str, protocol: &str, max_elapsed_secs: u64) -> String {
    format!(
        "    otlp_logs:\n      endpoint: {endpoint}\n      protocol: {protocol}\n      max_elapsed_secs: {max_elapsed_secs}\n"
    )
}

/// Checks that `log` is the OTLP log record of the trajectory file it
/// names (`hermes.trajectory.file`) in `dir`: its body is the file's JSON
/// (validated with the pinned ATIF models in `venv` as the file is), its
/// attributes say the session, schema version and whether it is complete,
/// and its resource is the agent's (`service_name`). Returns the file's
/// document; panics naming what differs.
pub fn assert_log_is_file(log: &ReceivedLog, dir: &Path, venv: &Path, service_name: &str) -> Value {
    let file = log
        .attr("hermes.trajectory.file")
        .unwrap_or_else(|| panic!("no hermes.trajectory.file: {log:?}"));
    let path = dir.join(&file);
    let doc: Value = serde_json::from_slice(
        &std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let body = log
        .body()
        .unwrap_or_else(|| panic!("no string body: {log:?}"));
    let sent: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("body: {e}\n{body}"));
    assert_eq!(sent, doc, "the record of {file} is the file's JSON");
    let copy = dir.join(format!(".{file}.log-body"));
    std::fs::write(&copy, body).unwrap_or_else(|e| panic!("{}: {e}", copy.display()));
    let valid = validate_atif(venv, &copy);
    let _ = std::fs::remove_file(&copy);
    if let Err(e) = valid {
        panic!("the record of {file} is not valid ATIF:\n{e}");
    }
    assert_eq!(
        log.attr("session.id").as_deref(),
        doc["session_id"].as_str()
    );
    assert_eq!(
        log.attr("hermes.trajectory.schema_version").as_deref(),
        doc["schema_version"].as_str()
    );
    let complete = doc["extra"]["incomplete"] != true;
    assert_eq!(
        log.attr("hermes.trajectory.complete"),
        Some(complete.to_string()),
        "{log:?}"
    );
    assert_eq!(log.record.event_name, "hermes.trajectory");
    assert_eq!(
        log.resource_attr("service.name").as_deref(),
        Some(service_name)
    );
    assert!(log.record.time_unix_nano > 0, "{log:?}");
    assert!(
        log.record.observed_time_unix_nano >= log.record.time_unix_nano,
        "{log:?}"
    );
    doc
}

/// The file of segment `segment` of `session` in `dir` (`<id>.json`, then
/// `<id>.<n>.json`), for ids that are safe file names as Hermes makes them.
pub fn trajectory_path(dir: &Path, session: &str, segment: u32) -> PathBuf {
    match segment {
        0 | 1 => dir.join(format!("{session}.json")),
        n => dir.join(format!("{session}.{n}.json")),
    }
}

/// Waits at most `timeout` for `path` to exist and parse as JSON; the
/// document, or a panic naming the path and `context`.
pub fn wait_for_trajectory(path: &Path, timeout: Duration, context: &dyn Fn() -> String) -> Value {
    let read = || {
        std::fs::read(path)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
    };
    assert!(
        wait_until(timeout, Duration::from_millis(100), || read().is_some()),
        "no trajectory {} within {timeout:?}:\n{}",
        path.display(),
        context()
    );
    read().unwrap_or_default()
}

/// Validates the file at `path` with `atif.Trajectory.model_validate` in
/// the venv `venv`; the models' error text when it does not validate.
pub fn validate_atif(venv: &Path, path: &Path) -> Result<(), String> {
    const CHECK: &str = "import json, sys\nimport atif\natif.Trajectory.model_validate(json.load(open(sys.argv[1])))\nprint('valid', atif.__version__ if hasattr(atif, '__version__') else '')\n";
    let python = venv.join("bin").join("python");
    let mut cmd = Command::new(python);
    cmd.arg("-c").arg(CHECK).arg(path);
    let out = run_with_timeout(&mut cmd, Duration::from_secs(60));
    if out.success() {
        Ok(())
    } else {
        Err(format!("{}\n{}", out.stdout(), out.stderr()))
    }
}

/// The spans of `session`'s own turns (not its subagents'), by start.
pub fn own_spans<'a>(spans: &'a [(Resource, Span)], session: &str) -> Vec<&'a Span> {
    let mut own: Vec<&Span> = spans
        .iter()
        .map(|(_, s)| s)
        .filter(|s| s.str_attr("session.id") == Some(session))
        .filter(|s| {
            s.str_attr("hermes.session_id")
                .is_none_or(|own| own == session)
        })
        .filter(|s| !s.has_attr("hermes.child_session_id"))
        .collect();
    own.sort_by_key(|s| s.start_time_unix_nano);
    own
}

/// Checks `doc`'s own steps against the spans its hooks made (`spans`,
/// from [`own_spans`]): one user step per turn with its user message, one
/// agent step per answered attempt in order with that attempt's token
/// counts, every tool call's result in the observation of the step that
/// called it, and the totals. Panics naming what differs.
pub fn assert_matches_spans(doc: &Value, spans: &[&Span]) {
    let steps = doc["steps"].as_array().cloned().unwrap_or_default();
    let op = |s: &&Span, name: &str| s.str_attr("gen_ai.operation.name") == Some(name);
    let turns: Vec<&&Span> = spans.iter().filter(|s| op(s, "invoke_agent")).collect();
    let users: Vec<&Value> = steps.iter().filter(|s| s["source"] == "user").collect();
    assert_eq!(users.len(), turns.len(), "a user step per turn: {doc:#}");
    for (user, turn) in users.iter().zip(&turns) {
        assert_eq!(
            user["message"].as_str(),
            turn.str_attr("hermes.turn.user_message"),
            "{doc:#}"
        );
    }
    let answered: Vec<&&Span> = spans
        .iter()
        .filter(|s| op(s, "chat") && s.has_attr("gen_ai.output.messages"))
        .collect();
    let agents: Vec<&Value> = steps.iter().filter(|s| s["source"] == "agent").collect();
    assert_eq!(
        agents.len(),
        answered.len(),
        "an agent step per answered attempt: {doc:#}"
    );
    for (step, chat) in agents.iter().zip(&answered) {
        let m = &step["metrics"];
        assert_eq!(
            m["prompt_tokens"].as_i64(),
            chat.int_attr("gen_ai.usage.input_tokens"),
            "{step:#}"
        );
        assert_eq!(
            m["completion_tokens"].as_i64(),
            chat.int_attr("gen_ai.usage.output_tokens"),
            "{step:#}"
        );
    }
    let tools: Vec<&&Span> = spans.iter().filter(|s| op(s, "execute_tool")).collect();
    let mut results = 0;
    for tool in &tools {
        let id = tool.str_attr("gen_ai.tool.call.id").unwrap_or_default();
        let step = agents
            .iter()
            .find(|s| {
                s["tool_calls"]
                    .as_array()
                    .is_some_and(|c| c.iter().any(|c| c["tool_call_id"] == id))
            })
            .unwrap_or_else(|| panic!("no step calls {id}: {doc:#}"));
        let call = step["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["tool_call_id"] == id)
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            call["function_name"].as_str(),
            tool.str_attr("gen_ai.tool.name"),
            "{call:#}"
        );
        let result = step["observation"]["results"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["source_call_id"] == id)
            .unwrap_or_else(|| panic!("no result of {id}: {step:#}"));
        assert_eq!(
            result["content"].as_str(),
            tool.str_attr("gen_ai.tool.call.result"),
            "{result:#}"
        );
        results += 1;
    }
    let observed: usize = agents
        .iter()
        .map(|s| s["observation"]["results"].as_array().map_or(0, Vec::len))
        .sum();
    assert_eq!(observed, results, "a result per tool span: {doc:#}");
    let sum = |key: &str| -> i64 { answered.iter().filter_map(|c| c.int_attr(key)).sum() };
    assert_eq!(
        doc["final_metrics"]["total_prompt_tokens"].as_i64(),
        Some(sum("gen_ai.usage.input_tokens")),
        "{doc:#}"
    );
    assert_eq!(
        doc["final_metrics"]["total_completion_tokens"].as_i64(),
        Some(sum("gen_ai.usage.output_tokens")),
        "{doc:#}"
    );
    assert_eq!(
        doc["final_metrics"]["total_steps"].as_u64(),
        Some(steps.len() as u64)
    );
}
