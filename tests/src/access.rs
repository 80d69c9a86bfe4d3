//! What the access-control and hostile-input tests (`tests/security*.rs`,
//! `tests/hostile_*.rs`) share: a collector binary from a configuration
//! file exporting to an in-test OTLP receiver, in a working directory of
//! its own ([`exporting`]), the basic fixture's turn arriving whole, and the
//! installed shim replaying the basic fixture.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value as Json;
use tempfile::TempDir;

use crate::collector::{Collector, write_config};
use crate::ingest::fixture;
use crate::rig::WAIT;
use crate::{ChildGuard, OtlpReceiver, ensure_venv, free_port, run_with_timeout, venv_bin};

/// The span names the basic fixture (one turn, two chats, one tool call)
/// gives, sorted.
pub const BASIC_SPANS: [&str; 4] = [
    "chat fake-model-1",
    "chat fake-model-1",
    "execute_tool terminal",
    "invoke_agent hermes",
];

/// A working directory, a receiver, and the collector `start` starts with
/// them, as `(work, otlp, collector)`: bound in that order
/// (`let (_work, otlp, collector) = …`), they drop in reverse, the
/// collector first and its directory last.
pub fn exporting(
    start: impl FnOnce(&Path, &OtlpReceiver) -> Collector,
) -> (TempDir, OtlpReceiver, Collector) {
    let work = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let otlp = OtlpReceiver::start();
    let collector = start(work.path(), &otlp);
    (work, otlp, collector)
}

/// [`start_tcp_collector`] in a working directory of its own, exporting to
/// a receiver of its own ([`exporting`]).
pub fn tcp_collector(receiver: &str, env: &[(&str, &str)]) -> (TempDir, OtlpReceiver, Collector) {
    exporting(|work, otlp| start_tcp_collector(work, receiver, otlp, env))
}

/// A collector binary with `receiver` as its receiver section, exporting to
/// `otlp`; started and listening when this returns.
pub fn start_collector(
    work: &Path,
    receiver: &str,
    otlp: &OtlpReceiver,
    env: &[(&str, &str)],
) -> Collector {
    start_collector_with(
        work,
        &format!(
            "receiver:\n{receiver}\nexporters:\n  otlp:\n    endpoint: {}\nbatch:\n  timeout_ms: 50\n",
            otlp.endpoint()
        ),
        env,
    )
}

/// [`start_collector`] receiving on a free port of 127.0.0.1, `receiver`
/// holding the other lines of its receiver section.
pub fn start_tcp_collector(
    work: &Path,
    receiver: &str,
    otlp: &OtlpReceiver,
    env: &[(&str, &str)],
) -> Collector {
    let listen = format!("  listen: 127.0.0.1:{}\n{receiver}", free_port());
    start_collector(work, &listen, otlp, env)
}

/// A collector binary with the configuration `yaml`; started and ready
/// when this returns.
pub fn start_collector_with(work: &Path, yaml: &str, env: &[(&str, &str)]) -> Collector {
    let config = write_config(work, yaml);
    let mut cmd = Collector::command();
    cmd.arg("--config")
        .arg(&config)
        .args(["--admin-listen", "127.0.0.1:0"])
        .envs(env.iter().copied());
    Collector::launch(cmd)
}

/// Waits for the basic fixture's four spans and checks they form one whole
/// turn.
pub fn assert_basic_turn_arrives(otlp: &OtlpReceiver, collector: &ChildGuard) {
    assert!(
        otlp.store().wait_for_spans(BASIC_SPANS.len(), WAIT),
        "spans did not arrive:\n{}",
        collector.stderr_text()
    );
    // Nothing more trickles in.
    std::thread::sleep(Duration::from_millis(300));
    let mut names: Vec<String> = otlp.spans().into_iter().map(|(_, s)| s.name).collect();
    names.sort();
    assert_eq!(names, BASIC_SPANS, "{}", collector.stderr_text());
    let tree = otlp.store().tree();
    assert!(tree.orphans().is_empty(), "every span has its parent");
    assert!(tree.duplicates().is_empty());
}

/// Runs a Python snippet in the venv with the shim installed and registered
/// (`hooks` maps names to the shim's callbacks), replaying the basic fixture
/// through the hooks; prints `flush(flush_ms)` and `stats()` as JSON.
pub fn shim_replays_basic(env: &[(&str, &str)], flush_ms: u64) -> Json {
    ensure_venv();
    let code = format!(
        r#"
import json
import hermes_collector
hooks = {{}}
class Ctx:
    def register_hook(self, name, callback):
        hooks[name] = callback
hermes_collector.register(Ctx())
for line in open({fixture:?}):
    if not line.strip():
        continue
    r = json.loads(line)
    if r["hook"] in hooks:
        hooks[r["hook"]](**r["kwargs"])
flushed = hermes_collector.flush({flush_ms})
print(json.dumps({{"flushed": flushed, "stats": hermes_collector.stats()}}))
"#,
        fixture = fixture("basic").display().to_string(),
    );
    let mut cmd = Command::new(venv_bin("python"));
    cmd.arg("-c")
        .arg(code)
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("HERMES_COLLECTOR_TOKEN")
        .env_remove("HERMES_COLLECTOR_TOKEN_FILE")
        .env("HERMES_COLLECTOR_EXIT_FLUSH_MS", "0");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = run_with_timeout(&mut cmd, Duration::from_secs(90));
    assert!(out.success(), "python failed:\n{}", out.describe());
    let line = out
        .stdout()
        .lines()
        .last()
        .map(str::to_owned)
        .unwrap_or_default();
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {}", out.describe()))
}
