//! The collector's persistent queue: event batches on disk from the moment
//! they are acknowledged until every span they contribute to is exported.
//!
//! Storage is one [redb](https://www.redb.org) database file (`queue.redb`
//! in the configured directory): redb gives checksummed, copy-on-write
//! B-trees with atomic commits and recovery after a crash, so this crate
//! holds no file format of its own. Two tables:
//!
//! * `records`: log sequence number (`lsn`, 1, 2, 3, ... never reused) →
//!   one encoded `EventBatch`, appended in arrival order;
//! * `exported`: `(last_lsn, n)` → the span keys (trace id ‖ span id, 24
//!   bytes each) of one export message that every sink finished. After a
//!   crash the retained records are replayed, and these keys tell the
//!   pipeline which of the replayed spans a backend already has; a marker
//!   lives as long as any record it was made from (`last_lsn`);
//! * `seqs`: shim instance id → the highest seq it ever had persisted, and
//!   when (unix seconds). A shim that missed the acknowledgement of a batch
//!   (the collector was killed before it went out) resends it after the
//!   restart; when that batch's records are already gone (exported and
//!   deleted), this is what tells the sequencer it is a duplicate. Entries
//!   unused for [`SEQS_TTL_SECS`] are dropped.
//!
//! The owner decides what is safe to delete: [`DiskQueue::settle`] stores
//! markers and deletes every record below a watermark in one commit.
//! Durability per commit: `durable` commits are fsynced before they
//! return; the others become durable with the next durable commit or
//! [`DiskQueue::sync`] (the fsync interval policy).
//!
//! Bounded: [`DiskQueue::bytes`] counts the payload bytes held (records
//! and markers); the owner stops appending at its limit. The database file
//! reuses freed pages, so its size follows the high-water mark of the
//! contents.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};

const RECORDS: TableDefinition<u64, &[u8]> = TableDefinition::new("records");
const EXPORTED: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("exported");
/// `next_lsn` → the lsn the next record gets (lsns are never reused, even
/// after every record was deleted).
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const NEXT_LSN: &str = "next_lsn";
const SEQS: TableDefinition<&str, (u64, u64)> = TableDefinition::new("seqs");

/// How long an instance's highest persisted seq is remembered after its
/// last batch: far longer than a shim keeps unacknowledged batches.
pub const SEQS_TTL_SECS: u64 = 7 * 24 * 3600;

/// Bytes of one span key: trace id (16) and span id (8).
pub const SPAN_KEY_BYTES: usize = 24;

/// A span's identity as stored in export markers.
pub type SpanKey = [u8; SPAN_KEY_BYTES];

/// The database file inside the queue directory.
pub const FILE_NAME: &str = "queue.redb";

/// redb page cache: the queue is written once and read only at recovery.
const CACHE_BYTES: usize = 4 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("cannot create the queue directory {path}: {source}")]
    Dir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot open the persistent queue {path}: {source}")]
    Open { path: PathBuf, source: redb::Error },
    #[error("persistent queue I/O failed: {0}")]
    Storage(#[from] redb::Error),
    #[error("persistent queue task failed: {0}")]
    Task(String),
}

fn storage(e: impl Into<redb::Error>) -> QueueError {
    QueueError::Storage(e.into())
}

/// The persistent queue; see the module docs. Not `Sync`-shared: one owner
/// (the collector's queue writer) calls every method.
pub struct DiskQueue {
    db: Database,
    path: PathBuf,
    next_lsn: u64,
    next_marker: u64,
    bytes: u64,
    records: u64,
}

impl std::fmt::Debug for DiskQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskQueue")
            .field("path", &self.path)
            .field("next_lsn", &self.next_lsn)
            .field("records", &self.records)
            .field("bytes", &self.bytes)
            .finish_non_exhaustive()
    }
}

