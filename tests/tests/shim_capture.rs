//! The installed shim (the real wheel in the venv), called the way Hermes
//! calls it, streaming to an in-test ingest server built from the
//! collector's own receiver: what an event records is the value at hook
//! time, hooks from many threads all arrive, and a full queue drops (counted)
//! instead of blocking.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::process::Command;
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hermes_e2e::{ensure_venv, run_with_timeout, venv_bin};
use hermes_proto::v1::{Event, EventBatch};
use hermes_receiver::{Ingest, Limits, ReceiverStats};
use tokio_util::sync::CancellationToken;

/// An in-process `EventIngest` server recording every batch.
struct IngestServer {
    addr: SocketAddr,
    batches: Arc<Mutex<Vec<EventBatch>>>,
    stop: CancellationToken,
}

impl IngestServer {
    fn start() -> IngestServer {
        let batches = Arc::new(Mutex::new(Vec::new()));
        let stop = CancellationToken::new();
        let (addr_tx, addr_rx) = std_mpsc::channel();
        let (store, token) = (batches.clone(), stop.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .expect("bind");
                addr_tx
                    .send(listener.local_addr().expect("addr"))
                    .expect("send addr");
                let (tx, mut rx) = tokio::sync::mpsc::channel(64);
                let ingest = Ingest::new(
                    tx,
                    Limits::default(),
                    Arc::new(ReceiverStats::default()),
                    token.clone(),
                );
                tokio::spawn(async move {
                    while let Some(received) = rx.recv().await {
                        store
                            .lock()
                            .expect("store")
                            .push(received.batch.to_batch().expect("decodes"));
                    }
                });
                let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
                let _ = tonic::transport::Server::builder()
                    .serve_with_incoming_shutdown(
                        ingest.into_server(),
                        incoming,
                        token.cancelled_owned(),
                    )
                    .await;
            });
        });
        let addr = addr_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("server address");
        IngestServer {
            addr,
            batches,
            stop,
        }
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The hooks' events (the shim's own process-exit marker left out).
    fn events(&self) -> Vec<Event> {
        self.batches
            .lock()
            .expect("store")
            .iter()
            .flat_map(|b| b.events.clone())
            .filter(|e| e.hook != hermes_proto::hooks::PROCESS_EXIT)
            .collect()
    }
}

impl Drop for IngestServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Registers the plugin with a stand-in for Hermes' plugin context (which
/// only calls `register_hook`), then runs `body`.
const PRELUDE: &str = r#"
import json, sys, threading
import hermes_collector
hooks = {}
class Ctx:
    def register_hook(self, name, callback):
        hooks[name] = callback
hermes_collector.register(Ctx())
V = "hermes.observer.v1"
"#;

/// Runs a Python snippet in the venv with the shim installed.
fn python(code: &str, env: &[(&str, &str)]) -> String {
    ensure_venv();
    let mut cmd = Command::new(venv_bin("python"));
    cmd.arg("-c")
        .arg(format!("{PRELUDE}\n{code}"))
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = run_with_timeout(&mut cmd, Duration::from_secs(60));
    assert!(out.success(), "python failed:\n{}", out.describe());
    out.stdout()
}

