//! Conversions from the configuration's sections into each stage's own
//! settings: the receiver's [`Limits`](hermes_receiver::Limits), the
//! correlator's and the sequencer's configs, the exporter stage's
//! [`ExporterSettings`](hermes_exporter::ExporterSettings), the persistent
//! queue's [`DiskQueueSettings`], the sampler's
//! [`SamplingSettings`](hermes_sampling::SamplingSettings).
//!
//! Owns: the mapping of keys to stage fields and of their units (`_ms`,
//! `_secs`, `_mib`) to the stages' `Duration`s and bytes. Pure: no I/O, no
//! secret (those are read once by validation, see [`crate::Validated`]).
//! A stage field no key sets keeps the stage's own default.

use std::path::PathBuf;
use std::time::Duration;

use crate::{BatchConfig, Config, CorrelatorConfig, QueueConfig, QueueKind, ReceiverConfig};

/// How often the receiver's memory limit reads the process' resident size.
pub const MEMORY_LIMIT_INTERVAL: Duration = Duration::from_millis(100);

impl ReceiverConfig {
    /// The ingest's limits (`receiver.*`).
    pub fn limits(&self) -> hermes_receiver::Limits {
        hermes_receiver::Limits {
            max_message_bytes: self.max_message_bytes,
            max_events_per_batch: self.max_events_per_batch,
            max_event_bytes: self.max_event_bytes,
            stream_events_per_sec: self.stream_events_per_sec,
            stream_burst_events: self.stream_burst_events,
            max_streams_per_connection: self.max_streams_per_connection,
            connections: hermes_receiver::ConnectionLimits {
                max_connections: self.max_connections,
                handshake_timeout: Duration::from_millis(self.handshake_timeout_ms),
                idle_timeout: Duration::from_secs(self.idle_timeout_secs),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// `receiver.memory_limit_mib` in bytes; None when 0 (no limit). The
    /// receiver's `MemoryLimit::new(bytes, MEMORY_LIMIT_INTERVAL)` takes it.
    pub fn memory_limit_bytes(&self) -> Option<u64> {
        (self.memory_limit_mib > 0).then(|| self.memory_limit_mib.saturating_mul(1024 * 1024))
    }
}

impl CorrelatorConfig {
    /// The correlator's limits and timers (`correlator.*`).
    pub fn correlator(&self) -> hermes_correlator::Config {
        hermes_correlator::Config {
            max_open_turns: self.max_open_turns,
            max_open_turns_per_agent: self.max_open_turns_per_agent,
            max_sessions_per_agent: self.max_sessions_per_agent,
            max_sessions: self.max_sessions,
            max_bytes_per_agent: self.max_bytes_per_agent,
            max_bytes: self.max_bytes,
            state_ttl_nanos: self.state_ttl_secs.saturating_mul(1_000_000_000),
            turn_end_grace_nanos: self.turn_end_grace_ms.saturating_mul(1_000_000),
            ..Default::default()
        }
    }

    /// The sequencer in front of the correlator (`correlator.gap_timeout_ms`).
    pub fn sequencer(&self) -> hermes_correlator::sequencer::SequencerConfig {
        hermes_correlator::sequencer::SequencerConfig {
            gap_timeout_nanos: self.gap_timeout_ms.saturating_mul(1_000_000),
            ..Default::default()
        }
    }

    /// How often the correlation stage checks its timers (`correlator.tick_ms`).
    pub fn tick(&self) -> Duration {
        Duration::from_millis(self.tick_ms)
    }
}

impl BatchConfig {
    /// `batch.timeout_ms`.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }
}

/// The persistent queue's settings (`queue.kind: disk`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskQueueSettings {
    /// `queue.dir`.
    pub dir: PathBuf,
    /// `queue.max_bytes`.
    pub max_bytes: u64,
    /// `queue.fsync_interval_ms`; zero: every write fsynced before its ack.
    pub fsync_interval: Duration,
}

impl QueueConfig {
    /// When the receiver acknowledges a batch (`queue.kind`).
    pub fn delivery(&self) -> hermes_receiver::Delivery {
        match self.kind {
            QueueKind::Memory => hermes_receiver::Delivery::Memory,
            QueueKind::Disk => hermes_receiver::Delivery::Durable,
        }
    }

    /// The persistent queue, None with `queue.kind: memory`.
    pub fn disk(&self) -> Option<DiskQueueSettings> {
        (self.kind == QueueKind::Disk).then(|| DiskQueueSettings {
            dir: self.dir.clone(),
            max_bytes: self.max_bytes,
            fsync_interval: Duration::from_millis(self.fsync_interval_ms),
        })
    }
}

impl Config {
    /// The exporter stage's batching, retry and drain (`batch.*`,
    /// `exporters.otlp.max_elapsed_secs`, `shutdown.grace_ms`).
    pub fn exporter_settings(&self) -> hermes_exporter::ExporterSettings {
        hermes_exporter::ExporterSettings {
            max_batch_spans: self.batch.max_spans,
            max_batch_bytes: self.batch.max_bytes,
            batch_timeout: self.batch.timeout(),
            retry: hermes_exporter::RetrySettings {
                max_elapsed: Duration::from_secs(
                    self.exporters
                        .otlp
                        .as_ref()
                        .map_or(30, |o| o.max_elapsed_secs),
                ),
                ..Default::default()
            },
            drain_timeout: self.shutdown.grace(),
            ..Default::default()
        }
    }
}

impl Config {
    /// The sampler's settings (`sampling.*`): no policies without the
    /// section (every turn kept). A held trace waits for its root at most
    /// `correlator.state_ttl_secs` after its last span: by then the
    /// correlator has closed its turn.
    pub fn sampling_settings(&self) -> hermes_sampling::SamplingSettings {
        let defaults = hermes_sampling::SamplingSettings::default();
        hermes_sampling::SamplingSettings {
            policies: self
                .sampling
                .as_ref()
                .map(crate::SamplingConfig::policies)
                .unwrap_or_default(),
            max_held_spans: self
                .sampling
                .as_ref()
                .map_or(defaults.max_held_spans, |s| s.max_held_spans),
            max_wait_nanos: self.correlator.state_ttl_secs.saturating_mul(1_000_000_000),
        }
    }
}

impl crate::ShutdownConfig {
    /// `shutdown.grace_ms`: the drain's deadline.
    pub fn grace(&self) -> Duration {
        Duration::from_millis(self.grace_ms)
    }
}
