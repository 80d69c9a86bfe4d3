//! Hostile and mistaken configuration against the real binary: every input
//! that once hung, exhausted memory, passed `validate` and failed the start,
//! or leaked an environment value into the log. Each bad input is refused by
//! `validate` and by the start alike, with exit 64 naming the key, well
//! within a hang guard; a span file that cannot be written (`/dev/full`)
//! neither holds the drain nor goes uncounted.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use hermes_e2e::collector::Collector;
use hermes_e2e::fault::{loadgen_summary, run_loadgen};
use hermes_e2e::{RunOutput, cargo_bin, free_port, run_with_timeout, write_file};

/// Only a guard against a hang: every refusal here takes milliseconds.
const HANG_GUARD: Duration = Duration::from_secs(20);

/// `hermes-collector ARGS…` in `cwd` with `env`, bounded by the hang guard.
fn collector(cwd: &Path, args: &[&str], env: &[(&str, &str)]) -> RunOutput {
    let mut cmd = Command::new(cargo_bin("hermes-collector", "hermes-collector"));
    cmd.current_dir(cwd)
        .args(args)
        .envs(env.iter().copied())
        .env("RUST_LOG", "info");
    run_with_timeout(&mut cmd, HANG_GUARD)
}

/// `validate` and `run` both exit 64 on `config`, naming `key`.
fn refused(cwd: &Path, config: &Path, key: &str) {
    let config = config.to_str().unwrap();
    for args in [
        vec!["validate", "--config", config],
        vec!["--config", config],
    ] {
        let out = collector(cwd, &args, &[]);
        assert!(!out.timed_out, "{args:?} hung:\n{}", out.describe());
        out.assert_refused_naming(&format!("{args:?}"), &format!("`{key}`"));
        assert!(
            out.elapsed < Duration::from_secs(5),
            "{args:?} took {:?}",
            out.elapsed
        );
    }
}

/// A configuration listening on a free port (so a start that is wrongly
/// allowed would run, and time out) plus `extra`.
fn config_file(dir: &Path, extra: &str) -> PathBuf {
    let path = dir.join("collector.yaml");
    let yaml = format!(
        "receiver:\n  listen: 127.0.0.1:{}\nadmin:\n  listen: 127.0.0.1:0\n{extra}",
        free_port()
    );
    std::fs::write(&path, yaml).unwrap();
    path
}

/// A named pipe `name` made in `dir`.
fn fifo_in(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    let status = Command::new("mkfifo").arg(&path).status().unwrap();
    assert!(status.success(), "mkfifo {}", path.display());
    path
}

