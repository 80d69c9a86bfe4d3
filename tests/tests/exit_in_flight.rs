//! Work in flight when the agent process exits: the real
//! `hermes-agent==0.18.2`, whose `hermes -z` runs `delegate_task` in the
//! background on a daemon thread and exits when the parent's turn is done,
//! cutting the child off. Through the shim and the real collector:
//!
//! - the child's hooks reach the collector, also those fired while the
//!   interpreter exits (after the parent's last `on_session_end`), directly
//!   or through the spool and the next plugin start;
//! - the shim's `process_exit` marker makes the collector close the child at
//!   once: its spans keep their real capture times, the subagent span covers
//!   the child's work (not 0 ms), and the cut-off turn says
//!   `hermes.incomplete=true`, `hermes.turn.completed=false`,
//!   `hermes.turn.interrupted=true`, `end_reason=process_exit`
//!   (`docs/TRACE_MODEL.md`, "Work cut off by the exit").
//!
//! The scripted model server answers the parent and the child by their
//! first user message (`only_if`), since their requests race.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use hermes_e2e::rig::{AgentRig, WAIT};
use hermes_e2e::{AttrsExt, SpanExt, SpanTree};
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use serde_json::{Value, json};

const HERMES: &str = "0.18.2";
const PARENT: &str = "PARENT-TURN";
const CHILD: &str = "CHILD-TASK";
/// Far beyond every exit in these tests.
const CHILD_LAST_DELAY_MS: u64 = 60_000;
/// The exit flush of the spool test: long enough for the child's slow
/// command to end before the exit on a loaded machine.
const EXIT_FLUSH_MS: &str = "9000";

/// The parent delegates, then answers after `parent_delay_ms`; the child
/// answers its first call after `child_delay_ms` with a slow command, and
/// its next call only after [`CHILD_LAST_DELAY_MS`]: the exit cuts off the
/// command or, when the exit waits longer, that call, whatever the load.
fn script(parent_delay_ms: u64, child_delay_ms: u64) -> Value {
    json!([
        {"only_if": PARENT,
         "tool_calls": [{"name": "delegate_task",
                         "arguments": {"goal": format!("{CHILD}: run sleep 4 and report")}}],
         "usage": {"prompt_tokens": 111, "completion_tokens": 11}},
        {"only_if": PARENT, "delay_ms": parent_delay_ms,
         "content": "Parent done: the subagent works in the background.",
         "usage": {"prompt_tokens": 222, "completion_tokens": 22}},
        {"only_if": CHILD, "delay_ms": child_delay_ms,
         "tool_calls": [{"name": "terminal", "arguments": {"command": "sleep 4; echo from-child"}}],
         "usage": {"prompt_tokens": 333, "completion_tokens": 33}},
        {"only_if": CHILD, "delay_ms": CHILD_LAST_DELAY_MS,
         "content": "The child printed from-child.",
         "usage": {"prompt_tokens": 444, "completion_tokens": 44}}
    ])
}

/// What these tests do with an [`AgentRig`].
trait Setup {
    fn oneshot(&self, env: &[(&str, &str)]) -> std::thread::JoinHandle<hermes_e2e::RunOutput>;
    fn collect(&self, spans: usize) -> SpanTree;
}

impl Setup for AgentRig {
    /// `hermes -z` with delegation, in the background; returns its thread.
    fn oneshot(&self, env: &[(&str, &str)]) -> std::thread::JoinHandle<hermes_e2e::RunOutput> {
        let mut cmd = self.home.command("hermes", env);
        cmd.args([
            "-z",
            &format!("{PARENT}: delegate the slow command to a subagent"),
            "-t",
            "terminal,delegation",
        ]);
        std::thread::spawn(move || {
            hermes_e2e::run_with_timeout(&mut cmd, hermes_e2e::hermes::DEFAULT_RUN_TIMEOUT)
        })
    }

    /// Waits for `spans` spans of which one is the cut-off child turn, then
    /// for stragglers; panics with what arrived otherwise.
    fn collect(&self, spans: usize) -> SpanTree {
        self.collect_when(
            &format!("{spans} spans with the cut-off child turn"),
            |received| {
                received.len() >= spans
                    && received
                        .iter()
                        .any(|(_, s)| s.str_attr("hermes.turn.end_reason") == Some("process_exit"))
            },
        )
    }
}

