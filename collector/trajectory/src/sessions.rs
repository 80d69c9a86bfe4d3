//! The sessions in progress and when each is written.
//!
//! Owns: merging each batch's records into its session (a span seen again,
//! after a replay or a retry, replaces the first copy), keeping every
//! session in progress on disk after every batch (its append-only record
//! log `<stem>.partial.jsonl`, see [`crate::journal`]), and writing a session's trajectory once its host
//! ended it ([`Sessions::end`], then [`END_GRACE_MS`] for its last spans to
//! come through the exporter stage's batch), or once it is idle for
//! `idle_ms`, marked incomplete. At most [`MAX_SESSIONS`] are held; past
//! it the least recently active is written as it is, marked incomplete.
//!
//! Durability: a batch counts as exported once the record logs it touched
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
    Partial, link_continuation, next_segment, segment_name, stem, write_trajectory,
};
use crate::journal::{self, Line, log_path};
use crate::logs::Finished;
use crate::record::records_of;

/// After its host ended a session, how long its last spans may take to
/// reach the sink (they left the correlation stage before the end did, and
/// wait in the exporter stage's batch, `batch.timeout_ms`).
pub const END_GRACE_MS: u64 = 2_000;

/// A session its host ended (`on_session_finalize`), as the correlation
/// stage reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionEnd {
    /// The shim instance (`service.instance.id`).
    pub instance_id: String,
    /// The session; empty: every session of the instance.
    pub session_id: String,
}

/// Whether `end` names the session `partial`.
fn names(end: &SessionEnd, partial: &Partial) -> bool {
    partial.agent.instance == end.instance_id
        && (end.session_id.is_empty() || partial.session_id == end.session_id)
}

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
    /// Lines of the record logs found at start that did not parse (a line
    /// torn by a crash mid-write), skipped.
    pub partial_lines_skipped: AtomicU64,
    /// Sessions in progress now (a gauge).
    pub in_progress: AtomicU64,
    /// Trajectories sent as OTLP log records (`otlp_logs`).
    pub log_records_sent: AtomicU64,
    /// Trajectories not sent as log records: the queue to the sender full,
    /// given up after the retries, refused by the backend, or still queued
    /// at shutdown. Their files are written.
    pub log_records_failed: AtomicU64,
    /// Session ends that did not fit the channel from the correlation
    /// stage ([`crate::sink::SessionEnds`]): those sessions are written at
    /// their idle time, marked incomplete.
    pub session_ends_lost: AtomicU64,
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
    /// Ends of sessions not held yet, with when they came: the end can
    /// overtake the session's spans, which wait in the exporter stage's
    /// batch. Kept for [`END_GRACE_MS`], at most [`MAX_EARLY_ENDS`].
    early_ends: Vec<(SessionEnd, u64)>,
    /// [`MAX_SESSIONS`], lower in tests.
    max_sessions: usize,
    /// Sessions whose record log must be rewritten whole before the next
    /// append (an append to it failed and may have left part of a line).
    stale: BTreeSet<String>,
    /// Where each written file goes to be sent as a log record
    /// ([`crate::logs`]), with `otlp_logs`.
    outbox: Option<tokio::sync::mpsc::Sender<Finished>>,
    stats: Arc<TrajectoryStats>,
}

/// The most sessions held in progress (memory and record logs); past it
/// the least recently active is written as incomplete.
pub const MAX_SESSIONS: usize = 10_000;

/// The most early ends kept (the oldest goes first).
const MAX_EARLY_ENDS: usize = 1024;