#[test]
fn files_that_are_not_regular_or_too_large_are_refused_at_once() {
    let work = tempfile::tempdir().unwrap();
    let dir = work.path();
    let fifo = fifo_in(dir, "fifo");
    let huge = write_file(dir, "huge.pem", vec![b'A'; 2 * 1024 * 1024]);
    let pem = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
    let cert = write_file(dir, "cert.pem", pem);
    let sub = dir.join("case");
    std::fs::create_dir(&sub).unwrap();
    for bad in [
        Path::new("/dev/zero"),
        Path::new("/dev/urandom"),
        fifo.as_path(),
        dir,
        huge.as_path(),
    ] {
        let bad = bad.display();
        let cert = cert.display();
        for (key, yaml) in [
            (
                "receiver.auth.token_file",
                format!("  auth:\n    token_file: {bad}\n"),
            ),
            (
                "receiver.tls.cert_file",
                format!("  tls:\n    cert_file: {bad}\n    key_file: {cert}\n"),
            ),
            (
                "receiver.tls.key_file",
                format!("  tls:\n    cert_file: {cert}\n    key_file: {bad}\n"),
            ),
            (
                "receiver.tls.client_ca_file",
                format!(
                    "  tls:\n    cert_file: {cert}\n    key_file: {cert}\n    client_ca_file: {bad}\n"
                ),
            ),
        ] {
            // Under `receiver:`, after its listen line.
            let path = sub.join("collector.yaml");
            let text = format!(
                "receiver:\n  listen: 127.0.0.1:{}\n{yaml}admin:\n  listen: 127.0.0.1:0\n",
                free_port()
            );
            std::fs::write(&path, text).unwrap();
            refused(&sub, &path, key);
        }
        for (key, yaml) in [
            (
                "exporters.otlp.header_files.authorization",
                format!(
                    "exporters:\n  otlp:\n    endpoint: http://127.0.0.1:4317\n    header_files:\n      authorization: {bad}\n"
                ),
            ),
            (
                "exporters.otlp.tls.ca_file",
                format!(
                    "exporters:\n  otlp:\n    endpoint: https://127.0.0.1:4317\n    tls:\n      ca_file: {bad}\n"
                ),
            ),
            (
                "exporters.otlp_metrics.tls.key_file",
                format!(
                    "exporters:\n  otlp_metrics:\n    endpoint: https://127.0.0.1:4317\n    tls:\n      cert_file: {cert}\n      key_file: {bad}\n"
                ),
            ),
        ] {
            let path = config_file(&sub, &yaml);
            refused(&sub, &path, key);
        }
        if bad.to_string() == huge.display().to_string() {
            continue;
        }
        // The configuration file itself.
        let out = collector(&sub, &["validate", "--config", &bad.to_string()], &[]);
        out.assert_refused_naming("validate", "`--config`");
        let out = collector(&sub, &["--config", &bad.to_string()], &[]);
        assert_eq!(out.output.status.code(), Some(64), "{}", out.describe());
    }
    // A configuration file over its 4 MiB limit.
    let big = dir.join("big.yaml");
    std::fs::write(
        &big,
        format!(
            "# {}
",
            "x".repeat(5 * 1024 * 1024)
        ),
    )
    .unwrap();
    refused(&sub, &big, "--config");
}

#[test]
fn a_parse_error_does_not_echo_a_huge_value() {
    let work = tempfile::tempdir().unwrap();
    let path = write_file(work.path(), "collector.yaml", "A".repeat(2 * 1024 * 1024));
    let out = collector(
        work.path(),
        &["validate", "--config", path.to_str().unwrap()],
        &[],
    );
    assert_eq!(out.output.status.code(), Some(64), "{}", out.describe());
    assert!(out.stderr().len() < 4096, "{} bytes", out.stderr().len());
}

