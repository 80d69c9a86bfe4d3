//! The collector binary's command line: `validate`, and bad configuration
//! refused with exit code 64 naming the key, before any port is bound.

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
    ];
    for (yaml, key) in cases {
        let path = write_config(dir.path(), yaml);
        let out = collector(&["validate", "--config", &path], &[]);
        out.assert_refused_naming(yaml, key);
    }
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

#[test]
fn runtime_worker_threads_sizes_the_runtime() {
    for threads in [1, 3] {
        let dir = tempfile::tempdir().unwrap();
        let collector = hermes_e2e::collector::Collector::start_with_sections(
            dir.path(),
            &format!("runtime:\n  worker_threads: {threads}\n"),
        );
        let log = collector.guard.stderr_text();
        assert!(
            log.contains(&format!("worker_threads={threads}")),
            "{threads}: {log}"
        );
    }
}
