//! A session in progress on disk: its append-only record log
//! (`<stem>.partial.jsonl`).
//!
//! One JSON document per line, each line written whole with its newline
//! and synced before the batch counts as exported:
//!
//! | line | written |
//! |---|---|
//! | `{"open": {session_id, agent, segment}}` | first, when the sink first holds the session |
//! | `{"batch": {seen_ms, records}}` | for each batch that touched the session: that batch's records of it |
//! | `{"ended": {at_ms}}` | when its host ended it |
//!
//! Appending costs what the batch brought, not what the session holds.
//! Reading replays the lines in order (a span seen again replaces its
//! first copy, as in memory). A line that does not parse (the last one
//! torn by a crash mid-write, or any other) is skipped and counted; the
//! lines before and after it still count. A log with skipped lines is
//! rewritten compacted (`open`, one `batch` with every record, `ended`)
//! when it is loaded, so no later line is glued to a torn one; so is a
//! log whose append failed, before its next append. When the session is
//! written as a trajectory, the log is removed.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::files::{Partial, Unreadable, write_atomic};
use crate::record::{AgentInfo, SpanRecord};

/// Suffix of a session's record log.
pub const LOG_SUFFIX: &str = ".partial.jsonl";

/// One line of a record log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Line {
    /// The session the log is of.
    Open {
        session_id: String,
        agent: AgentInfo,
        segment: u32,
    },
    /// The records one batch brought, and when (wall-clock ms).
    Batch {
        seen_ms: u64,
        records: Vec<SpanRecord>,
    },
    /// Its host ended the session (wall-clock ms).
    Ended { at_ms: u64 },
}

/// The log of the session with stem `key` in `dir`.
pub fn log_path(dir: &Path, key: &str) -> PathBuf {
    dir.join(format!("{key}{LOG_SUFFIX}"))
}

/// Appends `lines` to the log at `path`, synced; a new log's directory
/// entry is synced too. On an error the log may end in a part of a line:
/// rewrite it ([`rewrite`]) before appending again.
pub fn append(path: &Path, lines: &[Line]) -> std::io::Result<()> {
    let mut bytes = Vec::new();
    for line in lines {
        serde_json::to_writer(&mut bytes, line).map_err(std::io::Error::other)?;
        bytes.push(b'\n');
    }
    let created = !path.exists();
    let mut file = OpenOptions::new().create(true).append(true).open(path)?;
    file.write_all(&bytes)?;
    file.sync_data()?;
    if created && let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// The lines that restore `partial`: its `open`, one `batch` with every
/// record, its `ended`.
pub fn compacted(partial: &Partial) -> Vec<Line> {
    let mut lines = vec![
        Line::Open {
            session_id: partial.session_id.clone(),
            agent: partial.agent.clone(),
            segment: partial.segment,
        },
        Line::Batch {
            seen_ms: partial.last_seen_ms,
            records: partial.records.clone(),
        },
    ];
    if let Some(at_ms) = partial.ended_ms {
        lines.push(Line::Ended { at_ms });
    }
    lines
}

/// Replaces the log at `path` with the compacted lines of `partial`,
/// atomically.
pub fn rewrite(path: &Path, partial: &Partial) -> std::io::Result<()> {
    let mut bytes = Vec::new();
    for line in compacted(partial) {
        serde_json::to_writer(&mut bytes, &line).map_err(std::io::Error::other)?;
        bytes.push(b'\n');
    }
    write_atomic(path, &bytes)
}

/// Merges `records` into `into`: a span already there is replaced.
pub fn merge(into: &mut Vec<SpanRecord>, records: impl IntoIterator<Item = SpanRecord>) {
    for record in records {
        match into.iter_mut().find(|r| r.span_id == record.span_id) {
            Some(same) => *same = record,
            None => into.push(record),
        }
    }
}

/// The session of the log `text`, and how many lines were skipped; an
/// error when no line opens it.
pub fn replay(text: &[u8]) -> Result<(Partial, u64), String> {
    let mut partial: Option<Partial> = None;
    let mut skipped = 0u64;
    for raw in text.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let Ok(line) = serde_json::from_slice::<Line>(raw) else {
            skipped += 1;
            continue;
        };
        match (line, partial.as_mut()) {
            (
                Line::Open {
                    session_id,
                    agent,
                    segment,
                },
                None,
            ) => {
                partial = Some(Partial {
                    session_id,
                    agent,
                    segment,
                    last_seen_ms: 0,
                    ended_ms: None,
                    records: Vec::new(),
                });
            }
            (Line::Batch { seen_ms, records }, Some(p)) => {
                p.last_seen_ms = p.last_seen_ms.max(seen_ms);
                merge(&mut p.records, records);
            }
            (Line::Ended { at_ms }, Some(p)) => {
                p.ended_ms.get_or_insert(at_ms);
            }
            // A second `open`, or a line before the first: not of this log.
            _ => skipped += 1,
        }
    }
    partial
        .map(|p| (p, skipped))
        .ok_or_else(|| "no line opens the session".to_owned())
}

/// A session log replayed: the session, its log, and the lines skipped.
pub type Replayed = (Partial, PathBuf, u64);

/// Every session log in `dir`, replayed, and the logs that could not be
/// read.
pub fn load(dir: &Path) -> std::io::Result<(Vec<Replayed>, Vec<Unreadable>)> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(LOG_SUFFIX))
        .collect();
    paths.sort();
    let mut loaded = Vec::new();
    let mut bad = Vec::new();
    for path in paths {
        match std::fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|bytes| replay(&bytes))
        {
            Ok((partial, skipped)) => loaded.push((partial, path, skipped)),
            Err(e) => bad.push((path, e)),
        }
    }
    Ok((loaded, bad))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::record::Kind;

    fn record(span: &str) -> SpanRecord {
        SpanRecord {
            kind: Kind::Chat,
            turn_id: "t".into(),
            own_session: "s".into(),
            span_id: span.into(),
            parent_span_id: String::new(),
            start_ns: 1,
            end_ns: 2,
            error: false,
            attrs: Default::default(),
        }
    }

    fn open() -> Line {
        Line::Open {
            session_id: "s".into(),
            agent: AgentInfo::default(),
            segment: 1,
        }
    }

    #[test]
    fn a_log_replays_its_batches_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = log_path(dir.path(), "s");
        append(&path, &[open()]).unwrap();
        for (at, span) in [(10, "a"), (20, "b"), (30, "a")] {
            let batch = Line::Batch {
                seen_ms: at,
                records: vec![record(span)],
            };
            append(&path, &[batch]).unwrap();
        }
        append(&path, &[Line::Ended { at_ms: 31 }]).unwrap();
        let (partial, skipped) = replay(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(skipped, 0);
        assert_eq!(partial.last_seen_ms, 30);
        assert_eq!(partial.ended_ms, Some(31));
        let spans: Vec<&str> = partial.records.iter().map(|r| r.span_id.as_str()).collect();
        assert_eq!(
            spans,
            ["a", "b"],
            "a span seen again replaces its first copy"
        );
        rewrite(&path, &partial).unwrap();
        let (again, _) = replay(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(again, partial, "the compacted log is the same session");
    }

    #[test]
    fn a_log_without_its_open_line_is_unreadable() {
        assert!(replay(b"{\"ended\":{\"at_ms\":1}}\n").is_err());
        assert!(replay(b"").is_err());
    }
}