fn first_user_text(body: &Value) -> String {
    hermes_e2e::fake_openai::messages(body)
        .iter()
        .find(|m| m["role"] == "user")
        .map(|m| m["content"].to_string())
        .unwrap_or_default()
}

/// The spans of the cut-off delegation; returns the parent turn, the
/// subagent span and the child turn.
fn assert_cut_off_child(tree: &SpanTree) -> (&Span, &Span, &Span) {
    let roots = tree.roots();
    assert_eq!(roots.len(), 1, "{}", tree.render());
    let parent = roots[0];
    assert_eq!(parent.bool_attr("hermes.turn.completed"), Some(true));
    assert!(!parent.has_attr("hermes.incomplete"), "{}", tree.render());
    let delegate = tree.children_named(parent, "execute_tool delegate_task");
    assert_eq!(delegate.len(), 1, "{}", tree.render());
    let subs = tree.children(delegate[0]);
    assert_eq!(
        subs.len(),
        1,
        "the subagent span under delegate_task:\n{}",
        tree.render()
    );
    let sub = subs[0];
    assert!(sub.has_attr("gen_ai.agent.id"), "{}", tree.render());
    assert_eq!(sub.bool_attr("hermes.incomplete"), Some(true));
    let child_turns = tree.children(sub);
    assert_eq!(child_turns.len(), 1, "{}", tree.render());
    let child = child_turns[0];
    assert_eq!(child.str_attr("hermes.platform"), Some("subagent"));
    assert_eq!(child.bool_attr("hermes.incomplete"), Some(true));
    assert_eq!(child.bool_attr("hermes.turn.completed"), Some(false));
    assert_eq!(child.bool_attr("hermes.turn.interrupted"), Some(true));
    assert_eq!(
        child.str_attr("hermes.turn.end_reason"),
        Some("process_exit")
    );
    assert_ne!(child.status_code(), StatusCode::Error, "{}", tree.render());
    // The exit ends the child turn and the subagent, which spans the
    // child's work: from the delegation to the exit, not 0 ms.
    assert_eq!(sub.end_time_unix_nano, child.end_time_unix_nano);
    assert!(sub.start_time_unix_nano <= child.start_time_unix_nano);
    assert!(
        sub.duration_nanos() > 1_000_000_000,
        "subagent span of {} ms\n{}",
        sub.duration_nanos() / 1_000_000,
        tree.render()
    );
    (parent, sub, child)
}

/// The child's model calls, in start order.
fn chats<'a>(tree: &'a SpanTree, child: &Span) -> Vec<&'a Span> {
    let mut chats: Vec<&Span> = tree
        .children(child)
        .into_iter()
        .filter(|s| s.name.starts_with("chat "))
        .collect();
    chats.sort_by_key(|s| s.start_time_unix_nano);
    chats
}

/// The child's one `terminal` call.
fn terminal<'a>(tree: &'a SpanTree, child: &Span) -> &'a Span {
    let terminal = tree.children_named(child, "execute_tool terminal");
    assert_eq!(terminal.len(), 1, "{}", tree.render());
    terminal[0]
}

/// With the collector up: the exit marker closes the cut-off child at once
/// (no collector stop, no TTL), with the real times of its work.
#[test]
fn background_child_cut_off_by_the_exit_is_closed_with_its_real_work() {
    // The child reaches its slow command well before the parent answers.
    let setup = AgentRig::start_enabled(script(2_500, 0), HERMES);
    let run = setup.oneshot(&setup.env(&[])).join().unwrap();
    assert!(run.success(), "{}", run.describe());
    assert!(run.stdout().contains("Parent done"), "{}", run.describe());
    let tree = setup.collect(8);
    let (parent, sub, child) = assert_cut_off_child(&tree);
    assert!(
        child.end_time_unix_nano >= parent.end_time_unix_nano,
        "the child worked until the process exited, after the parent's turn\n{}",
        tree.render()
    );
    // An answered model call, then the slow command, cut off by the exit.
    let chats = chats(&tree, child);
    assert_eq!(chats.len(), 1, "{}", tree.render());
    assert!(!chats[0].has_attr("hermes.incomplete"), "{}", tree.render());
    assert_eq!(chats[0].int_attr("gen_ai.usage.output_tokens"), Some(33));
    let terminal = terminal(&tree, child);
    assert_eq!(terminal.bool_attr("hermes.incomplete"), Some(true));
    assert!(terminal.start_time_unix_nano > chats[0].end_time_unix_nano);
    assert_eq!(terminal.end_time_unix_nano, child.end_time_unix_nano);
    assert!(sub.end_time_unix_nano > terminal.start_time_unix_nano);
    assert_eq!(tree.len(), 8, "{}", tree.render());
    assert_eq!(
        setup
            .collector
            .metric("hermes_collector_correlator_turns_cut_off_at_exit_total"),
        1.0
    );
}