#[test]
fn values_are_captured_at_hook_time() {
    let server = IngestServer::start();
    let code = r#"
args = {"command": "echo one", "nested": {"k": [1]}}
history = [{"role": "user", "content": "hi"}]
hooks["pre_llm_call"](session_id="s", task_id="t", turn_id="s:t:1", user_message="hi",
    conversation_history=history, is_first_turn=True, model="m", platform="cli", sender_id="",
    telemetry_schema_version=V)
hooks["pre_tool_call"](tool_name="terminal", args=args, task_id="t", session_id="s",
    tool_call_id="c1", turn_id="s:t:1", api_request_id="s:t:1:api:1", middleware_trace=[],
    telemetry_schema_version=V)
# Hermes keeps using these objects after the hooks return.
args["command"] = "MUTATED-AFTER-HOOK"
args["nested"]["k"].append(2)
history.append({"role": "assistant", "content": "MUTATED-AFTER-HOOK"})
print(json.dumps({"flushed": hermes_collector.flush(10000), "stats": hermes_collector.stats()}))
"#;
    let out = python(
        code,
        &[
            ("HERMES_COLLECTOR_ENDPOINT", &server.endpoint()),
            ("HERMES_COLLECTOR_CAPTURE", "content"),
        ],
    );
    assert!(out.contains("\"flushed\": true"), "{out}");
    let events = server.events();
    assert_eq!(events.len(), 2, "{events:?}");
    let tool = events
        .iter()
        .find(|e| e.hook == "pre_tool_call")
        .expect("pre_tool_call");
    let args: serde_json::Value = serde_json::from_str(
        tool.content
            .get("args")
            .expect("args captured at level content"),
    )
    .expect("args JSON");
    assert_eq!(
        args,
        serde_json::json!({"command": "echo one", "nested": {"k": [1]}})
    );
    assert_eq!(
        tool.ids.as_ref().map(|i| i.tool_call_id.as_str()),
        Some("c1")
    );
    let all = format!("{events:?}");
    assert!(
        !all.contains("MUTATED-AFTER-HOOK"),
        "a later mutation reached the collector: {all}"
    );
    let llm = events
        .iter()
        .find(|e| e.hook == "pre_llm_call")
        .expect("pre_llm_call");
    assert!(
        !llm.content.contains_key("conversation_history"),
        "live history is never captured"
    );
    assert_eq!(llm.schema_version, "hermes.observer.v1");
    assert!(llm.time_unix_nano > 0 && llm.mono_nano > 0);
    assert_eq!(llm.thread, "MainThread");
    assert!(tool.seq > llm.seq);
}

/// The callback keeps the kwargs dict CPython builds for each call; a dict
/// its caller keeps (a C caller's `PyObject_Call(cb, args, d)`, here through
/// ctypes) is copied, so changing it after the call changes nothing.
#[test]
fn a_kwargs_dict_the_caller_keeps_is_copied() {
    let server = IngestServer::start();
    let code = r#"
import ctypes
call = ctypes.pythonapi.PyObject_Call
call.restype = ctypes.py_object
call.argtypes = [ctypes.py_object, ctypes.py_object, ctypes.py_object]
cb = hooks["pre_tool_call"]
print("name:", cb.__name__)
kept = dict(tool_name="kept", args={}, task_id="t", session_id="s", tool_call_id="c-kept",
    turn_id="s:t:1", api_request_id="s:t:1:api:1", middleware_trace=[], telemetry_schema_version=V)
assert call(cb, (), kept) is None
kept["tool_name"] = "MUTATED-AFTER-HOOK"
kept["tool_call_id"] = "MUTATED-AFTER-HOOK"
spread = dict(kept, tool_name="spread", tool_call_id="c-spread")
assert cb(**spread) is None
spread["tool_name"] = "MUTATED-AFTER-HOOK"
print(json.dumps({"flushed": hermes_collector.flush(10000)}))
"#;
    let out = python(code, &[("HERMES_COLLECTOR_ENDPOINT", &server.endpoint())]);
    assert!(out.contains("\"flushed\": true"), "{out}");
    assert!(
        out.contains("name: hermes_collector.pre_tool_call"),
        "{out}"
    );
    let events = server.events();
    let tools: Vec<(String, String)> = events
        .iter()
        .map(|e| {
            let name = match &e.body {
                Some(hermes_proto::v1::event::Body::Tool(t)) => t.tool_name.clone(),
                other => panic!("not a tool body: {other:?}"),
            };
            let id = e
                .ids
                .as_ref()
                .map(|i| i.tool_call_id.clone())
                .unwrap_or_default();
            (name, id)
        })
        .collect();
    assert_eq!(
        tools,
        [
            ("kept".to_owned(), "c-kept".to_owned()),
            ("spread".to_owned(), "c-spread".to_owned())
        ]
    );
}