impl DiskQueue {
    /// Opens (creating if needed) the queue in `dir`. A database left by a
    /// crash is recovered to its last durable commit.
    pub fn open(dir: &Path) -> Result<Self, QueueError> {
        std::fs::create_dir_all(dir).map_err(|source| QueueError::Dir {
            path: dir.to_owned(),
            source,
        })?;
        let path = dir.join(FILE_NAME);
        let open_error = |source: redb::Error| QueueError::Open {
            path: path.clone(),
            source,
        };
        let db = Database::builder()
            .set_cache_size(CACHE_BYTES)
            .create(&path)
            .map_err(|e| open_error(e.into()))?;
        // Create both tables so that readers never meet a missing table.
        let txn = db.begin_write().map_err(|e| open_error(e.into()))?;
        {
            txn.open_table(RECORDS).map_err(|e| open_error(e.into()))?;
            txn.open_table(EXPORTED).map_err(|e| open_error(e.into()))?;
            txn.open_table(META).map_err(|e| open_error(e.into()))?;
            txn.open_table(SEQS).map_err(|e| open_error(e.into()))?;
        }
        txn.commit().map_err(|e| open_error(e.into()))?;
        let mut queue = Self {
            db,
            path,
            next_lsn: 1,
            next_marker: 0,
            bytes: 0,
            records: 0,
        };
        queue.scan()?;
        Ok(queue)
    }

    /// Reads the counters back from the tables.
    fn scan(&mut self) -> Result<(), QueueError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let records = txn.open_table(RECORDS).map_err(storage)?;
        let markers = txn.open_table(EXPORTED).map_err(storage)?;
        let (mut bytes, mut count) = (0u64, 0u64);
        for entry in records.iter().map_err(storage)? {
            let (_, value) = entry.map_err(storage)?;
            bytes += value.value().len() as u64;
            count += 1;
        }
        for entry in markers.iter().map_err(storage)? {
            let (key, value) = entry.map_err(storage)?;
            bytes += value.value().len() as u64;
            self.next_marker = self.next_marker.max(key.value().1 + 1);
        }
        let meta = txn.open_table(META).map_err(storage)?;
        if let Some(next) = meta.get(NEXT_LSN).map_err(storage)? {
            self.next_lsn = next.value().max(1);
        }
        self.bytes = bytes;
        self.records = count;
        Ok(())
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Payload bytes held (records and markers).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Records held.
    pub fn len(&self) -> u64 {
        self.records
    }

    /// True when no record is held.
    pub fn is_empty(&self) -> bool {
        self.records == 0
    }

    /// The lsn the next appended record gets.
    pub fn next_lsn(&self) -> u64 {
        self.next_lsn
    }

