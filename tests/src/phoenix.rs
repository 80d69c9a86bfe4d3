//! A real Arize Phoenix server for the backend tests, and a small client of
//! its own REST API.
//!
//! `tests/setup_phoenix.sh` installs the pinned `arize-phoenix` from PyPI
//! into a venv of its own (`$HERMES_E2E_PHOENIX_VENV`, default
//! `<repo>/target/phoenix-venv`), idempotently under a `flock`;
//! [`ensure_phoenix`] runs it at most once per test process.
//!
//! [`PhoenixServer::start`] runs `phoenix serve` on 127.0.0.1 with free
//! ports, a temporary `PHOENIX_WORKING_DIR` (its SQLite database) and a
//! cleared environment, waits (bounded) until `/readyz` answers, and kills
//! it on drop. Phoenix never phones home here: its telemetry pixels
//! (`PHOENIX_TELEMETRY_ENABLED=false`) and every request it would make on
//! its own initiative (`PHOENIX_ALLOW_EXTERNAL_RESOURCES=false`: web fonts,
//! the sandbox download, the agent assistant) are off.
//!
//! The client asks what Phoenix stored, the way a user's tooling would:
//! `GET /v1/projects` and `GET /v1/projects/{name}/spans` (Phoenix'
//! decoded spans: kind, status, parent and the attributes as stored, after
//! its own GenAI → OpenInference conversion, flattened to dotted keys such
//! as `llm.input_messages.0.message.role`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;
use tempfile::TempDir;

use crate::process::ChildGuard;
use crate::venv::run_setup_script;
use crate::{env_secs, free_port, repo_root, wait_until};

/// The `arize-phoenix` release `setup_phoenix.sh` installs.
pub const PHOENIX_VERSION: &str = "20.26.1";

/// Bound on Phoenix' start (database migrations included; slow on a busy
/// machine); `$HERMES_E2E_PHOENIX_START_SECS` overrides.
const START_TIMEOUT: Duration = Duration::from_secs(240);
/// Bound on one HTTP request to Phoenix.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The venv path `setup_phoenix.sh` uses.
pub fn phoenix_venv_path() -> PathBuf {
    match std::env::var_os("HERMES_E2E_PHOENIX_VENV") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => repo_root().join("target").join("phoenix-venv"),
    }
}

/// Makes sure the Phoenix venv exists (running `setup_phoenix.sh` once per
/// process) and returns the path of its `phoenix` program. Panics, in every
/// caller, saying what to run, if the setup failed.
pub fn ensure_phoenix() -> PathBuf {
    static SETUP: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match SETUP.get_or_init(run_setup) {
        Ok(path) => path.clone(),
        Err(e) => panic!("{e}"),
    }
}

fn run_setup() -> Result<PathBuf, String> {
    let venv = phoenix_venv_path();
    run_setup_script(
        "setup_phoenix.sh",
        &[("HERMES_E2E_PHOENIX_VENV", venv.as_os_str())],
        &format!(
            "Run `bash tests/setup_phoenix.sh` (needs PyPI) to install \
             arize-phoenix=={PHOENIX_VERSION}"
        ),
    )?;
    let program = venv.join("bin").join("phoenix");
    if !program.is_file() {
        return Err(format!(
            "setup_phoenix.sh ran but {} is missing; run `bash tests/setup_phoenix.sh`",
            program.display()
        ));
    }
    Ok(program)
}

/// A running `phoenix serve`; killed (with its process group) on drop.
pub struct PhoenixServer {
    guard: ChildGuard,
    port: u16,
    _dir: TempDir,
}

