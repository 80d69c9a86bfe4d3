//! The sessions in progress and when each is written.
//!
//! Owns: merging each batch's records into its session (a span seen again,
//! after a replay or a retry, replaces the first copy), keeping every
//! session in progress on disk after every batch (`<stem>.partial.json`,
//! see [`crate::files`]), and writing a session's trajectory once it is
//! idle for `idle_ms`, marked incomplete.
//!
//! Durability: a batch counts as exported once the partial files it touched
//! are written, so the persistent queue may delete its records; what the
//! collector held in memory only is on disk, and [`Sessions::open`] reloads
//! it at the next start, idle times included.
//!
//! Synchronous and clock-free: callers pass the wall-clock time, the
//! exporter ([`crate::sink`]) runs it on the blocking pool.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use hermes_span::trace::v1::ResourceSpans;

use crate::build::{Ending, build};
use crate::files::{
    PARTIAL_SUFFIX, Partial, link_continuation, load_partials, next_segment, segment_name, stem,
    write_atomic, write_trajectory,
};
use crate::record::records_of;

/// What the trajectory exporter did; all monotonic.
#[derive(Debug, Default)]
pub struct TrajectoryStats {
    /// Trajectory files written (every segment counts).
    pub written: AtomicU64,
    /// Of `written`, those written after the idle time (marked incomplete).
    pub incomplete: AtomicU64,
    /// Spans of agents whose capture level carries no messages, left out.
    pub spans_without_messages: AtomicU64,
    /// Partial files found at start that did not parse, left in place.
    pub unreadable_partials: AtomicU64,
}

/// The sessions in progress of one trajectory directory.
#[derive(Debug)]
pub struct Sessions {
    dir: PathBuf,
    idle_ms: u64,
    open: BTreeMap<String, Partial>,
    /// Agents (`service.name`, `service.instance.id`) already logged as
    /// sending no messages.
    warned: BTreeSet<(String, String)>,
    stats: Arc<TrajectoryStats>,
}

impl Sessions {
    /// The sessions of `dir`, those in progress reloaded from their partial
    /// files. A partial file that does not parse is logged, counted and
    /// left for a person to look at.
    pub fn open(dir: &Path, idle_ms: u64) -> std::io::Result<Self> {
        let stats = Arc::new(TrajectoryStats::default());
        let (partials, bad) = load_partials(dir)?;
        for (path, error) in bad {
            tracing::warn!(path = %path.display(), %error, "trajectory in progress cannot be read; left in place");
            stats.unreadable_partials.fetch_add(1, Ordering::Relaxed);
        }
        let open = partials
            .into_iter()
            .map(|p| (stem(&p.session_id), p))
            .collect();
        Ok(Self {
            dir: dir.to_owned(),
            idle_ms,
            open,
            warned: BTreeSet::new(),
            stats,
        })
    }

    /// The exporter's counters.
    pub fn stats(&self) -> Arc<TrajectoryStats> {
        self.stats.clone()
    }

    /// Number of sessions in progress.
    pub fn len(&self) -> usize {
        self.open.len()
    }

    /// Whether no session is in progress.
    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    /// Merges `batch` into its sessions and rewrites the partial file of
    /// each session it touched. On an error the batch may be added again
    /// (a retry): its spans replace their first copies.
    pub fn add(&mut self, batch: &[ResourceSpans], now_ms: u64) -> std::io::Result<()> {
        let mut touched = BTreeSet::new();
        for session in records_of(batch) {
            if !session.agent.has_messages() {
                self.stats
                    .spans_without_messages
                    .fetch_add(session.records.len() as u64, Ordering::Relaxed);
                let agent = (
                    session.agent.service.clone(),
                    session.agent.instance.clone(),
                );
                if self.warned.insert(agent) {
                    tracing::warn!(
                        service = %session.agent.service,
                        instance = %session.agent.instance,
                        capture = %session.agent.capture,
                        "no trajectories for this agent: its capture level carries no messages (set HERMES_COLLECTOR_CAPTURE=content)"
                    );
                }
                continue;
            }
            let key = stem(&session.session_id);
            let dir = &self.dir;
            let partial = self.open.entry(key.clone()).or_insert_with(|| Partial {
                session_id: session.session_id.clone(),
                agent: session.agent.clone(),
                segment: next_segment(dir, &key),
                last_seen_ms: now_ms,
                records: Vec::new(),
            });
            partial.last_seen_ms = now_ms;
            for record in session.records {
                match partial
                    .records
                    .iter_mut()
                    .find(|r| r.span_id == record.span_id)
                {
                    Some(same) => *same = record,
                    None => partial.records.push(record),
                }
            }
            touched.insert(key);
        }
        for key in touched {
            if let Some(partial) = self.open.get(&key) {
                let bytes = serde_json::to_vec(partial).map_err(std::io::Error::other)?;
                write_atomic(&self.dir.join(format!("{key}{PARTIAL_SUFFIX}")), &bytes)?;
            }
        }
        Ok(())
    }

    /// When the first session in progress becomes idle (wall-clock ms).
    pub fn next_due(&self) -> Option<u64> {
        self.open
            .values()
            .map(|p| p.last_seen_ms.saturating_add(self.idle_ms))
            .min()
    }

    /// Writes the trajectory of every session idle for `idle_ms` at `now_ms`,
    /// marked incomplete. Returns how many were written.
    pub fn write_idle(&mut self, now_ms: u64) -> std::io::Result<usize> {
        let due: Vec<String> = self
            .open
            .iter()
            .filter(|(_, p)| p.last_seen_ms.saturating_add(self.idle_ms) <= now_ms)
            .map(|(k, _)| k.clone())
            .collect();
        for key in &due {
            self.finish(key, Ending::Idle)?;
        }
        Ok(due.len())
    }

    /// Writes the trajectory of the session with stem `key` and forgets it.
    fn finish(&mut self, key: &str, ending: Ending) -> std::io::Result<()> {
        let Some(partial) = self.open.get(key) else {
            return Ok(());
        };
        let trajectory = build(
            &partial.session_id,
            &partial.agent,
            &partial.records,
            ending,
        );
        let name = segment_name(key, partial.segment);
        write_trajectory(&self.dir.join(&name), &trajectory)?;
        if partial.segment > 1 {
            link_continuation(
                &self.dir.join(segment_name(key, partial.segment - 1)),
                &name,
            )?;
        }
        match std::fs::remove_file(self.dir.join(format!("{key}{PARTIAL_SUFFIX}"))) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        self.open.remove(key);
        self.stats.written.fetch_add(1, Ordering::Relaxed);
        if ending == Ending::Idle {
            self.stats.incomplete.fetch_add(1, Ordering::Relaxed);
        }
        tracing::info!(file = %name, "trajectory written");
        Ok(())
    }
}
