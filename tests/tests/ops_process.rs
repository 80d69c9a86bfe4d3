//! Operating the collector process: its health probes through start, run
//! and drain, the configuration schema it prints, transparent huge pages,
//! and the startup log. The derived metrics are in `ops.rs`.
//!
//! Probe behaviour (what `probes_follow_start_run_and_drain` checks):
//!
//! | phase | `/livez` | `/readyz` |
//! |---|---|---|
//! | starting, before the admin listener is bound | connection refused | connection refused |
//! | admin bound, ingest or exporter not up yet (a moment) | `200` | `503 not ready: …` |
//! | running | `200` | `200 ready` |
//! | draining (from SIGTERM/SIGINT until the exporters are done or `shutdown.grace_ms` passed) | `200` | `503 not ready: draining` |
//! | exited (the admin server stops last) | connection refused | connection refused |
//!
//! `/readyz` never goes back to `200` once the drain started, and `/livez`
//! never answers anything but `200`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hermes_e2e::collector::{Collector, write_config};
use hermes_e2e::ingest::fixture;
use hermes_e2e::{cargo_bin, free_port, repo_root, run_with_timeout};

/// One probe's outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    Refused,
    Status(u16),
    /// Connected but no complete answer (e.g. the server closing).
    Broken,
}

#[derive(Clone, Copy, Debug)]
struct Probe {
    at: Instant,
    path: &'static str,
    answer: Answer,
}

/// The first and last of `probes` (one path's) answered 200; asserts that
/// every probe between them was answered 200 and none after (the server
/// was up once, without flapping). `all` describes every probe.
fn up_window(probes: &[Probe], all: &str) -> (usize, usize) {
    let path = probes.first().map_or("?", |p| p.path);
    let up = |p: &Probe| p.answer == Answer::Status(200);
    let first = probes
        .iter()
        .position(up)
        .unwrap_or_else(|| panic!("{path} never answered 200:\n{all}"));
    let last = probes.iter().rposition(up).unwrap_or(first);
    assert!(
        probes[first..=last].iter().all(up),
        "{path} answered something else than 200 while up:\n{all}"
    );
    assert!(
        !probes[last + 1..].iter().any(up),
        "{path} returned to 200 after it stopped:\n{all}"
    );
    (first, last)
}

fn probe(addr: SocketAddr, path: &'static str) -> Probe {
    let answer = match TcpStream::connect_timeout(&addr, Duration::from_millis(500)) {
        Err(_) => Answer::Refused,
        Ok(mut stream) => {
            let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
            let _ = stream.set_write_timeout(Some(Duration::from_secs(2)));
            let mut response = String::new();
            let sent = write!(
                stream,
                "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
            );
            match sent.and_then(|()| stream.read_to_string(&mut response)) {
                Ok(_) => response
                    .split(' ')
                    .nth(1)
                    .and_then(|s| s.parse().ok())
                    .map_or(Answer::Broken, Answer::Status),
                Err(_) => Answer::Broken,
            }
        }
    };
    Probe {
        at: Instant::now(),
        path,
        answer,
    }
}