impl PhoenixServer {
    /// Starts Phoenix on 127.0.0.1 (HTTP and gRPC on free ports) with a
    /// fresh working directory, and waits until it is ready. Panics with
    /// its log if it does not get ready in time.
    pub fn start() -> PhoenixServer {
        let program = ensure_phoenix();
        let dir = crate::temp_dir("phoenix-");
        let home = dir.path().join("home");
        let work = dir.path().join("work");
        for d in [&home, &work] {
            std::fs::create_dir_all(d).unwrap_or_else(|e| panic!("create {}: {e}", d.display()));
        }
        let port = free_port();
        let grpc_port = free_port();
        let mut cmd = Command::new(&program);
        cmd.arg("serve")
            .env_clear()
            .env(
                "PATH",
                std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into()),
            )
            .env("HOME", &home)
            .env("LANG", "C.UTF-8")
            .env("PHOENIX_HOST", "127.0.0.1")
            .env("PHOENIX_PORT", port.to_string())
            .env("PHOENIX_GRPC_PORT", grpc_port.to_string())
            .env("PHOENIX_WORKING_DIR", &work)
            .env("PHOENIX_TELEMETRY_ENABLED", "false")
            .env("PHOENIX_ALLOW_EXTERNAL_RESOURCES", "false")
            .env("DO_NOT_TRACK", "1")
            .env("PHOENIX_DB_LOGGING_LEVEL", "warning")
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(tmp) = std::env::var_os("TMPDIR") {
            cmd.env("TMPDIR", tmp);
        }
        let mut guard = ChildGuard::spawn_named("phoenix", &mut cmd)
            .unwrap_or_else(|e| panic!("spawn {}: {e}", program.display()));
        let timeout = env_secs("HERMES_E2E_PHOENIX_START_SECS", START_TIMEOUT);
        let mut exited = None;
        let ready = wait_until(timeout, Duration::from_millis(250), || {
            if let Some(status) = guard.try_wait() {
                exited = Some(status);
                return true;
            }
            matches!(get(port, "/readyz"), Ok((200, _)))
        });
        if !ready || exited.is_some() {
            panic!(
                "Phoenix did not get ready on 127.0.0.1:{port} within {timeout:?} (exit: {exited:?})\
                 \n--- stdout ---\n{}\n--- stderr ---\n{}",
                guard.stdout_text(),
                guard.stderr_text()
            );
        }
        PhoenixServer {
            guard,
            port,
            _dir: dir,
        }
    }

    /// `http://127.0.0.1:PORT`: the UI, the REST API and OTLP/HTTP
    /// (`/v1/traces`, which the collector appends).
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Phoenix' own output so far, for failure messages.
    pub fn log(&self) -> String {
        format!(
            "--- phoenix stdout ---\n{}\n--- phoenix stderr ---\n{}",
            self.guard.stdout_text(),
            self.guard.stderr_text()
        )
    }

    /// `GET path`, answered 200 with JSON; panics otherwise.
    pub fn get_json(&self, path: &str) -> Value {
        match get(self.port, path) {
            Ok((200, body)) => serde_json::from_str(&body)
                .unwrap_or_else(|e| panic!("GET {path}: not JSON ({e}): {body}")),
            Ok((status, body)) => panic!("GET {path}: {status}: {body}\n{}", self.log()),
            Err(e) => panic!("GET {path}: {e}\n{}", self.log()),
        }
    }

    /// The names of every project (`GET /v1/projects`, all pages).
    pub fn projects(&self) -> Vec<String> {
        let mut names = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut path = "/v1/projects?limit=100".to_string();
            if let Some(c) = &cursor {
                path.push_str(&format!("&cursor={}", percent_encode(c)));
            }
            let page = self.get_json(&path);
            names.extend(
                page["data"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|p| p["name"].as_str().map(String::from)),
            );
            match page["next_cursor"].as_str() {
                Some(c) if !c.is_empty() => cursor = Some(c.to_string()),
                _ => return names,
            }
        }
    }

    /// Every span Phoenix stored in `project` (`GET
    /// /v1/projects/{project}/spans`, all pages); empty when the project
    /// does not exist (yet).
    pub fn spans(&self, project: &str) -> Vec<PhoenixSpan> {
        let mut spans = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut path = format!("/v1/projects/{}/spans?limit=1000", percent_encode(project));
            if let Some(c) = &cursor {
                path.push_str(&format!("&cursor={}", percent_encode(c)));
            }
            let page = match get(self.port, &path) {
                Ok((200, body)) => serde_json::from_str::<Value>(&body)
                    .unwrap_or_else(|e| panic!("GET {path}: not JSON ({e}): {body}")),
                Ok((404, _)) => return spans,
                Ok((status, body)) => panic!("GET {path}: {status}: {body}\n{}", self.log()),
                Err(e) => panic!("GET {path}: {e}\n{}", self.log()),
            };
            spans.extend(
                page["data"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|s| PhoenixSpan(s.clone())),
            );
            match page["next_cursor"].as_str() {
                Some(c) if !c.is_empty() => cursor = Some(c.to_string()),
                _ => return spans,
            }
        }
    }

    /// Waits (bounded) until `project` holds at least `count` spans; returns
    /// them (whatever their number at the deadline).
    pub fn wait_for_spans(
        &self,
        project: &str,
        count: usize,
        timeout: Duration,
    ) -> Vec<PhoenixSpan> {
        let mut spans = Vec::new();
        wait_until(timeout, Duration::from_millis(250), || {
            spans = self.spans(project);
            spans.len() >= count
        });
        spans
    }
}