impl Sessions {
    /// The sessions of `dir`, those in progress replayed from their record
    /// logs. A log that no line opens is logged, counted and left for a
    /// person to look at; a line that does not parse (torn by a crash) is
    /// skipped and counted, and its log rewritten without it.
    pub fn open(dir: &Path, idle_ms: u64) -> std::io::Result<Self> {
        let stats = Arc::new(TrajectoryStats::default());
        let (loaded, bad) = journal::load(dir)?;
        for (path, error) in bad {
            tracing::warn!(path = %path.display(), %error, "trajectory in progress cannot be read; left in place");
            stats.unreadable_partials.fetch_add(1, Ordering::Relaxed);
        }
        let mut open = BTreeMap::new();
        let mut stale = BTreeSet::new();
        for (partial, path, skipped) in loaded {
            let key = stem(&partial.session_id);
            if skipped > 0 {
                tracing::warn!(path = %path.display(), lines = skipped, "lines of a trajectory in progress skipped (torn by a crash?)");
                stats
                    .partial_lines_skipped
                    .fetch_add(skipped, Ordering::Relaxed);
                if let Err(error) = journal::rewrite(&path, &partial) {
                    tracing::warn!(path = %path.display(), %error, "trajectory in progress not compacted; retried at its next batch");
                    stale.insert(key.clone());
                }
            }
            open.insert(key, partial);
        }
        stats
            .in_progress
            .store(open.len() as u64, Ordering::Relaxed);
        let mut sessions = Self {
            dir: dir.to_owned(),
            idle_ms,
            open,
            warned: BTreeSet::new(),
            early_ends: Vec::new(),
            max_sessions: MAX_SESSIONS,
            stale,
            outbox: None,
            stats,
        };
        sessions.bound()?;
        Ok(sessions)
    }

    /// As [`Sessions::open`], holding at most `max` sessions in progress.
    pub fn open_bounded(dir: &Path, idle_ms: u64, max: usize) -> std::io::Result<Self> {
        let mut sessions = Self::open(dir, idle_ms)?;
        sessions.max_sessions = max.max(1);
        sessions.bound()?;
        Ok(sessions)
    }

    /// Hands every trajectory written from now on to `outbox` (never
    /// waiting: a full channel counts the record as failed).
    pub fn send_to(&mut self, outbox: tokio::sync::mpsc::Sender<Finished>) {
        self.outbox = Some(outbox);
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

    /// Merges `batch` into its sessions and appends to the record log of
    /// each session it touched what the batch brought it. On an error the
    /// batch may be added again (a retry): its spans replace their first
    /// copies.
    pub fn add(&mut self, batch: &[ResourceSpans], now_ms: u64) -> std::io::Result<()> {
        let mut touched: BTreeMap<String, Vec<Line>> = BTreeMap::new();
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
            let lines = touched.entry(key.clone()).or_default();
            let partial = self.open.entry(key.clone()).or_insert_with(|| {
                let segment = next_segment(dir, &key);
                lines.push(Line::Open {
                    session_id: session.session_id.clone(),
                    agent: session.agent.clone(),
                    segment,
                });
                Partial {
                    session_id: session.session_id.clone(),
                    agent: session.agent.clone(),
                    segment,
                    last_seen_ms: now_ms,
                    ended_ms: None,
                    records: Vec::new(),
                }
            });
            partial.last_seen_ms = now_ms;
            if partial.ended_ms.is_none()
                && let Some((_, at)) = self.early_ends.iter().find(|(end, at)| {
                    names(end, partial) && at.saturating_add(END_GRACE_MS) > now_ms
                })
            {
                partial.ended_ms = Some(*at);
                lines.push(Line::Ended { at_ms: *at });
            }
            lines.push(Line::Batch {
                seen_ms: now_ms,
                records: session.records.clone(),
            });
            journal::merge(&mut partial.records, session.records);
        }
        self.stats
            .in_progress
            .store(self.open.len() as u64, Ordering::Relaxed);
        self.save(touched)?;
        self.bound()
    }

    /// Past [`MAX_SESSIONS`] in progress, writes the least recently active
    /// ones as they are, marked incomplete (counted as such).
    fn bound(&mut self) -> std::io::Result<()> {
        while self.open.len() > self.max_sessions {
            let Some(oldest) = self
                .open
                .iter()
                .min_by_key(|(_, p)| p.last_seen_ms)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            tracing::warn!(
                max = self.max_sessions,
                "too many trajectories in progress: the least recently active is written as incomplete"
            );
            self.finish(&oldest, Ending::Idle)?;
        }
        Ok(())
    }

