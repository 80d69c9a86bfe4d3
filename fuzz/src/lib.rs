//! The collector's fuzz targets as plain functions, so that the same code
//! runs under libFuzzer (`fuzz_targets/*.rs`, `cargo fuzz run NAME`) and as
//! ordinary tests over the checked-in seeds (`seeds/<target>/`) plus random inputs
//! (`cargo test --manifest-path fuzz/Cargo.toml`). See `README.md`.
//!
//! | target | input | checks |
//! |---|---|---|
//! | [`wire`] | bytes of one `EventBatch` message | the receiver's decoding (`WireBatch::from_wire`) and [`check_batch`] never panic; every batch it accepts decodes with prost to what its event views read; what it accepts respects the limits |
//! | [`pipeline`] | bytes read as operations (`arbitrary`): batches of generated events, batches decoded from raw protobuf, timer ticks | the receiver's checks, the sequencer and the correlator never panic; their state stays within the configured limits after every step; time and `flush_all` empty them; then the same operations through the collector's correlation stage itself (`hermes_pipeline`'s driver on tokio's paused clock, `stage.rs`): no panic, the same bounds, nothing left open or held at its end, every parent emitted |
//! | [`config`] | text of a configuration file | `${VAR}` interpolation, YAML parsing and validation never panic |
//! | [`redaction`] | bytes read as a batch of spans (`arbitrary`) whose strings mix arbitrary text with fragments of secrets | the span processor with the default rules never panics; every exported string is within its limit; processing the output again changes nothing |

#![allow(clippy::unwrap_used, clippy::expect_used)]

use arbitrary::{Arbitrary, Unstructured};
use hermes_correlator::sequencer::{Sequencer, SequencerConfig};
use hermes_correlator::{Config as CorrelatorConfig, Correlation, Correlator, FinishedSpan};
use hermes_proto::hooks;
use hermes_proto::view::{Source, WireEvent};
use hermes_proto::wire::WireBatch;
use hermes_proto::v1::{self, EventBatch, event::Body};
use hermes_receiver::{Limits, check_batch};
use prost::Message;

mod redaction;
mod stage;
pub use redaction::redaction;

const MS: u64 = 1_000_000;
/// 2027-01-15 in ns: the simulated wall clock starts here.
const T0: u64 = 1_800_000_000_000 * MS;

/// Small limits, so that inputs of a few hundred bytes reach them.
fn limits() -> Limits {
    Limits {
        max_message_bytes: 64 * 1024,
        max_events_per_batch: 64,
        max_event_bytes: 4096,
        ..Limits::default()
    }
}

const MAX_OPEN_TURNS: usize = 4;
const MAX_HELD: usize = 8;
const MAX_INSTANCES: usize = 3;
const TTL_MS: u64 = 10_000;
const GAP_TIMEOUT_MS: u64 = 1_000;

// ------------------------------------------------------------------- wire

/// Reads `data` as the receiver does (each event decoded as a view) and
/// checks it; what it accepts, prost decodes to what the views say.
pub fn wire(data: &[u8]) {
    let Ok(received) = WireBatch::from_wire(prost::bytes::Bytes::copy_from_slice(data)) else {
        return;
    };
    let batch = received.to_batch().expect("what the receiver accepts decodes");
    assert_eq!(received.decode_events().unwrap(), batch.events);
    let views: Vec<_> = received
        .wire_events()
        .iter()
        .map(|e| e.view().expect("an accepted event has a view").to_event())
        .collect();
    assert_eq!(views, batch.events);
    assert_eq!(received.events, batch.events.len());
    assert_eq!(received.last_seq, batch.events.last().map(|e| e.seq));
    assert_eq!(received.shim, batch.shim);
    let limits = limits();
    match check_batch(&received, &limits) {
        Ok(()) => {
            assert!(batch.events.len() <= limits.max_events_per_batch);
            assert!(
                batch
                    .events
                    .iter()
                    .all(|e| e.encoded_len() <= limits.max_event_bytes)
            );
            assert!(batch.events.windows(2).all(|w| w[0].seq < w[1].seq));
            assert!(
                batch
                    .shim
                    .as_ref()
                    .is_some_and(|s| !s.instance_id.is_empty())
            );
            // What is accepted re-encodes to a batch the receiver accepts.
            let again = WireBatch::encode(&batch).unwrap();
            assert_eq!(again.decode_events().unwrap(), batch.events);
        }
        Err(refusal) => {
            let status = refusal.status();
            assert!(!status.message().is_empty());
        }
    }
}

