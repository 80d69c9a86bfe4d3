//! A scripted OpenAI-compatible server for Hermes to talk to.
//!
//! [`FakeOpenAi::start`] runs `tests/fake_openai.py` with the venv's Python
//! on 127.0.0.1 (port chosen by the OS) and a JSON script of answers; see the
//! script's module doc for the format:
//!
//! ```json
//! [{"tool_calls": [{"name": "terminal", "arguments": {"command": "echo hi"}}],
//!   "usage": {"prompt_tokens": 120, "completion_tokens": 10}},
//!  {"content": "final text", "usage": {"cached_tokens": 100}},
//!  {"error": 500}]
//! ```
//!
//! Tool call ids are `call_1`, `call_2`, … in the order the server emits
//! them. Auxiliary requests (session titles, compression, smart approval,
//! background review) are answered with a fixed text and do not consume
//! script entries. Every request is logged; [`FakeOpenAi::main_requests`]
//! returns the bodies of the main-conversation ones.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use tempfile::TempDir;

use crate::process::ChildGuard;
use crate::venv::venv_python;
use crate::{tests_dir, wait_until};

/// The model name the server reports when the script names none.
pub const DEFAULT_MODEL: &str = "fake-model";

const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A running `fake_openai.py`; killed on drop.
pub struct FakeOpenAi {
    child: ChildGuard,
    port: u16,
    model: String,
    log_path: PathBuf,
    _dir: TempDir,
}

impl FakeOpenAi {
    /// Starts the server with `script`: a list of entries, or an object
    /// `{"model": …, "responses": [...], "aux_content": …}`.
    pub fn start(script: Value) -> FakeOpenAi {
        FakeOpenAi::start_with(&venv_python(), script)
    }

    /// As [`start`](Self::start), run by `python` (any Python 3.11+: the
    /// server needs only the standard library).
    pub fn start_with(python: &Path, script: Value) -> FakeOpenAi {
        let model = script
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or(DEFAULT_MODEL)
            .to_string();
        let dir = crate::temp_dir("fake-openai-");
        let script_path = dir.path().join("script.json");
        let log_path = dir.path().join("requests.jsonl");
        std::fs::write(&script_path, script.to_string())
            .unwrap_or_else(|e| panic!("write {}: {e}", script_path.display()));

        let mut cmd = Command::new(python);
        cmd.arg(tests_dir().join("fake_openai.py"))
            .arg(&script_path)
            .arg("--log")
            .arg(&log_path)
            .arg("--model")
            .arg(&model)
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env("PYTHONUNBUFFERED", "1")
            // Kept open by the guard: the server exits on EOF, so it cannot
            // outlive this process even if drop never runs.
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = ChildGuard::spawn_named("fake_openai", &mut cmd)
            .unwrap_or_else(|e| panic!("spawn fake_openai.py: {e}"));
        if !child.wait_for_stdout(START_TIMEOUT, |out| out.contains('\n')) {
            panic!(
                "fake_openai.py printed no port within {START_TIMEOUT:?}\nstdout: {}\nstderr: {}",
                child.stdout_text(),
                child.stderr_text()
            );
        }
        let first = child.stdout_text();
        let port = first
            .lines()
            .next()
            .and_then(|line| line.strip_prefix("PORT "))
            .and_then(|p| p.trim().parse::<u16>().ok())
            .unwrap_or_else(|| panic!("fake_openai.py: unexpected first line {first:?}"));
        FakeOpenAi {
            child,
            port,
            model,
            log_path,
            _dir: dir,
        }
    }

    /// The port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:PORT/v1`, the value for Hermes' `model.base_url`.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    /// The model name the server reports.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// The JSON-lines request log.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// Every request received so far, in order, as log records:
    /// `{"seq", "time", "method", "path", "kind": "main"|"aux"|"other",
    /// "script_index", "status", "stream", "body"}`.
    pub fn requests(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Bodies of the requests of one `kind` (`"main"`, `"aux"`, `"other"`).
    pub fn bodies(&self, kind: &str) -> Vec<Value> {
        self.requests()
            .into_iter()
            .filter(|r| r.get("kind").and_then(Value::as_str) == Some(kind))
            .map(|mut r| r.get_mut("body").map(Value::take).unwrap_or(Value::Null))
            .collect()
    }

    /// Bodies of the main-conversation chat completion requests (the ones
    /// that consumed script entries), in order.
    pub fn main_requests(&self) -> Vec<Value> {
        self.bodies("main")
    }

    /// Bodies of the auxiliary chat completion requests (titles, …).
    pub fn aux_requests(&self) -> Vec<Value> {
        self.bodies("aux")
    }

    /// Waits at most `timeout` until at least `n` main-conversation requests
    /// arrived; returns whether they did.
    pub fn wait_for_main_requests(&self, n: usize, timeout: Duration) -> bool {
        wait_until(timeout, Duration::from_millis(50), || {
            self.main_requests().len() >= n
        })
    }

    /// What the server wrote to stderr (tracebacks, `FAKE_OPENAI_VERBOSE=1` logs).
    pub fn stderr(&self) -> String {
        self.child.stderr_text()
    }

    /// A summary of the requests for assertion messages: one line each.
    pub fn describe_requests(&self) -> String {
        self.requests()
            .iter()
            .map(|r| {
                let body = r.get("body").unwrap_or(&Value::Null);
                let roles: Vec<&str> = body
                    .get("messages")
                    .and_then(Value::as_array)
                    .map(|m| {
                        m.iter()
                            .filter_map(|m| m.get("role").and_then(Value::as_str))
                            .collect()
                    })
                    .unwrap_or_default();
                format!(
                    "#{} {} {} kind={} entry={} status={} roles={:?}",
                    r.get("seq").unwrap_or(&Value::Null),
                    r.get("method").and_then(Value::as_str).unwrap_or("?"),
                    r.get("path").and_then(Value::as_str).unwrap_or("?"),
                    r.get("kind").and_then(Value::as_str).unwrap_or("?"),
                    r.get("script_index").unwrap_or(&Value::Null),
                    r.get("status").unwrap_or(&Value::Null),
                    roles
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The messages of a chat completion request body.
pub fn messages(body: &Value) -> Vec<Value> {
    body.get("messages")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

/// The `tool` role messages of a request body.
pub fn tool_messages(body: &Value) -> Vec<Value> {
    messages(body)
        .into_iter()
        .filter(|m| m.get("role").and_then(Value::as_str) == Some("tool"))
        .collect()
}

/// The names of the tools offered in a request body.
pub fn tool_names(body: &Value) -> Vec<String> {
    body.get("tools")
        .and_then(Value::as_array)
        .map(|tools| {
            tools
                .iter()
                .filter_map(|t| {
                    t.pointer("/function/name")
                        .and_then(Value::as_str)
                        .map(String::from)
                })
                .collect()
        })
        .unwrap_or_default()
}