    /// Appends `lines` to each session's record log, synced; a log whose
    /// earlier append failed is rewritten whole instead (what it missed is
    /// in memory). A failed append marks its log for that rewrite.
    fn save(&mut self, lines: BTreeMap<String, Vec<Line>>) -> std::io::Result<()> {
        for (key, lines) in lines {
            let Some(partial) = self.open.get(&key) else {
                continue;
            };
            let path = log_path(&self.dir, &key);
            let written = if self.stale.contains(&key) {
                journal::rewrite(&path, partial)
            } else {
                journal::append(&path, &lines)
            };
            match written {
                Ok(()) => {
                    self.stale.remove(&key);
                }
                Err(e) => {
                    self.stale.insert(key);
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Marks the sessions `end` names as ended at `now_ms` (kept in their
    /// record logs): they are written [`END_GRACE_MS`] later. An end of a
    /// session this sink does not hold is ignored.
    pub fn end(&mut self, end: &SessionEnd, now_ms: u64) -> std::io::Result<()> {
        let mut ended = BTreeMap::new();
        for (key, partial) in &mut self.open {
            if names(end, partial) && partial.ended_ms.is_none() {
                partial.ended_ms = Some(now_ms);
                ended.insert(key.clone(), vec![Line::Ended { at_ms: now_ms }]);
            }
        }
        self.early_ends
            .retain(|(_, at)| at.saturating_add(END_GRACE_MS) > now_ms);
        if ended.is_empty() || end.session_id.is_empty() {
            if self.early_ends.len() >= MAX_EARLY_ENDS {
                self.early_ends.remove(0);
            }
            self.early_ends.push((end.clone(), now_ms));
        }
        self.save(ended)
    }

    /// When a session in progress is written: its end plus the grace, or
    /// its last batch plus the idle time, whichever comes first.
    fn due_at(&self, partial: &Partial) -> u64 {
        let idle = partial.last_seen_ms.saturating_add(self.idle_ms);
        match partial.ended_ms {
            Some(ended) => idle.min(ended.saturating_add(END_GRACE_MS)),
            None => idle,
        }
    }

    /// When the first session in progress is due (wall-clock ms).
    pub fn next_due(&self) -> Option<u64> {
        self.open.values().map(|p| self.due_at(p)).min()
    }

    /// Writes the trajectory of every session due at `now_ms`: ended ones
    /// as complete, idle ones marked incomplete. Returns how many were
    /// written.
    pub fn write_due(&mut self, now_ms: u64) -> std::io::Result<usize> {
        let due: Vec<(String, Ending)> = self
            .open
            .iter()
            .filter(|(_, p)| self.due_at(p) <= now_ms)
            .map(|(k, p)| {
                let ending = match p.ended_ms {
                    Some(_) => Ending::Ended,
                    None => Ending::Idle,
                };
                (k.clone(), ending)
            })
            .collect();
        for (key, ending) in &due {
            self.finish(key, *ending)?;
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
        if let Some(outbox) = &self.outbox {
            let finished = Finished {
                session_id: partial.session_id.clone(),
                file: name.clone(),
                complete: ending == Ending::Ended,
                body: serde_json::to_string(&trajectory).map_err(std::io::Error::other)?,
                last_step_ns: partial.records.iter().map(|r| r.end_ns).max().unwrap_or(0),
                written_ns: now_ns(),
                resource: partial.agent.resource.clone(),
            };
            if outbox.try_send(finished).is_err() {
                self.stats
                    .log_records_failed
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(file = %name, "trajectory not sent as a log record: the sender is behind");
            }
        }
        if partial.segment > 1 {
            link_continuation(
                &self.dir.join(segment_name(key, partial.segment - 1)),
                &name,
            )?;
        }
        match std::fs::remove_file(log_path(&self.dir, key)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        self.open.remove(key);
        self.stale.remove(key);
        self.stats
            .in_progress
            .store(self.open.len() as u64, Ordering::Relaxed);
        self.stats.written.fetch_add(1, Ordering::Relaxed);
        if ending == Ending::Idle {
            self.stats.incomplete.fetch_add(1, Ordering::Relaxed);
        }
        tracing::info!(file = %name, "trajectory written");
        Ok(())
    }
}

/// Wall-clock Unix nanoseconds (the log record's observed time).
fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or_default()
}