// --------------------------------------------------------------- pipeline

/// Every hook, plus one Hermes has that the collector does not use and none.
static HOOKS: std::sync::LazyLock<Vec<&str>> = std::sync::LazyLock::new(|| {
    hooks::ALL
        .into_iter()
        .chain(["transform_tool_result", ""])
        .collect()
});
const SESSIONS: [&str; 4] = ["s0", "s1", "s2", ""];
const TURNS: [&str; 6] = ["t0", "t1", "t2", "t3", "t4", ""];
const APIS: [&str; 3] = ["a0", "a1", ""];
const TOOLS: [&str; 3] = ["c0", "c1", ""];
const SUBAGENTS: [&str; 3] = ["sa0", "sa1", ""];

fn pick(pool: &[&str], byte: u8) -> String {
    pool[usize::from(byte) % pool.len()].to_owned()
}

/// An event time relative to the simulated clock, or any value at all.
#[derive(Debug, Arbitrary)]
enum Time {
    Ahead(u16),
    Behind(u16),
    Raw(u64),
}

impl Time {
    fn at(&self, now: u64) -> u64 {
        match *self {
            Self::Ahead(ms) => now + u64::from(ms) * MS,
            Self::Behind(ms) => now - u64::from(ms) * MS,
            Self::Raw(t) => t,
        }
    }
}

#[derive(Debug, Arbitrary)]
enum BodyKind {
    None,
    Session {
        model: bool,
        reset: bool,
    },
    Turn {
        completed: Option<bool>,
        interrupted: Option<bool>,
    },
    Api {
        attempt: u8,
        started: Time,
        duration_ms: u32,
        status_code: Option<i32>,
        input_tokens: u32,
        output_tokens: u32,
    },
    Tool {
        ok: Option<bool>,
        duration_ms: Option<u32>,
    },
    Subagent {
        duration_ms: Option<u32>,
    },
    Approval {
        choice: u8,
    },
}

/// One generated event; `seq_step` 0 repeats the previous seq (a batch the
/// receiver refuses).
#[derive(Debug, Arbitrary)]
struct GenEvent {
    seq_step: u8,
    hook: u8,
    ids: [u8; 9],
    time: Time,
    body: BodyKind,
}

#[derive(Debug, Arbitrary)]
enum Op {
    /// A batch of one of the agents, events numbered from `first_seq`.
    Batch {
        instance: u8,
        floor_seq: u8,
        first_seq: u8,
        events: Vec<GenEvent>,
    },
    /// A batch decoded from raw protobuf (as an agent could send it).
    Wire { instance: u8, bytes: Vec<u8> },
    /// The driver's timer: the clock advances, then everything expires.
    Tick { ms: u16 },
}

