//! The optional disk spool (`HERMES_COLLECTOR_SPOOL_DIR`).
//!
//! Owns: the spool file format, writing a file with what the sender could
//! not deliver before its process ends, claiming files left by earlier
//! processes, and replaying them to the collector, each on its own stream
//! under the instance id and seqs it was captured with.
//!
//! File format (`<wall-ns>-<instance>-<pid>.spool`): the magic `HCSPOOL1`,
//! then records `[u32 LE length][u64 LE xxh3-64 of the payload][payload]`,
//! each payload one encoded `EventBatch` (in ascending seq order).
//!
//! Invariants:
//! - A spool file appears only complete: it is written under a temporary
//!   name (`.tmp-…`, never read), then renamed. It is not fsynced (the exit
//!   path must stay short and predictable on a busy disk): after a power
//!   loss of the agent's host a file may be cut or empty, which the checksums
//!   detect (see below).
//! - The spool directory holds at most `max_bytes` of spool and temporary
//!   files: a new file gets the room that is left, keeps the newest batches
//!   that fit and counts the events of the others as dropped (their count is
//!   added to `EventBatch.dropped_events` of the batches kept). Files are
//!   never truncated or appended to.
//! - A file is replayed by at most one process at a time (an exclusive
//!   `flock` held from the claim to the deletion; a crashed claimer's lock
//!   goes with its process) and deleted only once every batch in it was
//!   acknowledged (or refused as invalid by the collector, counted as lost).
//! - A record whose checksum or length is wrong ends the file: the records
//!   before it are replayed, the rest is counted as lost. A file whose magic
//!   is wrong is renamed `*.bad` and left alone.
//! - Nothing here runs on a hook thread: writing happens on the sender
//!   thread (asked by the exit path, which waits a bounded time), replay is
//!   a task on the sender's runtime.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use hermes_proto::v1::EventBatch;
use prost::Message;
use tokio::sync::mpsc::error::TrySendError;

use super::SenderShared;
use super::backoff::Backoff;
use super::conn::{Conn, ConnError, ConnEvent, ConnOptions, Target};
use super::unacked::UnackedBuffer;

/// Name suffix of a complete spool file.
pub const SPOOL_SUFFIX: &str = ".spool";
/// Name prefix of a spool file being written.
const TMP_PREFIX: &str = ".tmp-";
/// Suffix given to a file that is not a spool file after all.
const BAD_SUFFIX: &str = ".bad";
/// First bytes of every spool file (format version 1).
const MAGIC: &[u8; 8] = b"HCSPOOL1";
/// Length and checksum before each record.
const RECORD_HEADER: usize = 12;
/// Largest record accepted when reading (a sanity bound on the length).
const MAX_RECORD: usize = 256 << 20;
/// Bytes a batch may grow by when its `dropped_events` is raised (varint).
const DROPPED_SLACK: usize = 10;
/// A temporary file this old belongs to a writer that died mid-write.
const STALE_TMP: Duration = Duration::from_secs(600);
/// How often a running sender looks for spool files left by other processes.
pub const RESCAN: Duration = Duration::from_secs(30);
/// Retry interval for writing to a full outbound channel.
const FEED_RETRY: Duration = Duration::from_millis(10);

/// Where and how much to spool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpoolConfig {
    /// The spool directory (created, mode 0700, on first write).
    pub dir: PathBuf,
    /// Most bytes of spool files in `dir`, all writers together.
    pub max_bytes: u64,
}

/// What [`write`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Written {
    /// The file written, if anything fit.
    pub path: Option<PathBuf>,
    /// Events written.
    pub events: u64,
    /// Events that did not fit.
    pub dropped_events: u64,
}

/// Merges consecutive batches (contiguous seq ranges of one instance) into
/// batches of at most `max_events` events, so a replay arrives in few
/// messages.
fn coalesce(batches: Vec<EventBatch>, max_events: usize) -> Vec<EventBatch> {
    let max_events = max_events.max(1);
    let mut out: Vec<EventBatch> = Vec::with_capacity(batches.len());
    for batch in batches {
        if batch.events.is_empty() {
            continue;
        }
        if let Some(last) = out.last_mut() {
            let same_shim = last.shim == batch.shim;
            let ascending = match (last.events.last(), batch.events.first()) {
                (Some(a), Some(b)) => a.seq < b.seq,
                _ => false,
            };
            if same_shim && ascending && last.events.len() + batch.events.len() <= max_events {
                last.dropped_events = last.dropped_events.max(batch.dropped_events);
                last.events.extend(batch.events);
                continue;
            }
        }
        out.push(batch);
    }
    out
}