#[test]
fn probes_follow_start_run_and_drain() {
    let collector_bin = cargo_bin("hermes-collector", "hermes-collector");
    let loadgen_bin = cargo_bin("hermes-loadgen", "hermes-loadgen");
    let work = tempfile::tempdir().unwrap();
    let ingest = free_port();
    let admin: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    // Nothing listens there: the spans stay in the exporter's retries, so
    // the drain lasts the whole grace period.
    let nowhere = free_port();
    let grace_ms = 3000;
    let config = write_config(
        work.path(),
        &format!(
            "receiver:\n  listen: 127.0.0.1:{ingest}\nadmin:\n  listen: {admin}\nexporters:\n  otlp:\n    endpoint: http://127.0.0.1:{nowhere}\n    timeout_ms: 500\nshutdown:\n  grace_ms: {grace_ms}\n"
        ),
    );

    // Probe both paths every 20 ms from before the start until after the exit.
    let stop = Arc::new(AtomicBool::new(false));
    let poller = std::thread::spawn({
        let stop = stop.clone();
        move || {
            let mut probes = Vec::new();
            let started = Instant::now();
            while !stop.load(Ordering::Relaxed) && started.elapsed() < Duration::from_secs(120) {
                probes.push(probe(admin, "/livez"));
                probes.push(probe(admin, "/readyz"));
                std::thread::sleep(Duration::from_millis(20));
            }
            probes
        }
    });
    std::thread::sleep(Duration::from_millis(100));
    let mut cmd = Command::new(&collector_bin);
    cmd.arg("--config").arg(&config);
    let mut collector = Collector::launch(cmd);

    // Running: a turn whose spans cannot be delivered.
    let out = run_with_timeout(
        Command::new(&loadgen_bin).args([
            "--endpoint",
            &format!("http://127.0.0.1:{ingest}"),
            "--fixture",
            fixture("basic").to_str().unwrap(),
            "--instances",
            "1",
            "--turns",
            "1",
            "--timeout-secs",
            "30",
        ]),
        Duration::from_secs(60),
    );
    assert!(out.success(), "{}", out.describe());
    std::thread::sleep(Duration::from_millis(300));

    let signalled = Instant::now();
    let (status, drain) = collector.sigterm(Duration::from_millis(grace_ms + 10_000));
    let exited = signalled + drain;
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let probes = poller.join().unwrap();
    let log = collector.stderr_text();
    // The turn's spans never reached a backend: the exit code says so.
    assert!(
        status.is_some_and(|s| s.code() == Some(75)),
        "no exit 75 for the spans lost in the drain: {status:?}\n{log}"
    );
    assert!(
        drain >= Duration::from_millis(grace_ms / 2)
            && drain <= Duration::from_millis(grace_ms + 3000),
        "the drain took {drain:?}, the grace period is {grace_ms} ms\n{log}"
    );

    let describe = |probes: &[Probe]| -> String {
        probes
            .iter()
            .map(|p| {
                let at = if p.at >= signalled {
                    format!("+{:?}", p.at - signalled)
                } else {
                    format!("-{:?}", signalled - p.at)
                };
                format!("{at} {} {:?}\n", p.path, p.answer)
            })
            .collect()
    };
    let all = describe(&probes);
    let (livez, readyz): (Vec<Probe>, Vec<Probe>) = probes.iter().partition(|p| p.path == "/livez");

    // /livez: refused before the start, then 200 until the admin server
    // stops at the very end, then refused.
    assert!(
        livez.iter().all(|p| p.answer != Answer::Status(503)),
        "{all}"
    );
    let (first_live, last_live) = up_window(&livez, &all);
    assert!(
        livez[..first_live]
            .iter()
            .all(|p| p.answer == Answer::Refused),
        "{all}"
    );
    assert!(
        livez[last_live].at > signalled + Duration::from_millis(grace_ms / 2),
        "/livez stopped answering early in the drain:\n{all}"
    );
    assert!(
        livez.last().unwrap().answer == Answer::Refused,
        "the admin port is closed after the exit:\n{all}"
    );

    // /readyz: refused, maybe 503 for a moment, then 200 until the signal,
    // then 503 through the drain, then refused.
    let (first_ready, last_ready) = up_window(&readyz, &all);
    assert!(
        readyz[..first_ready]
            .iter()
            .all(|p| matches!(p.answer, Answer::Refused | Answer::Status(503))),
        "{all}"
    );
    assert!(
        readyz[last_ready].at < signalled + Duration::from_millis(200),
        "/readyz was still 200 after SIGTERM:\n{all}"
    );
    let draining: Vec<&Probe> = readyz
        .iter()
        .filter(|p| p.at > signalled + Duration::from_millis(200) && p.at < exited)
        .collect();
    assert!(
        draining.len() >= 10,
        "too few probes during the drain:\n{all}"
    );
    assert!(
        draining.iter().all(|p| matches!(
            p.answer,
            Answer::Status(503) | Answer::Refused | Answer::Broken
        )),
        "/readyz must be 503 while draining:\n{all}"
    );
    let answered_503 = draining
        .iter()
        .filter(|p| p.answer == Answer::Status(503))
        .count();
    assert!(
        answered_503 * 10 >= draining.len() * 8,
        "/readyz answered 503 for most of the drain:\n{all}"
    );
    assert!(log.contains("shutting down: draining"), "{log}");
    let count =
        |probes: &[Probe], answer: Answer| probes.iter().filter(|p| p.answer == answer).count();
    eprintln!(
        "drain {drain:?}; /readyz: {} refused, {} x 503, {} x 200 ({} x 503 while draining); /livez: {} x 200",
        count(&readyz, Answer::Refused),
        count(&readyz, Answer::Status(503)),
        count(&readyz, Answer::Status(200)),
        answered_503,
        count(&livez, Answer::Status(200)),
    );
}