fn body(kind: &BodyKind, now: u64) -> Option<Body> {
    Some(match kind {
        BodyKind::None => return None,
        BodyKind::Session { model, reset } => Body::Session(v1::Session {
            model: if *model { "m".into() } else { String::new() },
            platform: "cli".into(),
            reason: if *reset {
                "reset".into()
            } else {
                String::new()
            },
            ..Default::default()
        }),
        BodyKind::Turn {
            completed,
            interrupted,
        } => Body::Turn(v1::Turn {
            model: "m".into(),
            completed: *completed,
            interrupted: *interrupted,
            ..Default::default()
        }),
        BodyKind::Api {
            attempt,
            started,
            duration_ms,
            status_code,
            input_tokens,
            output_tokens,
        } => {
            let started = started.at(now);
            let duration = u64::from(*duration_ms) * MS;
            Body::Api(Box::new(v1::ApiCall {
                model: "m".into(),
                attempt: u32::from(*attempt % 4),
                started_at_unix_nano: started,
                ended_at_unix_nano: started.saturating_add(duration),
                api_duration_nano: duration,
                status_code: *status_code,
                usage: Some(v1::Usage {
                    input_tokens: u64::from(*input_tokens),
                    output_tokens: u64::from(*output_tokens),
                    prompt_tokens: u64::from(*input_tokens),
                    ..Default::default()
                }),
                ..Default::default()
            }))
        }
        BodyKind::Tool { ok, duration_ms } => Body::Tool(v1::ToolCall {
            tool_name: "terminal".into(),
            status: match ok {
                Some(true) => "ok".into(),
                Some(false) => "error".into(),
                None => String::new(),
            },
            duration_ms: duration_ms.map(u64::from),
            ..Default::default()
        }),
        BodyKind::Subagent { duration_ms } => Body::Subagent(v1::Subagent {
            child_role: "worker".into(),
            duration_ms: duration_ms.map(u64::from),
            ..Default::default()
        }),
        BodyKind::Approval { choice } => Body::Approval(Box::new(v1::Approval {
            surface: "cli".into(),
            choice: pick(&["once", "deny", ""], *choice),
            ..Default::default()
        })),
    })
}

fn event(seq: u64, e: &GenEvent, now: u64) -> v1::Event {
    let i = e.ids;
    let time = e.time.at(now);
    v1::Event {
        seq,
        hook: pick(&HOOKS, e.hook),
        time_unix_nano: time,
        mono_nano: time,
        ids: Some(Box::new(v1::Ids {
            session_id: pick(&SESSIONS, i[0]),
            task_id: String::new(),
            turn_id: pick(&TURNS, i[1]),
            api_request_id: pick(&APIS, i[2]),
            tool_call_id: pick(&TOOLS, i[3]),
            parent_session_id: pick(&SESSIONS, i[4]),
            parent_turn_id: pick(&TURNS, i[5]),
            parent_subagent_id: pick(&SUBAGENTS, i[6]),
            child_session_id: pick(&SESSIONS, i[7]),
            child_subagent_id: pick(&SUBAGENTS, i[8]),
        })),
        body: body(&e.body, now),
        ..Default::default()
    }
}

fn shim(instance: u8) -> v1::ShimInfo {
    v1::ShimInfo {
        instance_id: format!("inst-{}", instance % 4),
        service_name: "hermes-agent".into(),
        host_name: "host".into(),
        pid: u32::from(instance),
        shim_version: "fuzz".into(),
        capture: "metadata".into(),
    }
}

/// The sequencer and correlator with the fuzz targets' small limits.
fn correlation() -> Correlation<WireEvent> {
    Correlation::new(
        Sequencer::new(SequencerConfig {
            max_held: MAX_HELD,
            max_instances: MAX_INSTANCES,
            gap_timeout_nanos: GAP_TIMEOUT_MS * MS,
        }),
        Correlator::new(CorrelatorConfig {
            max_open_turns: MAX_OPEN_TURNS,
            state_ttl_nanos: TTL_MS * MS,
            turn_end_grace_nanos: 500 * MS,
            ..CorrelatorConfig::default()
        }),
    )
}

struct Pipeline {
    limits: Limits,
    correlation: Correlation<WireEvent>,
    now: u64,
    spans: Vec<FinishedSpan>,
    /// (trace id, span id) of every span emitted so far.
    emitted: std::collections::HashSet<(Vec<u8>, Vec<u8>)>,
    /// (trace id, parent span id, name) of every span that has a parent.
    parents: Vec<(Vec<u8>, Vec<u8>, String)>,
}