/// Bytes of spool and temporary files in `dir` (0 if it does not exist).
pub fn usage(dir: &Path) -> u64 {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.ends_with(SPOOL_SUFFIX) || name.starts_with(TMP_PREFIX)
        })
        .filter_map(|e| e.metadata().ok())
        .filter(fs::Metadata::is_file)
        .map(|m| m.len())
        .sum()
}

fn wall_nanos() -> u128 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// Writes `batches` (one instance's, oldest first) to a new spool file in
/// `config.dir`, merged into batches of at most `max_batch_events` events,
/// keeping the newest that fit in the room the directory has left.
pub fn write(
    config: &SpoolConfig,
    instance_id: &str,
    batches: Vec<EventBatch>,
    max_batch_events: usize,
) -> io::Result<Written> {
    let mut batches = coalesce(batches, max_batch_events);
    let total: u64 = batches.iter().map(|b| b.events.len() as u64).sum();
    if total == 0 {
        return Ok(Written::default());
    }
    let room = config.max_bytes.saturating_sub(usage(&config.dir));
    // The newest batches that fit, with the magic.
    let mut size = MAGIC.len() as u64;
    let mut keep_from = batches.len();
    for (index, batch) in batches.iter().enumerate().rev() {
        let record = (RECORD_HEADER + batch.encoded_len() + DROPPED_SLACK) as u64;
        if size + record > room {
            break;
        }
        size += record;
        keep_from = index;
    }
    let kept = batches.split_off(keep_from);
    let dropped: u64 = batches.iter().map(|b| b.events.len() as u64).sum();
    if kept.is_empty() {
        return Ok(Written {
            path: None,
            events: 0,
            dropped_events: dropped,
        });
    }
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&config.dir)?;
    let safe_id: String = instance_id
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(64)
        .collect();
    let name = format!(
        "{:020}-{safe_id}-{}{SPOOL_SUFFIX}",
        wall_nanos(),
        std::process::id()
    );
    let path = config.dir.join(&name);
    let tmp = config.dir.join(format!("{TMP_PREFIX}{name}"));
    let written = write_file(&tmp, &kept, dropped).and_then(|()| fs::rename(&tmp, &path));
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(Written {
        path: Some(path),
        events: total - dropped,
        dropped_events: dropped,
    })
}

fn write_file(tmp: &Path, batches: &[EventBatch], dropped: u64) -> io::Result<()> {
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(tmp)?;
    let mut out = BufWriter::with_capacity(1 << 16, file);
    out.write_all(MAGIC)?;
    for batch in batches {
        let mut batch = batch.clone();
        batch.dropped_events += dropped;
        let payload = batch.encode_to_vec();
        let len = u32::try_from(payload.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "batch too large"))?;
        out.write_all(&len.to_le_bytes())?;
        out.write_all(&xxhash_rust::xxh3::xxh3_64(&payload).to_le_bytes())?;
        out.write_all(&payload)?;
    }
    out.flush()
}

/// What a spool file held.
#[derive(Debug, Default, PartialEq)]
pub struct Parsed {
    /// The intact records, in file order.
    pub batches: Vec<EventBatch>,
    /// A record was damaged or cut: it and what follows are lost.
    pub damaged: bool,
}

/// Parses a spool file's bytes; None if it is not a spool file.
pub fn parse(bytes: &[u8]) -> Option<Parsed> {
    let mut rest = bytes.strip_prefix(MAGIC.as_slice())?;
    let mut parsed = Parsed::default();
    while !rest.is_empty() {
        let Some((header, body)) = rest.split_at_checked(RECORD_HEADER) else {
            parsed.damaged = true;
            break;
        };
        let mut len = [0u8; 4];
        let mut sum = [0u8; 8];
        len.copy_from_slice(&header[..4]);
        sum.copy_from_slice(&header[4..]);
        let len = u32::from_le_bytes(len) as usize;
        let Some((payload, next)) = body.split_at_checked(len).filter(|_| len <= MAX_RECORD) else {
            parsed.damaged = true;
            break;
        };
        if xxhash_rust::xxh3::xxh3_64(payload) != u64::from_le_bytes(sum) {
            parsed.damaged = true;
            break;
        }
        match EventBatch::decode(payload) {
            Ok(batch) => parsed.batches.push(batch),
            Err(_) => {
                parsed.damaged = true;
                break;
            }
        }
        rest = next;
    }
    Some(parsed)
}

