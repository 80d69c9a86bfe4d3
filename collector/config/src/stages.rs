//! Settings of the pipeline's stages: correlator limits, batching, the
//! queue, shutdown, the runtime and logging.

use std::path::PathBuf;

use serde::Deserialize;

/// Limits and timers of the correlator.
#[derive(Debug, Clone, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct CorrelatorConfig {
    /// Most turns open at once; the oldest is closed as incomplete past it.
    #[schemars(range(min = 1))]
    pub max_open_turns: usize,
    /// Most turns open at once for one agent process (shim instance); its
    /// oldest is closed as incomplete past it, never another agent's.
    #[schemars(range(min = 1))]
    pub max_open_turns_per_agent: usize,
    /// Most session records (session starts waiting for their first turn,
    /// subagent links) of one agent process; its oldest is forgotten past it.
    #[schemars(range(min = 1))]
    pub max_sessions_per_agent: usize,
    /// Most session records in all; past it, the oldest of the agent holding
    /// the most is forgotten.
    #[schemars(range(min = 1))]
    pub max_sessions: usize,
    /// Approximate bytes of open state (ids, captured content, span events)
    /// one agent process may hold; past it, its oldest turn is closed as
    /// incomplete.
    #[schemars(range(min = 1))]
    pub max_bytes_per_agent: usize,
    /// Approximate bytes of open state in all; past it, the oldest turn of
    /// the agent holding the most is closed as incomplete.
    #[schemars(range(min = 1))]
    pub max_bytes: usize,
    /// Open state with no event for this long is closed as incomplete.
    #[schemars(range(min = 1))]
    pub state_ttl_secs: u64,
    /// Wait after `post_llm_call` for the turn's `on_session_end`.
    pub turn_end_grace_ms: u64,
    /// How often timers are checked.
    #[schemars(range(min = 1))]
    pub tick_ms: u64,
    /// How long to wait for a missing event of a shim's stream (events that
    /// arrived after it are held) before giving up on it.
    #[schemars(range(min = 1))]
    pub gap_timeout_ms: u64,
}

/// The defaults are the correlator's and the sequencer's own, so that the
/// configuration and the stages cannot disagree on them.
impl Default for CorrelatorConfig {
    fn default() -> Self {
        let stage = hermes_correlator::Config::default();
        let sequencer = hermes_correlator::sequencer::SequencerConfig::default();
        Self {
            max_open_turns: stage.max_open_turns,
            max_open_turns_per_agent: stage.max_open_turns_per_agent,
            max_sessions_per_agent: stage.max_sessions_per_agent,
            max_sessions: stage.max_sessions,
            max_bytes_per_agent: stage.max_bytes_per_agent,
            max_bytes: stage.max_bytes,
            state_ttl_secs: stage.state_ttl_nanos / 1_000_000_000,
            turn_end_grace_ms: stage.turn_end_grace_nanos / 1_000_000,
            tick_ms: 500,
            gap_timeout_ms: sequencer.gap_timeout_nanos / 1_000_000,
        }
    }
}

/// Batching of finished spans before export.
#[derive(Debug, Clone, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct BatchConfig {
    /// Most spans in one export request.
    #[schemars(range(min = 1))]
    pub max_spans: usize,
    /// Most encoded bytes in one export request (approximately); keep it under
    /// the backend's limit (4 MiB for most OTLP/gRPC servers).
    #[schemars(range(min = 1))]
    pub max_bytes: usize,
    /// Longest a finished span waits for its batch to fill.
    pub timeout_ms: u64,
    /// Capacity of the channel from the correlator to the exporters, in
    /// groups of spans. When full, the correlator waits (backpressure).
    pub queue: usize,
}

/// The batch limits are the exporter stage's own, so that the
/// configuration and the stage cannot disagree on them.
impl Default for BatchConfig {
    fn default() -> Self {
        let hermes_exporter::ExporterSettings {
            max_batch_spans,
            max_batch_bytes,
            batch_timeout,
            ..
        } = hermes_exporter::ExporterSettings::default();
        Self {
            max_spans: max_batch_spans,
            max_bytes: max_batch_bytes,
            timeout_ms: u64::try_from(batch_timeout.as_millis()).unwrap_or(u64::MAX),
            queue: 64,
        }
    }
}