/// The collector hangs (SIGSTOP) while the parent ends, so the shim's exit
/// flush waits: the child keeps working meanwhile and fires its hooks after
/// the parent's last `on_session_end`, while the interpreter exits. They and
/// the exit marker go to the spool; the next plugin start replays them to
/// the collector (resumed), which closes the child with everything it did.
#[test]
fn hooks_fired_during_the_exit_reach_the_collector_through_the_spool() {
    // The parent answers 1 s after its request (the collector is stopped
    // by then); the child's first answer comes 1.5 s after the parent's,
    // during the exit flush, which outlasts the child's slow command.
    let setup = AgentRig::start_enabled(script(1_000, 2_500), HERMES);
    let spool = tempfile::tempdir().expect("spool dir");
    let spool_dir = spool.path().join("spool");
    let spool_str = spool_dir.to_string_lossy().into_owned();
    let env = setup.env(&[
        ("HERMES_COLLECTOR_SPOOL_DIR", spool_str.as_str()),
        ("HERMES_COLLECTOR_EXIT_FLUSH_MS", EXIT_FLUSH_MS),
    ]);
    let run = setup.oneshot(&env);

    // Stop the collector once the parent asked for its final answer.
    let asked = hermes_e2e::wait_until(WAIT, Duration::from_millis(10), || {
        setup
            .server
            .main_requests()
            .iter()
            .filter(|body| first_user_text(body).contains(PARENT))
            .count()
            >= 2
    });
    assert!(asked, "{}", setup.server.describe_requests());
    assert!(setup.collector.guard.signal("STOP"));
    let run = run.join().unwrap();
    assert!(setup.collector.guard.signal("CONT"));
    assert!(run.success(), "{}", run.describe());
    assert!(
        !spool_files(&spool_dir).is_empty(),
        "the exit spooled what the stopped collector did not acknowledge"
    );

    // The next start of the plugin (any agent process) replays the spool.
    let replay = setup.home.python(
        r#"
import hermes_collector
class Ctx:
    def register_hook(self, name, cb):
        pass
hermes_collector.register(Ctx())
ok = hermes_collector.flush(20000)
print("REPLAYED", ok, hermes_collector.stats()["replayed_events"])
"#,
        &env,
        WAIT,
    );
    assert!(replay.success(), "{}", replay.describe());
    assert!(
        replay.stdout().contains("REPLAYED True"),
        "{}",
        replay.describe()
    );

    let tree = setup.collect(9);
    let (parent, _sub, child) = assert_cut_off_child(&tree);
    // Everything the child did during the exit flush, after the
    // parent's last hook, came through the spool: its answered call, the
    // whole slow command, and its next call, cut off by the exit.
    let chats = chats(&tree, child);
    assert_eq!(chats.len(), 2, "{}", tree.render());
    assert!(!chats[0].has_attr("hermes.incomplete"), "{}", tree.render());
    assert!(
        chats[0].end_time_unix_nano > parent.end_time_unix_nano,
        "the child's call ended after the parent's turn\n{}",
        tree.render()
    );
    let terminal = terminal(&tree, child);
    assert!(terminal.start_time_unix_nano > parent.end_time_unix_nano);
    assert!(!terminal.has_attr("hermes.incomplete"), "{}", tree.render());
    assert_eq!(terminal.str_attr("hermes.tool.status"), Some("ok"));
    assert!(chats[1].start_time_unix_nano >= terminal.end_time_unix_nano);
    assert_eq!(chats[1].bool_attr("hermes.incomplete"), Some(true));
    assert_eq!(chats[1].end_time_unix_nano, child.end_time_unix_nano);
    assert!(
        wait_empty(&spool_dir),
        "replayed files are deleted: {:?}",
        spool_files(&spool_dir)
    );
    assert_eq!(tree.len(), 9, "{}", tree.render());
}

fn spool_files(dir: &Path) -> Vec<std::path::PathBuf> {
    hermes_e2e::fault::spool_files(dir)
}

fn wait_empty(dir: &Path) -> bool {
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        if spool_files(dir).is_empty() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}
