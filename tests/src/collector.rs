//! The `hermes-collector` binary as a test process: started on a free port
//! with piped output (no fixed admin port, so tests run in parallel), up once
//! it logs that it receives events.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::{ChildGuard, cargo_bin, free_port};

/// How long the collector may take to start.
const START: Duration = Duration::from_secs(30);

/// A running collector; killed on drop.
pub struct Collector {
    pub guard: ChildGuard,
    /// Its ingest, for `HERMES_COLLECTOR_ENDPOINT`.
    pub endpoint: String,
}

impl Collector {
    /// Starts the collector in `cwd` with `args` (after `--listen` and
    /// `--admin-listen 127.0.0.1:0`).
    pub fn start(cwd: &Path, args: &[&str]) -> Collector {
        let listen = format!("127.0.0.1:{}", free_port());
        let mut cmd = Command::new(cargo_bin("hermes-collector", "hermes-collector"));
        cmd.current_dir(cwd)
            .arg("--listen")
            .arg(&listen)
            .args(["--admin-listen", "127.0.0.1:0"])
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut guard = ChildGuard::spawn_named("hermes-collector", &mut cmd)
            .unwrap_or_else(|e| panic!("spawn collector: {e}"));
        let up = guard.wait_for_stderr(START, |e| e.contains("receiving Hermes events"));
        assert!(up, "collector did not start:\n{}", guard.stderr_text());
        Collector {
            guard,
            endpoint: format!("http://{listen}"),
        }
    }

    /// `GET path` on the admin server (address from the collector's log).
    pub fn admin_get(&self, path: &str) -> String {
        admin_get(&self.guard, path)
    }
}

/// `GET path` on the admin server of a collector process (address from its
/// log line `serving /livez ... listen=`).
pub fn admin_get(collector: &ChildGuard, path: &str) -> String {
    use std::io::{Read, Write};
    let log = collector.stderr_text();
    let addr = log
        .lines()
        .find(|l| l.contains("serving /livez"))
        .and_then(|l| l.split("listen=").nth(1))
        .map(|a| a.trim().to_string())
        .unwrap_or_else(|| panic!("no admin address in the log:\n{log}"));
    let mut stream =
        std::net::TcpStream::connect(&addr).unwrap_or_else(|e| panic!("connect admin: {e}"));
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap_or_else(|e| panic!("admin request: {e}"));
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .unwrap_or_else(|e| panic!("admin response: {e}"));
    response
}