/// A spool file this process holds the lock of.
#[derive(Debug)]
pub struct Claimed {
    /// Its path.
    pub path: PathBuf,
    /// Its intact batches.
    pub batches: Vec<EventBatch>,
    /// Some record was damaged: the batches after it are lost.
    pub damaged: bool,
    /// Holds the lock until dropped.
    _lock: File,
}

impl Claimed {
    /// Deletes the file (still under the lock), then releases the lock.
    pub fn remove(self) -> io::Result<()> {
        fs::remove_file(&self.path)
    }

    /// Events held.
    pub fn events(&self) -> u64 {
        self.batches.iter().map(|b| b.events.len() as u64).sum()
    }
}

/// Claims every spool file in `dir` that no other process is replaying,
/// oldest first; removes temporary files of writers that died mid-write.
pub fn claim_all(dir: &Path) -> Vec<Claimed> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut names: Vec<String> = Vec::new();
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(TMP_PREFIX) {
            let stale = entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > STALE_TMP);
            if stale {
                let _ = fs::remove_file(entry.path());
            }
        } else if name.ends_with(SPOOL_SUFFIX) && !name.starts_with('.') {
            names.push(name);
        }
    }
    names.sort();
    names
        .into_iter()
        .filter_map(|name| claim(&dir.join(name)))
        .collect()
}

/// Locks and reads one spool file; None if someone else holds it, it is
/// gone, or it is not a spool file (then it is renamed `*.bad`).
fn claim(path: &Path) -> Option<Claimed> {
    let mut file = File::open(path).ok()?;
    rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive).ok()?;
    // The file may have been replayed and deleted (or replaced) between
    // the listing and the lock.
    let held = file.metadata().ok()?;
    let current = fs::metadata(path).ok()?;
    if (held.dev(), held.ino()) != (current.dev(), current.ino()) {
        return None;
    }
    let mut bytes = Vec::with_capacity(usize::try_from(held.len()).unwrap_or(0));
    file.read_to_end(&mut bytes).ok()?;
    let Some(parsed) = parse(&bytes) else {
        let mut bad = path.as_os_str().to_owned();
        bad.push(BAD_SUFFIX);
        let _ = fs::rename(path, bad);
        return None;
    };
    Some(Claimed {
        path: path.to_path_buf(),
        batches: parsed.batches,
        damaged: parsed.damaged,
        _lock: file,
    })
}

/// Settings of a replay.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    /// The collector.
    pub target: Target,
    /// Connection options.
    pub conn: ConnOptions,
    /// First reconnect delay.
    pub backoff_min: Duration,
    /// Largest reconnect delay.
    pub backoff_max: Duration,
}

/// Replays the spool files of `dir` (those found at start, then every
/// [`RESCAN`]) until the task is dropped. `replay_busy` of `shared` is set
/// while claimed files are not done.
pub async fn replay_dir(dir: PathBuf, options: ReplayOptions, shared: Arc<SenderShared>) {
    loop {
        let claimed = claim_all(&dir);
        if !claimed.is_empty() {
            shared.replay_busy.store(true, Ordering::Release);
        }
        for file in claimed {
            if file.damaged {
                shared.set_error(&format_args!(
                    "spool: {} is damaged; its intact records are replayed",
                    file.path.display()
                ));
            }
            replay_file(&file.batches, &options, &shared).await;
            shared.replayed_files.fetch_add(1, Ordering::AcqRel);
            if let Err(e) = file.remove() {
                shared.set_error(&format_args!("spool: cannot delete a replayed file: {e}"));
            }
        }
        shared.replay_busy.store(false, Ordering::Release);
        tokio::time::sleep(RESCAN).await;
    }
}