#[test]
fn metadata_level_sends_no_content() {
    let server = IngestServer::start();
    let code = r#"
hooks["pre_tool_call"](tool_name="terminal", args={"command": "cat /secret"}, task_id="t",
    session_id="s", tool_call_id="c1", turn_id="s:t:1", api_request_id="s:t:1:api:1",
    middleware_trace=[], telemetry_schema_version=V)
hooks["post_tool_call"](tool_name="terminal", args={"command": "cat /secret"}, result="TOP-SECRET",
    task_id="t", session_id="s", tool_call_id="c1", turn_id="s:t:1", api_request_id="s:t:1:api:1",
    duration_ms=3, status="ok", error_type=None, error_message=None, middleware_trace=[],
    telemetry_schema_version=V)
print(sorted(hooks))
hermes_collector.flush(10000)
"#;
    let out = python(code, &[("HERMES_COLLECTOR_ENDPOINT", &server.endpoint())]);
    assert!(
        !out.contains("transform_"),
        "transform hooks are never registered: {out}"
    );
    assert!(
        out.contains("pre_api_request"),
        "metadata level registers pre_api_request: {out}"
    );
    let events = server.events();
    assert_eq!(events.len(), 2);
    let all = format!("{events:?}");
    assert!(
        !all.contains("/secret") && !all.contains("TOP-SECRET"),
        "{all}"
    );
    assert!(events.iter().all(|e| e.content.is_empty()));
}

#[test]
fn lean_level_does_not_register_pre_api_request() {
    let out = python(
        "print(sorted(hooks))",
        &[
            ("HERMES_COLLECTOR_CAPTURE", "lean"),
            ("HERMES_COLLECTOR_ENDPOINT", "http://127.0.0.1:9"),
        ],
    );
    assert!(
        !out.contains("pre_api_request") && out.contains("post_api_request"),
        "{out}"
    );
}

#[test]
fn hooks_from_many_threads_all_arrive() {
    let server = IngestServer::start();
    let code = r#"
def worker(n):
    for i in range(250):
        hooks["post_tool_call"](tool_name="read_file", args={}, result="", task_id="t", session_id="s",
            tool_call_id=f"c{n}-{i}", turn_id="s:t:1", api_request_id="s:t:1:api:1", duration_ms=1,
            status="ok", error_type=None, error_message=None, telemetry_schema_version=V)
threads = [threading.Thread(target=worker, args=(n,), name=f"ThreadPoolExecutor-0_{n}") for n in range(8)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps({"flushed": hermes_collector.flush(20000), "stats": hermes_collector.stats()}))
"#;
    let out = python(code, &[("HERMES_COLLECTOR_ENDPOINT", &server.endpoint())]);
    assert!(out.contains("\"flushed\": true"), "{out}");
    let events = server.events();
    assert_eq!(events.len(), 2000, "{out}");
    let mut seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "arrive in seq order");
    seqs.dedup();
    assert_eq!(seqs.len(), 2000, "unique seqs");
    let calls: std::collections::HashSet<String> = events
        .iter()
        .filter_map(|e| e.ids.as_ref().map(|i| i.tool_call_id.clone()))
        .collect();
    assert_eq!(calls.len(), 2000);
    assert!(events.iter().any(|e| e.thread == "ThreadPoolExecutor-0_7"));
}

#[test]
fn full_queue_drops_and_counts_without_blocking() {
    // Nothing listens on the endpoint: the sender cannot drain, the queue
    // (8 events) fills, and every further hook returns at once, counted.
    let port = hermes_e2e::free_port();
    let code = r#"
for i in range(5000):
    hooks["pre_tool_call"](tool_name="x", args={}, task_id="t", session_id="s", tool_call_id=str(i),
        turn_id="s:t:1", api_request_id="", telemetry_schema_version=V)
s = hermes_collector.stats()
flushed = hermes_collector.flush(300)
print(json.dumps({"flushed": flushed, "stats": s}))
"#;
    let endpoint = format!("http://127.0.0.1:{port}");
    let out = python(
        code,
        &[
            ("HERMES_COLLECTOR_ENDPOINT", &endpoint),
            ("HERMES_COLLECTOR_QUEUE_EVENTS", "8"),
        ],
    );
    let line = out.lines().last().expect("output");
    let v: serde_json::Value = serde_json::from_str(line).expect("json");
    assert_eq!(
        v["flushed"],
        serde_json::json!(false),
        "nothing can be acknowledged: {out}"
    );
    let enqueued = v["stats"]["enqueued"].as_u64().expect("enqueued");
    let dropped = v["stats"]["dropped"].as_u64().expect("dropped");
    assert_eq!(enqueued + dropped, 5000, "{out}");
    assert!(dropped > 0, "{out}");
}