impl Pipeline {
    fn new() -> Self {
        Self {
            limits: limits(),
            correlation: correlation(),
            now: T0,
            spans: Vec::new(),
            emitted: std::collections::HashSet::new(),
            parents: Vec::new(),
        }
    }

    /// Hands the finished spans on, keeping their ids: every parent must be
    /// emitted too, in the same trace, by the end (a child often leaves
    /// before its parent).
    fn take_spans(&mut self) {
        for s in self.spans.drain(..) {
            assert_eq!(s.span.trace_id.len(), 16, "{}", s.span.name);
            assert_eq!(s.span.span_id.len(), 8, "{}", s.span.name);
            if !s.span.parent_span_id.is_empty() {
                self.parents.push((
                    s.span.trace_id.to_vec(),
                    s.span.parent_span_id.to_vec(),
                    s.span.name.to_string(),
                ));
            }
            self.emitted.insert((s.span.trace_id.into(), s.span.span_id.into()));
        }
    }

    /// What the receiver and the pipeline do with one batch.
    fn batch(&mut self, received: WireBatch) {
        if check_batch(&received, &self.limits).is_err() {
            return;
        }
        let Some(shim) = &received.shim else { return };
        self.correlation.push_wire_batch(
            shim,
            received.floor_seq,
            &received,
            0,
            self.now,
            &mut self.spans,
        );
        self.take_spans();
    }

    fn tick(&mut self, advance: u64) {
        self.now += advance;
        self.correlation.tick(self.now, &mut self.spans);
        self.take_spans();
    }

    fn op(&mut self, op: &Op) {
        match step(op, self.now) {
            Step::Batch(received) => self.batch(received),
            Step::Tick(nanos) => self.tick(nanos),
            Step::Nothing => {}
        }
        assert!(self.correlation.sequencer().held() <= MAX_HELD * MAX_INSTANCES);
        assert!(self.correlation.correlator().open_turns() <= MAX_OPEN_TURNS);
    }
}

/// What an operation does at `now`: a batch for the receiver, or a tick.
enum Step {
    Batch(WireBatch),
    Tick(u64),
    /// Raw bytes that do not decode.
    Nothing,
}

fn step(op: &Op, now: u64) -> Step {
    match op {
        Op::Batch {
            instance,
            floor_seq,
            first_seq,
            events,
        } => {
            let mut seq = u64::from(*first_seq);
            let events = events
                .iter()
                .map(|e| {
                    seq += u64::from(e.seq_step % 4);
                    event(seq, e, now)
                })
                .collect();
            Step::Batch(
                WireBatch::encode(&EventBatch {
                    shim: Some(shim(*instance)),
                    events,
                    dropped_events: 0,
                    floor_seq: u64::from(*floor_seq),
                    handoff: false,
                })
                .unwrap(),
            )
        }
        Op::Wire { instance, bytes } => match WireBatch::from_wire(bytes.clone().into()) {
            Ok(mut received) => {
                // One of the few agents, so that instances collide.
                received.shim = Some(shim(*instance));
                Step::Batch(received)
            }
            Err(_) => Step::Nothing,
        },
        Op::Tick { ms } => Step::Tick(u64::from(*ms) * MS),
    }
}

/// Every parent of an emitted span must be emitted too, in the same trace.
fn assert_parents_emitted(
    emitted: &std::collections::HashSet<(Vec<u8>, Vec<u8>)>,
    parents: &[(Vec<u8>, Vec<u8>, String)],
) {
    for (trace, parent, name) in parents {
        assert!(
            emitted.contains(&(trace.clone(), parent.clone())),
            "span {name:?} has no emitted parent"
        );
    }
}