/// Sends `batches` on streams of their own until every one is acknowledged
/// (or refused as invalid: dropped and counted).
async fn replay_file(batches: &[EventBatch], options: &ReplayOptions, shared: &SenderShared) {
    let mut pending = UnackedBuffer::new(usize::MAX, usize::MAX);
    for batch in batches {
        pending.push(batch.clone());
    }
    let mut backoff = Backoff::new(options.backoff_min, options.backoff_max);
    while !pending.is_empty() {
        let mut conn = Conn::open(options.target.clone(), &options.conn);
        pending.mark_all_unsent();
        let end = loop {
            let floor_seq = pending.floor_seq();
            while let Some(batch) = pending.next_unsent() {
                let mut batch = batch.clone();
                batch.floor_seq = floor_seq;
                match conn.out.try_send(batch) {
                    Ok(()) => pending.mark_next_sent(),
                    Err(TrySendError::Full(_) | TrySendError::Closed(_)) => break,
                }
            }
            tokio::select! {
                biased;
                event = conn.events.recv() => match event {
                    Some(ConnEvent::Connected) => {}
                    Some(ConnEvent::Ack(ack)) => {
                        let acked = pending.ack(ack.first_seq, ack.last_seq);
                        shared.replayed_events.fetch_add(acked, Ordering::AcqRel);
                        backoff.reset();
                        if pending.is_empty() {
                            break None;
                        }
                    }
                    Some(ConnEvent::Closed(error)) => break Some(error),
                    None => break Some(ConnError::Ended),
                },
                () = tokio::time::sleep(FEED_RETRY), if pending.has_unsent() => {}
            }
        };
        drop(conn);
        let Some(error) = end else {
            break;
        };
        // The protocol's permanent refusals: the oldest batch in flight is
        // what the collector refused; drop it so the rest can go.
        if let ConnError::Status(status) = &error
            && matches!(
                status.code(),
                tonic::Code::InvalidArgument | tonic::Code::ResourceExhausted
            )
        {
            let lost = pending.drop_oldest();
            shared.replay_lost_events.fetch_add(lost, Ordering::AcqRel);
        }
        shared.set_error(&format_args!("spool replay: {error}"));
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hermes_proto::v1::{Event, ShimInfo};

    fn shim(id: &str) -> Option<ShimInfo> {
        Some(ShimInfo {
            instance_id: id.into(),
            ..Default::default()
        })
    }

    fn batch(id: &str, seqs: std::ops::RangeInclusive<u64>) -> EventBatch {
        EventBatch {
            shim: shim(id),
            events: seqs
                .map(|seq| Event {
                    seq,
                    hook: "pre_tool_call".into(),
                    thread: "MainThread".into(),
                    ..Default::default()
                })
                .collect(),
            dropped_events: 3,
            floor_seq: 0,
            ..Default::default()
        }
    }

    fn config(dir: &Path, max_bytes: u64) -> SpoolConfig {
        SpoolConfig {
            dir: dir.join("spool"),
            max_bytes,
        }
    }

    fn seqs(batches: &[EventBatch]) -> Vec<u64> {
        batches
            .iter()
            .flat_map(|b| b.events.iter().map(|e| e.seq))
            .collect()
    }

    #[test]
    fn write_claim_remove_round_trip() {
        let tmp = tempfile::tempdir().unwrap();
        let config = config(tmp.path(), 1 << 20);
        let batches = vec![batch("a1", 5..=7), batch("a1", 8..=8), batch("a1", 9..=12)];
        let written = write(&config, "a1", batches, 4).unwrap();
        assert_eq!((written.events, written.dropped_events), (8, 0));
        let path = written.path.unwrap();
        assert!(path.to_string_lossy().ends_with(SPOOL_SUFFIX));
        let mode = fs::metadata(&config.dir).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700);
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        assert_eq!(usage(&config.dir), fs::metadata(&path).unwrap().len());

        let claimed = claim_all(&config.dir);
        assert_eq!(claimed.len(), 1);
        let file = &claimed[0];
        assert!(!file.damaged);
        assert_eq!(seqs(&file.batches), (5..=12).collect::<Vec<_>>());
        // Merged up to 4 events per batch: 5..=8, 9..=12.
        assert_eq!(file.batches.len(), 2);
        assert!(file.batches.iter().all(|b| b.shim == shim("a1")));
        assert_eq!(file.events(), 8);
        // Locked: nobody else claims it meanwhile.
        assert!(claim_all(&config.dir).is_empty());
        claimed.into_iter().for_each(|c| c.remove().unwrap());
        assert!(claim_all(&config.dir).is_empty());
        assert_eq!(usage(&config.dir), 0);
    }

    #[test]
    fn a_released_claim_can_be_claimed_again() {
        let tmp = tempfile::tempdir().unwrap();
        let config = config(tmp.path(), 1 << 20);
        write(&config, "a1", vec![batch("a1", 1..=2)], 512).unwrap();
        let first = claim_all(&config.dir);
        assert_eq!(first.len(), 1);
        drop(first);
        assert_eq!(claim_all(&config.dir).len(), 1);
    }

    #[test]
    fn bounded_by_max_bytes_keeping_the_newest() {
        let tmp = tempfile::tempdir().unwrap();
        let one = (RECORD_HEADER + batch("a1", 1..=10).encoded_len() + DROPPED_SLACK) as u64;
        // Room for the magic and two batches of ten events.
        let config = config(tmp.path(), MAGIC.len() as u64 + 2 * one + 4);
        let batches = vec![
            batch("a1", 1..=10),
            batch("a1", 11..=20),
            batch("a1", 21..=30),
        ];
        let written = write(&config, "a1", batches, 10).unwrap();
        assert_eq!((written.events, written.dropped_events), (20, 10));
        assert!(usage(&config.dir) <= config.max_bytes);
        let claimed = claim_all(&config.dir);
        assert_eq!(seqs(&claimed[0].batches), (11..=30).collect::<Vec<_>>());
        // The drop travels with the batches: 3 before, 10 by the spool.
        assert!(claimed[0].batches.iter().all(|b| b.dropped_events == 13));
        drop(claimed);
        // The directory is full: the next writer keeps nothing.
        let written = write(&config, "b2", vec![batch("b2", 1..=10)], 10).unwrap();
        assert_eq!(
            written,
            Written {
                path: None,
                events: 0,
                dropped_events: 10
            }
        );
        assert_eq!(claim_all(&config.dir).len(), 1);
    }

    #[test]
    fn damaged_records_end_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        let config = config(tmp.path(), 1 << 20);
        let batches = vec![batch("a1", 1..=2), batch("a1", 3..=4), batch("a1", 5..=6)];
        let path = write(&config, "a1", batches, 2).unwrap().path.unwrap();
        let bytes = fs::read(&path).unwrap();
        let parsed = parse(&bytes).unwrap();
        assert!(!parsed.damaged);
        assert_eq!(parsed.batches.len(), 3);
        // A flipped byte in the second record's payload.
        let first = RECORD_HEADER + parsed.batches[0].encoded_len();
        let mut flipped = bytes.clone();
        flipped[MAGIC.len() + first + RECORD_HEADER + 3] ^= 0x40;
        let parsed = parse(&flipped).unwrap();
        assert!(parsed.damaged);
        assert_eq!(seqs(&parsed.batches), [1, 2]);
        // A cut file.
        let parsed = parse(&bytes[..bytes.len() - 1]).unwrap();
        assert!(parsed.damaged);
        assert_eq!(seqs(&parsed.batches), [1, 2, 3, 4]);
        // Not a spool file at all: set aside as .bad.
        assert_eq!(parse(b"HELLO WORLD"), None);
        fs::write(&path, b"HELLO WORLD").unwrap();
        assert!(claim_all(&config.dir).is_empty());
        let names: Vec<String> = fs::read_dir(&config.dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 1);
        assert!(names[0].ends_with(".spool.bad"), "{names:?}");
    }

    #[test]
    fn temporary_files_are_never_claimed() {
        let tmp = tempfile::tempdir().unwrap();
        let config = config(tmp.path(), 1 << 20);
        fs::create_dir_all(&config.dir).unwrap();
        fs::write(config.dir.join(".tmp-1-a-2.spool"), MAGIC).unwrap();
        assert!(claim_all(&config.dir).is_empty());
        assert_eq!(usage(&config.dir), MAGIC.len() as u64);
        // Nothing to write: no file.
        assert_eq!(
            write(&config, "a1", Vec::new(), 512).unwrap(),
            Written::default()
        );
    }
}