/// One span as Phoenix' REST API returns it.
#[derive(Debug, Clone)]
pub struct PhoenixSpan(pub Value);

impl PhoenixSpan {
    pub fn name(&self) -> &str {
        self.0["name"].as_str().unwrap_or("")
    }

    /// Lowercase hex span id.
    pub fn span_id(&self) -> &str {
        self.0["context"]["span_id"].as_str().unwrap_or("")
    }

    /// Lowercase hex trace id.
    pub fn trace_id(&self) -> &str {
        self.0["context"]["trace_id"].as_str().unwrap_or("")
    }

    /// The parent's span id, `None` for a root.
    pub fn parent_id(&self) -> Option<&str> {
        self.0["parent_id"].as_str().filter(|p| !p.is_empty())
    }

    /// Phoenix' span kind (`AGENT`, `LLM`, `TOOL`, `CHAIN`, `UNKNOWN`, …).
    pub fn kind(&self) -> &str {
        self.0["span_kind"].as_str().unwrap_or("")
    }

    /// `OK`, `ERROR` or `UNSET`.
    pub fn status_code(&self) -> &str {
        self.0["status_code"].as_str().unwrap_or("")
    }

    pub fn status_message(&self) -> &str {
        self.0["status_message"].as_str().unwrap_or("")
    }

    /// A stored attribute by its dotted key (`llm.token_count.prompt`).
    pub fn attr(&self, key: &str) -> Option<&Value> {
        self.0["attributes"].get(key)
    }

    pub fn str_attr(&self, key: &str) -> Option<&str> {
        self.attr(key).and_then(Value::as_str)
    }

    pub fn int_attr(&self, key: &str) -> Option<i64> {
        self.attr(key).and_then(|v| {
            v.as_i64()
                .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
        })
    }

    /// Every stored attribute key.
    pub fn attr_keys(&self) -> Vec<&str> {
        self.0["attributes"]
            .as_object()
            .map(|m| m.keys().map(String::as_str).collect())
            .unwrap_or_default()
    }

    /// The roles of Phoenix' parsed input messages
    /// (`llm.input_messages.N.message.role`), in order.
    pub fn input_roles(&self) -> Vec<String> {
        (0..)
            .map_while(|i| self.str_attr(&format!("llm.input_messages.{i}.message.role")))
            .map(String::from)
            .collect()
    }

    /// The text of parsed input message `i`: its `message.content`, else its
    /// `message.contents.N.message_content.text` parts joined.
    pub fn input_text(&self, i: usize) -> String {
        let base = format!("llm.input_messages.{i}.message");
        if let Some(text) = self.str_attr(&format!("{base}.content")) {
            return text.to_string();
        }
        (0..)
            .map_while(|j| self.str_attr(&format!("{base}.contents.{j}.message_content.text")))
            .collect::<Vec<_>>()
            .join("")
    }
}

/// Percent-encodes everything but unreserved characters (RFC 3986).
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `GET path` on 127.0.0.1:`port` over HTTP/1.1 (`Connection: close`):
/// the status and the body (chunked transfer decoded).
fn get(port: u16, path: &str) -> Result<(u16, String), String> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream =
        TcpStream::connect_timeout(&addr, REQUEST_TIMEOUT).map_err(|e| format!("connect: {e}"))?;
    let _ = stream.set_read_timeout(Some(REQUEST_TIMEOUT));
    let _ = stream.set_write_timeout(Some(REQUEST_TIMEOUT));
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: application/json\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| format!("write: {e}"))?;
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .map_err(|e| format!("read: {e}"))?;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| format!("no header end in {} bytes", raw.len()))?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let body = &raw[split + 4..];
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| format!("bad status line: {head}"))?;
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_vec()
    };
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

fn dechunk(mut body: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let line_end = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("chunk size line without CRLF")?;
        let size_text = String::from_utf8_lossy(&body[..line_end]);
        let size_text = size_text.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|e| format!("bad chunk size {size_text:?}: {e}"))?;
        body = &body[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        if body.len() < size {
            return Err("truncated chunk".into());
        }
        out.extend_from_slice(&body[..size]);
        body = body.get(size + 2..).unwrap_or(&[]);
    }
}