#[test]
fn deep_yaml_nesting_is_refused_in_well_under_a_second() {
    let work = tempfile::tempdir().unwrap();
    let path = work.path().join("deep.yaml");
    std::fs::write(
        &path,
        format!("receiver:\n  listen: {}\n", "[".repeat(200_000)),
    )
    .unwrap();
    cargo_bin("hermes-collector", "hermes-collector");
    let start = Instant::now();
    refused(work.path(), &path, "line 2");
    // Two runs of the binary (validate and run).
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn what_the_start_would_refuse_validate_refuses_naming_the_key() {
    let work = tempfile::tempdir().unwrap();
    let dir = work.path();
    let fifo = fifo_in(dir, "spans.fifo");
    let port = free_port();
    let cases = [
        ("log.level", "log:\n  level: inof\n".to_owned()),
        (
            "exporters.file.path",
            format!("exporters:\n  file:\n    path: {}\n", dir.display()),
        ),
        (
            "exporters.file.path",
            format!(
                "exporters:\n  file:\n    path: {}/missing/spans.jsonl\n",
                dir.display()
            ),
        ),
        (
            "exporters.file.path",
            format!("exporters:\n  file:\n    path: {}\n", fifo.display()),
        ),
    ];
    for (key, extra) in cases {
        let path = config_file(dir, &extra);
        refused(dir, &path, key);
    }
    assert!(
        !dir.join("missing").exists(),
        "parent directories are never created"
    );
    // The admin server on the ingest's port, also through an unspecified
    // address.
    for admin in [format!("127.0.0.1:{port}"), format!("0.0.0.0:{port}")] {
        let path = dir.join("clash.yaml");
        std::fs::write(
            &path,
            format!("receiver:\n  listen: 127.0.0.1:{port}\nadmin:\n  listen: {admin}\n"),
        )
        .unwrap();
        refused(dir, &path, "admin.listen");
    }
}

#[test]
fn an_environment_value_never_reaches_the_output() {
    let work = tempfile::tempdir().unwrap();
    let secret = "s3cret-span-dir-4f9a";
    let data = work.path().join(secret);
    std::fs::create_dir(&data).unwrap();
    let config = config_file(
        work.path(),
        "exporters:\n  file:\n    path: ${SPAN_DIR}/spans.jsonl\n",
    );
    let value = data.display().to_string();

    // Refused (the directory is gone): the error names the variable.
    let missing = format!("{value}-gone");
    let out = collector(
        work.path(),
        &["validate", "--config", config.to_str().unwrap()],
        &[("SPAN_DIR", &missing)],
    );
    out.assert_refused_naming("span directory gone", "${SPAN_DIR}");
    assert!(!out.stderr().contains(secret), "{}", out.describe());

    // Running: the start-up lines show the reference, never the value.
    let mut cmd = Collector::command();
    cmd.current_dir(work.path())
        .arg("--config")
        .arg(&config)
        .env("SPAN_DIR", &value)
        .env("RUST_LOG", "debug");
    let mut run = Collector::launch(cmd);
    assert!(data.join("spans.jsonl").exists());
    run.terminate(Duration::from_secs(10));
    let (stdout, stderr) = (run.stdout_text(), run.stderr_text());
    assert!(
        stderr.contains("appended to ${SPAN_DIR}/spans.jsonl"),
        "the span file line shows the reference:\n{stderr}"
    );
    assert!(!stderr.contains(secret), "{stderr}");
    assert!(!stdout.contains(secret), "{stdout}");
}

#[test]
fn an_unwritable_span_file_is_counted_and_never_holds_the_drain() {
    let work = tempfile::tempdir().unwrap();
    let grace_ms = 15_000;
    let mut run = Collector::start_with_sections(
        work.path(),
        &format!("exporters:\n  file:\n    path: /dev/full\nshutdown:\n  grace_ms: {grace_ms}\n"),
    );
    let out = run_loadgen(
        &[
            "--endpoint",
            &run.endpoint,
            "--instances",
            "1",
            "--turns",
            "20",
            "--timeout-secs",
            "60",
        ],
        Duration::from_secs(90),
    );
    let summary = loadgen_summary(&out);
    assert!(summary["events_acked"].as_u64().unwrap() > 0, "{summary}");

    // Counted, and not ready while the file cannot be written.
    let failed = || {
        hermes_e2e::fault::metric_sum(
            &hermes_e2e::collector::admin_get(&run, "/metrics"),
            "hermes_collector_exporter_send_failed_spans_total",
        )
    };
    assert!(
        hermes_e2e::wait_until(HANG_GUARD, Duration::from_millis(100), || failed() > 0.0),
        "no failed spans counted:\n{}",
        run.stderr_text()
    );
    let ready = hermes_e2e::collector::admin_get(&run, "/readyz");
    assert!(
        ready.starts_with("HTTP/1.1 503") && ready.contains("span file"),
        "{ready}"
    );

    // The drain does not wait for the disk: far within the grace.
    let (status, took) = run.sigterm(Duration::from_millis(grace_ms + 5000));
    let log = run.stderr_text();
    assert!(status.is_some(), "did not stop:\n{log}");
    assert!(
        took < Duration::from_millis(grace_ms / 2),
        "took {took:?}:\n{log}"
    );
    let stopped = log
        .lines()
        .rev()
        .find(|l| l.contains("stopped"))
        .unwrap_or_else(|| panic!("no stopped line:\n{log}"));
    let spans_failed: u64 = stopped
        .split_whitespace()
        .find_map(|w| w.strip_prefix("spans_failed="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no spans_failed in {stopped}"));
    assert!(spans_failed > 0, "{stopped}");
    assert!(log.contains("No space left"), "the cause is logged:\n{log}");
}
