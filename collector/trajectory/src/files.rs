//! The trajectory directory's files and how they are written.
//!
//! | file | holds |
//! |---|---|
//! | `<stem>.partial.jsonl` | a session in progress: its append-only record log ([`crate::journal`]), replayed into a [`Partial`] at start |
//! | `<stem>.json` | the session's trajectory, written when it ends |
//! | `<stem>.<n>.json` | the `n`-th segment (n ≥ 2) of a session resumed after its trajectory was written; the previous segment's `continued_trajectory_ref` names it |
//!
//! `<stem>` is the session id made safe for a file name ([`stem`]). Every
//! trajectory file (and a compacted record log) is written to a temporary name in the directory, synced, and
//! renamed over the target, and the directory synced after the rename, so
//! a reader (or a crash) sees the old file or the new one, never a part,
//! and a file reported written stays written.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::atif::Trajectory;
use crate::record::{AgentInfo, SpanRecord};

/// Longest stem kept from a session id (file names are at most 255 bytes).
const MAX_STEM: usize = 160;

/// A session in progress, as its record log replays.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Partial {
    pub session_id: String,
    pub agent: AgentInfo,
    /// 1 for `<stem>.json`, n ≥ 2 for `<stem>.<n>.json`.
    pub segment: u32,
    /// Wall-clock milliseconds of the last batch that touched the session.
    pub last_seen_ms: u64,
    /// Wall-clock milliseconds when its host said it ended, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_ms: Option<u64>,
    pub records: Vec<SpanRecord>,
}

/// `session_id` as a file name stem: ASCII letters, digits, `_` and `-`
/// kept, anything else `_`; when anything was replaced or cut, a hash of
/// the whole id is appended so two ids never share a stem.
pub fn stem(session_id: &str) -> String {
    let mut out: String = session_id
        .chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '_' | '-' => c,
            _ => '_',
        })
        .collect();
    let changed = out != session_id || out.len() > MAX_STEM || out.is_empty();
    if changed {
        out.truncate(MAX_STEM);
        out.push_str(&format!("-{:016x}", fnv1a(session_id.as_bytes())));
    }
    out
}

/// FNV-1a 64: a fixed hash, so a session id maps to the same file name in
/// every build and on every restart.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The file name of segment `segment` of `stem`.
pub fn segment_name(stem: &str, segment: u32) -> String {
    if segment <= 1 {
        format!("{stem}.json")
    } else {
        format!("{stem}.{segment}.json")
    }
}

/// The first segment of `stem` not yet written in `dir`.
pub fn next_segment(dir: &Path, stem: &str) -> u32 {
    let mut n = 1;
    while dir.join(segment_name(stem, n)).exists() {
        n += 1;
    }
    n
}

/// Writes `bytes` to `path` atomically and durably: a temporary file in
/// the same directory, synced, renamed over `path`, then the directory
/// synced, so that the rename (the new name's entry) survives a power
/// loss as the content does.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp"));
    let result = (|| {
        let mut file = File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)?;
        File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Writes a trajectory as pretty JSON, atomically.
pub fn write_trajectory(path: &Path, trajectory: &Trajectory) -> std::io::Result<()> {
    let mut bytes = serde_json::to_vec_pretty(trajectory).map_err(std::io::Error::other)?;
    bytes.push(b'\n');
    write_atomic(path, &bytes)
}

/// Sets `continued_trajectory_ref` of the trajectory at `path` to `next`
/// (a file name in the same directory). A missing or unreadable file is
/// left alone: the continuation is still written.
pub fn link_continuation(path: &Path, next: &str) -> std::io::Result<()> {
    let Ok(text) = std::fs::read(path) else {
        return Ok(());
    };
    let Ok(mut trajectory) = serde_json::from_slice::<Trajectory>(&text) else {
        return Ok(());
    };
    trajectory.continued_trajectory_ref = Some(next.to_owned());
    write_trajectory(path, &trajectory)
}

/// A partial file that could not be read: its path and why.
pub type Unreadable = (PathBuf, String);

/// The trajectory of `session_id` in `dir`, for reading: every written
/// segment in order, then the session in progress (its partial file, built
/// as it stands and marked incomplete). Empty when the directory has
/// nothing of the session.
pub fn read_session(dir: &Path, session_id: &str) -> Result<Vec<(String, Trajectory)>, String> {
    let key = stem(session_id);
    let mut out = Vec::new();
    let mut segment = 1;
    loop {
        let name = segment_name(&key, segment);
        let path = dir.join(&name);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
            Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
        };
        let t = serde_json::from_slice(&bytes)
            .map_err(|e| format!("{}: not an ATIF trajectory ({e})", path.display()))?;
        out.push((name, t));
        segment += 1;
    }
    let partial = crate::journal::log_path(dir, &key);
    match std::fs::read(&partial) {
        Ok(bytes) => {
            let (p, _) = crate::journal::replay(&bytes)
                .map_err(|e| format!("{}: not a session in progress ({e})", partial.display()))?;
            let mut t = crate::build::build(
                &p.session_id,
                &p.agent,
                &p.records,
                crate::build::Ending::Idle,
            );
            t.notes = Some("in progress: the session has not ended yet".to_owned());
            out.push((format!("{key}{}", crate::journal::LOG_SUFFIX), t));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("cannot read {}: {e}", partial.display())),
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn stems_are_safe_and_distinct() {
        assert_eq!(stem("20260101_120000_ab12cd"), "20260101_120000_ab12cd");
        let slash = stem("a/b");
        let underscore = stem("a_b");
        assert_ne!(slash, underscore);
        assert!(slash.starts_with("a_b-"), "{slash}");
        assert!(!stem("../x").contains('.'));
        assert!(!stem("").is_empty());
        assert!(stem(&"x".repeat(1000)).len() < 200);
    }

    #[test]
    fn segments_count_up_from_the_first_file() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(next_segment(dir.path(), "s"), 1);
        write_atomic(&dir.path().join(segment_name("s", 1)), b"{}").unwrap();
        assert_eq!(next_segment(dir.path(), "s"), 2);
        assert_eq!(segment_name("s", 2), "s.2.json");
    }

    #[test]
    fn an_atomic_write_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.json");
        write_atomic(&path, b"one").unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [std::ffi::OsString::from("a.json")]);
    }
}