/// Reads `data` as operations and drives the pipeline with them.
pub fn pipeline(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(ops) = Vec::<Op>::arbitrary(&mut u) else {
        return;
    };
    let mut p = Pipeline::new();
    for op in &ops {
        p.op(op);
    }
    // Enough ticks past every timer (one sequencer hole per instance and
    // tick) release and close everything held by time alone...
    for _ in 0..=MAX_HELD {
        p.tick(GAP_TIMEOUT_MS * MS);
    }
    let open_before_flush = p.correlation.correlator().open_turns();
    assert_eq!(p.correlation.sequencer().held(), 0);
    // ... and flush_all closes what far-future times keep open.
    p.correlation.flush_all(&mut p.spans);
    p.take_spans();
    assert_eq!(p.correlation.correlator().open_turns(), 0);
    assert!(open_before_flush <= MAX_OPEN_TURNS);
    assert_parents_emitted(&p.emitted, &p.parents);
    stage::through_the_stage(&ops);
}

// ----------------------------------------------------------------- config

/// Loads `data` (lossily UTF-8) as the collector loads its configuration
/// file. Inputs that name device or kernel files, or climb directories, are
/// skipped: validation reads the files a configuration names (tokens, TLS
/// material, header values), and `/dev/zero` would never end.
pub fn config(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if ["/dev", "/proc", "/sys", ".."]
        .iter()
        .any(|bad| text.contains(bad))
    {
        return;
    }
    let env = |name: &str| match name {
        "EMPTY" => Some(String::new()),
        "TOKEN" => Some("s3cret-token".to_owned()),
        "PORT" => Some("4319".to_owned()),
        _ => None,
    };
    if let Err(e) = hermes_config::Config::from_text(&text, &env) {
        let message = e.to_string();
        assert!(!message.is_empty());
        // The token is a secret when it comes from the environment; text
        // that writes it out itself may be quoted back.
        if !text.contains("s3cret-token") {
            assert!(!message.contains("s3cret-token"), "{message}");
        }
    }
}

// ------------------------------------------------------------ smoke tests

#[cfg(test)]
mod smoke {
    //! Every seed of `seeds/<target>/`, then random inputs and random
    //! mutations of the seeds (a fixed-seed xorshift, so failures repeat;
    //! `HERMES_FUZZ_SMOKE_CASES` sets how many per target, default 2000).

    use std::path::PathBuf;