#[test]
fn schema_subcommand_prints_the_checked_in_schema() {
    let out = run_with_timeout(
        Command::new(cargo_bin("hermes-collector", "hermes-collector")).arg("schema"),
        Duration::from_secs(30),
    );
    assert!(out.success(), "{}", out.describe());
    let checked_in =
        std::fs::read_to_string(repo_root().join("config/collector.schema.json")).unwrap();
    assert!(
        out.stdout() == checked_in,
        "config/collector.schema.json is out of date; regenerate it with\n\n    cargo run -p hermes-collector -- schema > config/collector.schema.json\n"
    );
    let schema: serde_json::Value = serde_json::from_str(&checked_in).unwrap();
    assert_eq!(
        schema["$schema"],
        "https://json-schema.org/draft/2020-12/schema"
    );
    assert!(
        schema["$defs"]["ExportersConfig"]["properties"]["otlp_metrics"].is_object(),
        "{schema}"
    );
}

/// `THP_enabled` of a running collector started with `env` (from
/// `/proc/PID/status`), or `None` on a kernel that does not report it.
fn collector_thp_enabled(env: &[(&str, &str)]) -> Option<String> {
    let dir = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let collector = Collector::start_with_env(dir.path(), &listen, &[], env);
    let status =
        std::fs::read_to_string(format!("/proc/{}/status", collector.guard.pid())).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("THP_enabled:"))
        .map(|v| v.trim().to_string())
}

#[test]
fn the_collector_runs_without_transparent_huge_pages_unless_told_otherwise() {
    let Some(default) = collector_thp_enabled(&[]) else {
        eprintln!("skipped: this kernel does not report THP_enabled");
        return;
    };
    assert_eq!(default, "0", "transparent huge pages are on by default");
    // A parent that turned them off passes that on to its children: then
    // there is nothing for the collector to keep.
    let ours = std::fs::read_to_string("/proc/self/status").unwrap();
    if ours
        .lines()
        .any(|l| l.starts_with("THP_enabled:") && l.ends_with('0'))
    {
        eprintln!("skipped the override: this test runs with transparent huge pages off");
        return;
    }
    let allowed = collector_thp_enabled(&[("MIMALLOC_ALLOW_THP", "1")]);
    assert_eq!(
        allowed.as_deref(),
        Some("1"),
        "MIMALLOC_ALLOW_THP=1 is not honoured"
    );
}

/// The startup log says where spans and metrics go (protocol, URL, file)
/// and never the credentials an endpoint carries.
#[test]
fn the_startup_log_names_each_destination_without_credentials() {
    let work = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let (traces, metrics) = (free_port(), free_port());
    let spans = work.path().join("spans.jsonl");
    let yaml = format!(
        "receiver:\n  listen: {listen}\nadmin:\n  listen: 127.0.0.1:0\n\
         exporters:\n  otlp:\n    protocol: http/protobuf\n    endpoint: http://agent:s3cret-userinfo@127.0.0.1:{traces}/otlp\n\
         \x20 otlp_metrics:\n    endpoint: http://m:s3cret-metrics@127.0.0.1:{metrics}\n\
         \x20 file:\n    path: {}\n",
        spans.display()
    );
    let collector = Collector::start_with_config(work.path(), &listen, &yaml);
    let log = collector.guard.stderr_text();
    for expected in [
        format!("OTLP/HTTP protobuf POST http://***@127.0.0.1:{traces}/otlp/v1/traces"),
        format!("OTLP JSON lines appended to {}", spans.display()),
        format!("http://***@127.0.0.1:{metrics}"),
    ] {
        assert!(log.contains(&expected), "no {expected:?} in:\n{log}");
    }
    assert!(!log.contains("s3cret"), "a credential in the log:\n{log}");
}
