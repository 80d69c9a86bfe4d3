//! The collector binary's command line: `validate`, bad configuration
//! refused with exit code 64 naming the key, before any port is bound, and
//! `view --session` showing a trajectory.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::time::Duration;

use hermes_e2e::collector::write_config;
use hermes_e2e::{cargo_bin, free_port, repo_root, run_with_timeout};

fn collector(args: &[&str], env: &[(&str, &str)]) -> hermes_e2e::RunOutput {
    let mut cmd = Command::new(cargo_bin("hermes-collector", "hermes-collector"));
    cmd.args(args).current_dir(repo_root());
    for (k, v) in env {
        cmd.env(k, v);
    }
    run_with_timeout(&mut cmd, Duration::from_secs(30))
}

#[test]
fn the_example_config_validates() {
    let out = collector(&["validate", "--config", "config/collector.yaml"], &[]);
    assert!(out.success(), "{}", out.describe());
    assert!(out.stdout().contains("valid"));
}

#[test]
fn invalid_configs_exit_64_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("receiver:\n  listen: nowhere\n", "receiver.listen"),
        ("batch:\n  max_spans: 0\n", "batch.max_spans"),
        (
            "exporters:\n  otlp:\n    endpoint: http://x:4317\n    endpont: y\n",
            "exporters.otlp.endpont",
        ),
        (
            "processing:\n  redaction:\n    value_patterns: ['(unclosed']\n",
            "processing.redaction.value_patterns[0]",
        ),
        (
            "exporters:\n  otlp:\n    endpoint: ${HERMES_TEST_SURELY_UNSET_VAR}\n",
            "line 3 (endpoint)",
        ),
        (
            "exporters:\n  atif:\n    dir: /nonexistent/trajectories\n",
            "exporters.atif.dir",
        ),
    ];
    for (yaml, key) in cases {
        let path = write_config(dir.path(), yaml);
        let out = collector(&["validate", "--config", &path], &[]);
        out.assert_refused_naming(yaml, key);
    }
}

#[test]
fn view_session_shows_a_trajectory_as_steps() {
    let dir = tempfile::tempdir().unwrap();
    let doc = serde_json::json!({
        "schema_version": "ATIF-v1.8",
        "session_id": "s1",
        "agent": {"name": "hermes", "version": "0.1.0", "model_name": "m"},
        "steps": [
            {"step_id": 1, "source": "user", "message": "list files"},
            {"step_id": 2, "source": "agent", "message": "",
             "tool_calls": [{"tool_call_id": "c1", "function_name": "terminal",
                             "arguments": {"command": "ls"}}],
             "observation": {"results": [{"source_call_id": "c1", "content": "a\nb"}]},
             "metrics": {"prompt_tokens": 10, "completion_tokens": 2}}
        ],
        "final_metrics": {"total_prompt_tokens": 10, "total_completion_tokens": 2, "total_steps": 2}
    });
    std::fs::write(dir.path().join("s1.json"), doc.to_string()).unwrap();
    let shown = dir.path().to_str().unwrap();
    let out = collector(&["view", "--session", "s1", "--dir", shown], &[]);
    assert!(out.success(), "{}", out.describe());
    let text = out.stdout();
    for line in [
        "== s1.json",
        "session s1  ATIF-v1.8  agent hermes 0.1.0  model m",
        "#1 user",
        "    list files",
        "#2 agent  tokens 10 in / 2 out",
        "    → terminal [c1] {\"command\":\"ls\"}",
        "    ← [c1] a b",
        "totals: 2 steps, 10 prompt tokens (0 cached), 2 completion tokens",
    ] {
        assert!(text.lines().any(|l| l == line), "{line:?} in:\n{text}");
    }
    let missing = collector(&["view", "--session", "s2", "--dir", shown], &[]);
    assert!(!missing.success());
    assert!(
        missing.stderr().contains("no trajectory of session s2"),
        "{}",
        missing.describe()
    );
}

#[test]
fn bad_config_at_start_exits_64_before_binding() {
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(
        dir.path(),
        &format!("receiver:\n  listen: 127.0.0.1:{port}\nshutdown:\n  grace_ms: 45000\n"),
    );
    let out = collector(&["--config", &path], &[]);
    out.assert_refused_naming("grace_ms over the limit", "shutdown.grace_ms");
    assert!(
        std::net::TcpListener::bind(("127.0.0.1", port)).is_ok(),
        "the port was never bound"
    );
}

#[test]
fn environment_references_are_interpolated() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(
        dir.path(),
        "exporters:\n  otlp:\n    endpoint: ${HERMES_TEST_OTLP:-http://127.0.0.1:4317}\n    headers:\n      authorization: \"Bearer ${HERMES_TEST_TOKEN}\"\n",
    );
    let out = collector(
        &["validate", "--config", &path],
        &[("HERMES_TEST_TOKEN", "abc")],
    );
    assert!(out.success(), "{}", out.describe());
    let out = collector(&["validate", "--config", &path], &[]);
    out.assert_refused_naming("unset variable", "HERMES_TEST_TOKEN");
}

/// The names of a process's threads, from `/proc`.
fn thread_names(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .map(|task| {
            let comm = task.unwrap().path().join("comm");
            std::fs::read_to_string(comm).unwrap().trim().to_owned()
        })
        .collect()
}

#[test]
fn runtime_sizes_the_workers_and_places_the_pipeline() {
    for (threads, pipeline, own_thread) in [(1, "", true), (3, "  pipeline: workers\n", false)] {
        let dir = tempfile::tempdir().unwrap();
        let collector = hermes_e2e::collector::Collector::start_with_sections(
            dir.path(),
            &format!("runtime:\n  worker_threads: {threads}\n{pipeline}"),
        );
        let log = collector.guard.stderr_text();
        assert!(
            log.contains(&format!("worker_threads={threads}")),
            "{threads}: {log}"
        );
        let names = thread_names(collector.guard.pid());
        let workers = names.iter().filter(|n| *n == "hermes-collecto").count();
        let pipelines = names.iter().filter(|n| *n == "hermes-pipeline").count();
        // The main thread bears the process's name too.
        assert_eq!(workers, threads + 1, "{names:?}");
        assert_eq!(pipelines, usize::from(own_thread), "{names:?}");
    }
}