    fn seeds(target: &str) -> Vec<Vec<u8>> {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("seeds")
            .join(target);
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|entry| entry.unwrap().path())
            .filter(|p| p.is_file())
            .collect();
        files.sort();
        assert!(!files.is_empty(), "no seed in {}", dir.display());
        files.iter().map(|f| std::fs::read(f).unwrap()).collect()
    }

    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }

        fn bytes(&mut self, len: usize) -> Vec<u8> {
            (0..len).map(|_| self.next() as u8).collect()
        }

        /// Flips, inserts, deletes or overwrites a few bytes of `input`.
        fn mutate(&mut self, input: &[u8]) -> Vec<u8> {
            let mut out = input.to_vec();
            for _ in 0..1 + self.below(8) {
                let at = self.below(out.len() + 1);
                match self.below(4) {
                    0 if at < out.len() => out[at] ^= 1 << self.below(8),
                    1 => out.insert(at, self.next() as u8),
                    2 if at < out.len() => {
                        out.remove(at);
                    }
                    _ => {
                        let len = self.below(16);
                        let chunk = self.bytes(len);
                        out.splice(at..at, chunk);
                    }
                }
            }
            out
        }
    }

    fn cases() -> usize {
        std::env::var("HERMES_FUZZ_SMOKE_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(2000)
    }

    fn smoke(target: &str, run: fn(&[u8])) {
        let seeds = seeds(target);
        for seed in &seeds {
            run(seed);
        }
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15 ^ target.len() as u64);
        for _ in 0..cases() {
            let input = if rng.below(3) == 0 {
                let len = rng.below(512);
                rng.bytes(len)
            } else {
                let seed = &seeds[rng.below(seeds.len())];
                rng.mutate(seed)
            };
            run(&input);
        }
    }

    #[test]
    fn wire() {
        smoke("wire", super::wire);
    }

    /// Rewrites the generated seeds of `seeds/wire/` and `seeds/pipeline/`:
    /// `HERMES_FUZZ_WRITE_SEEDS=1 cargo test --manifest-path fuzz/Cargo.toml
    /// write_seeds -- --ignored`.
    #[test]
    #[ignore = "writes seed files; run by hand"]
    fn write_seeds() {
        use hermes_proto::v1::{self, EventBatch, event::Body};
        use prost::Message;
        if std::env::var_os("HERMES_FUZZ_WRITE_SEEDS").is_none() {
            return;
        }
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("seeds");
        let ids = |turn: &str| v1::Ids {
            session_id: "s0".into(),
            turn_id: turn.into(),
            api_request_id: format!("{turn}:api:1"),
            tool_call_id: "call_1".into(),
            ..Default::default()
        };
        let event = |seq: u64, hook: &str, body: Option<Body>| v1::Event {
            seq,
            hook: hook.into(),
            schema_version: "1".into(),
            time_unix_nano: super::T0 + seq * super::MS,
            mono_nano: seq * super::MS,
            thread: "MainThread".into(),
            ids: Some(Box::new(ids("t0"))),
            body,
            content: Default::default(),
        };
        let api = |usage: Option<v1::Usage>| {
            Some(Body::Api(Box::new(v1::ApiCall {
                model: "m".into(),
                attempt: 1,
                usage,
                ..Default::default()
            })))
        };
        let tool = |status: &str, duration_ms: Option<u64>| {
            Some(Body::Tool(v1::ToolCall {
                tool_name: "terminal".into(),
                status: status.into(),
                duration_ms,
                ..Default::default()
            }))
        };
        let turn = |model: &str, completed: Option<bool>| {
            Some(Body::Turn(v1::Turn {
                model: model.into(),
                completed,
                ..Default::default()
            }))
        };
        let usage = v1::Usage {
            input_tokens: 10,
            output_tokens: 3,
            ..Default::default()
        };
        let turn = vec![
            event(1, "pre_llm_call", turn("m", None)),
            event(2, "pre_api_request", api(None)),
            event(3, "post_api_request", api(Some(usage))),
            event(4, "pre_tool_call", tool("", None)),
            event(5, "post_tool_call", tool("ok", Some(40))),
            event(6, "post_llm_call", turn("", Some(true))),
            event(7, "on_session_end", turn("", Some(true))),
        ];
        let shim = v1::ShimInfo {
            instance_id: "inst-1".into(),
            service_name: "hermes-agent".into(),
            host_name: "host".into(),
            pid: 1,
            shim_version: "seed".into(),
            capture: "metadata".into(),
        };
        let batch = |events: Vec<v1::Event>| EventBatch {
            shim: Some(shim.clone()),
            events,
            dropped_events: 0,
            floor_seq: 0,
            handoff: false,
        };
        let mut oversized = turn.clone();
        oversized[3].hook = "x".repeat(5000);
        let mut decreasing = turn.clone();
        decreasing.swap(1, 2);
        let seeds = [
            ("turn", batch(turn.clone())),
            ("oversized-event", batch(oversized)),
            ("decreasing-seq", batch(decreasing)),
            ("empty", batch(Vec::new())),
            (
                "no-shim",
                EventBatch {
                    shim: None,
                    ..batch(turn[..1].to_vec())
                },
            ),
        ];
        for (name, batch) in &seeds {
            std::fs::write(dir.join("wire").join(name), batch.encode_to_vec()).unwrap();
        }
        // Pipeline seeds: random operation streams of a few sizes.
        let mut rng = XorShift(0x5eed);
        for len in [64, 256, 1024, 4096] {
            std::fs::write(
                dir.join("pipeline").join(format!("random-{len}")),
                rng.bytes(len),
            )
            .unwrap();
        }
    }

    #[test]
    fn pipeline() {
        smoke("pipeline", super::pipeline);
    }

    #[test]
    fn config() {
        smoke("config", super::config);
    }

    #[test]
    fn redaction() {
        smoke("redaction", super::redaction);
    }
}