    /// The oldest record's lsn, if any.
    pub fn first_lsn(&self) -> Result<Option<u64>, QueueError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let table = txn.open_table(RECORDS).map_err(storage)?;
        Ok(table.first().map_err(storage)?.map(|(k, _)| k.value()))
    }

    /// Appends `records` in one commit and returns the lsn of the first
    /// (the others follow without gaps); `seqs` raises each instance's
    /// highest persisted seq, stamped `now_secs`. With `durable` the commit
    /// is fsynced before this returns.
    pub fn append<R: AsRef<[u8]>>(
        &mut self,
        records: &[R],
        seqs: &[(&str, u64)],
        now_secs: u64,
        durable: bool,
    ) -> Result<u64, QueueError> {
        let first = self.next_lsn;
        let mut txn = self.db.begin_write().map_err(storage)?;
        txn.set_durability(durability(durable)).map_err(storage)?;
        let mut added = 0u64;
        {
            let mut table = txn.open_table(RECORDS).map_err(storage)?;
            for (lsn, record) in (first..).zip(records) {
                let record = record.as_ref();
                table.insert(lsn, record).map_err(storage)?;
                added += record.len() as u64;
            }
            let mut meta = txn.open_table(META).map_err(storage)?;
            meta.insert(NEXT_LSN, first + records.len() as u64)
                .map_err(storage)?;
            let mut table = txn.open_table(SEQS).map_err(storage)?;
            for &(instance, seq) in seqs {
                let old = table
                    .get(instance)
                    .map_err(storage)?
                    .map_or(0, |v| v.value().0);
                table
                    .insert(instance, (old.max(seq), now_secs))
                    .map_err(storage)?;
            }
        }
        txn.commit().map_err(storage)?;
        self.next_lsn = first + records.len() as u64;
        self.records += records.len() as u64;
        self.bytes += added;
        Ok(first)
    }

    /// Up to `max` records from `from` on (inclusive), in lsn order.
    pub fn read_from(&self, from: u64, max: usize) -> Result<Vec<(u64, Vec<u8>)>, QueueError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let table = txn.open_table(RECORDS).map_err(storage)?;
        let mut out = Vec::new();
        for entry in table.range(from..).map_err(storage)?.take(max) {
            let (lsn, value) = entry.map_err(storage)?;
            out.push((lsn.value(), value.value().to_vec()));
        }
        Ok(out)
    }

    /// Each instance's highest persisted seq.
    pub fn seqs(&self) -> Result<std::collections::HashMap<String, u64>, QueueError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let table = txn.open_table(SEQS).map_err(storage)?;
        let mut seqs = std::collections::HashMap::new();
        for entry in table.iter().map_err(storage)? {
            let (instance, value) = entry.map_err(storage)?;
            seqs.insert(instance.value().to_owned(), value.value().0);
        }
        Ok(seqs)
    }

    /// Every span key of the stored export markers.
    pub fn exported(&self) -> Result<HashSet<SpanKey>, QueueError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let table = txn.open_table(EXPORTED).map_err(storage)?;
        let mut keys = HashSet::new();
        for entry in table.iter().map_err(storage)? {
            let (_, value) = entry.map_err(storage)?;
            for key in value.value().chunks_exact(SPAN_KEY_BYTES) {
                if let Ok(key) = SpanKey::try_from(key) {
                    keys.insert(key);
                }
            }
        }
        Ok(keys)
    }

    /// In one commit: stores an export marker per `(last_lsn, span keys)`
    /// of `exported` (keys concatenated, [`SPAN_KEY_BYTES`] each), then
    /// deletes every record below `below` and every marker whose `last_lsn`
    /// is below it.
    /// Instances whose last batch is older than [`SEQS_TTL_SECS`] at
    /// `now_secs` are forgotten in the same commit.
    pub fn settle(
        &mut self,
        exported: &[(u64, Vec<u8>)],
        below: u64,
        now_secs: u64,
        durable: bool,
    ) -> Result<(), QueueError> {
        let mut txn = self.db.begin_write().map_err(storage)?;
        txn.set_durability(durability(durable)).map_err(storage)?;
        let (mut added, mut freed, mut deleted) = (0u64, 0u64, 0u64);
        let mut next_marker = self.next_marker;
        {
            let mut markers = txn.open_table(EXPORTED).map_err(storage)?;
            for (last_lsn, keys) in exported
                .iter()
                .filter(|(l, k)| *l >= below && !k.is_empty())
            {
                markers
                    .insert((*last_lsn, next_marker), keys.as_slice())
                    .map_err(storage)?;
                next_marker += 1;
                added += keys.len() as u64;
            }
            markers
                .retain_in((0, 0)..(below, 0), |_, value| {
                    freed += value.len() as u64;
                    false
                })
                .map_err(storage)?;
            let mut records = txn.open_table(RECORDS).map_err(storage)?;
            records
                .retain_in(..below, |_, value| {
                    freed += value.len() as u64;
                    deleted += 1;
                    false
                })
                .map_err(storage)?;
            let mut seqs = txn.open_table(SEQS).map_err(storage)?;
            seqs.retain(|_, (_, at)| now_secs.saturating_sub(at) < SEQS_TTL_SECS)
                .map_err(storage)?;
        }
        txn.commit().map_err(storage)?;
        self.next_marker = next_marker;
        self.bytes = (self.bytes + added).saturating_sub(freed);
        self.records = self.records.saturating_sub(deleted);
        Ok(())
    }

    /// Makes every earlier commit durable (an empty durable commit).
    pub fn sync(&mut self) -> Result<(), QueueError> {
        let mut txn = self.db.begin_write().map_err(storage)?;
        txn.set_durability(Durability::Immediate).map_err(storage)?;
        txn.commit().map_err(storage)?;
        Ok(())
    }
}

fn durability(durable: bool) -> Durability {
    if durable {
        Durability::Immediate
    } else {
        Durability::None
    }
}

#[cfg(test)]
mod tests;