/// Where acknowledged batches live until their spans are exported.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum QueueKind {
    /// Acknowledged once in the pipeline's bounded memory queue; lost if the
    /// process dies (SIGTERM still drains them).
    #[default]
    Memory,
    /// Acknowledged once written to the persistent queue in `dir`; kept
    /// until exported, replayed after a crash or restart.
    Disk,
}

/// The acknowledgement policy and the persistent queue.
#[derive(Debug, Clone, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct QueueConfig {
    pub kind: QueueKind,
    /// Directory of the persistent queue (`kind: disk`); created if missing.
    pub dir: PathBuf,
    /// Payload bytes the persistent queue may hold; when full, the receiver
    /// stops reading (the shims buffer) until exports free room.
    pub max_bytes: u64,
    /// 0: every write is fsynced before its batches are acknowledged.
    /// Above 0: acknowledged after the write, fsynced at most this long
    /// later (a power loss may lose that much; a process crash loses
    /// nothing).
    pub fsync_interval_ms: u64,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            kind: QueueKind::Memory,
            dir: PathBuf::from("/var/lib/hermes-collector/queue"),
            max_bytes: 256 * 1024 * 1024,
            fsync_interval_ms: 0,
        }
    }
}

/// Shutdown on SIGTERM/SIGINT.
#[derive(Debug, Clone, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ShutdownConfig {
    /// Longest the drain may take before the process exits, logging what is
    /// left. Keep it below Kubernetes' `terminationGracePeriodSeconds` (30 s).
    #[schemars(range(max = 29999))]
    pub grace_ms: u64,
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        Self { grace_ms: 20_000 }
    }
}

/// This collector as one replica of a fleet that agents spread over
/// (docs/SCALING.md; the agents' endpoint `dns:///NAME:PORT`).
#[derive(Debug, Clone, Default, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct FleetConfig {
    /// One of several replicas: at the drain (SIGTERM) every fleet agent
    /// is asked to leave and hands its open turns to another replica,
    /// whose open state is then dropped here, not exported incomplete (an
    /// agent that disconnected without a handoff is presumed dead and its
    /// turns are exported incomplete as usual); nothing open is kept for a
    /// next start; and after a restart with the persistent queue, the
    /// replayed open state of an agent that does not come back within
    /// `correlator.state_ttl_secs` is dropped (it went to another replica).
    pub replicated: bool,
}

/// Most worker threads `runtime.worker_threads` accepts.
pub const MAX_WORKER_THREADS: usize = 256;

/// The threads the collector runs on: the pipeline's (receiver, queue
/// writer, correlation, exporters) and the async runtime's workers (admin
/// server, signals, the supervisor, and the pipeline with `pipeline:
/// workers`).
#[derive(Debug, Clone, Default, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeConfig {
    /// Worker threads; 0: one per CPU the process may use (a cgroup CPU
    /// quota counts), or `TOKIO_WORKER_THREADS` when set. With the
    /// pipeline on its own thread the workers only serve the admin server
    /// and the supervisor, and 1 is enough.
    #[schemars(range(max = MAX_WORKER_THREADS))]
    pub worker_threads: usize,
    /// Where the pipeline runs: `own_thread` (one thread of its own, the
    /// least CPU per event: a batch is decoded, correlated, encoded and
    /// sent by the thread that received it, its memory freed by the thread
    /// that allocated it; docs/BENCHMARKS.md), or `workers` (spread over
    /// the worker threads: receiving, decoding and compressing run beside
    /// the correlation on other cores, for more events per second than one
    /// core correlates at more CPU per event).
    pub pipeline: PipelineThreads,
}

/// `runtime.pipeline`: where the pipeline's stages run.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PipelineThreads {
    /// One thread of its own.
    #[default]
    OwnThread,
    /// The async runtime's worker threads.
    Workers,
}

/// The collector's own logs (to standard error).
#[derive(Debug, Clone, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `error`, `warn`, `info`, `debug`, `trace`, or an `EnvFilter` directive.
    /// `RUST_LOG` overrides it.
    pub level: String,
    /// `text` or `json`.
    pub format: LogFormat,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            level: "info".to_owned(),
            format: LogFormat::Text,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, schemars::JsonSchema, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}
