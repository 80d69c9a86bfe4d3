//! The queue writer: the stage between the receiver and the correlation
//! stage when `queue.kind: disk`.
//!
//! ```text
//! receiver ──Ingested──► writer ──Ingested{lsn}──► correlation
//!    ▲  ack once `safe` fires  │ append (group commit)    │ Settle{markers, below}
//!    └─────────────────────────┘        ▲─────────────────┘
//! ```
//!
//! At start the writer replays every record still in the queue (the
//! correlation stage rebuilds the state a crash lost), then serves the receiver: it
//! takes every batch waiting (up to [`GROUP`]), appends them in one commit
//! (fsynced before the acknowledgement with `fsync_interval_ms: 0`, else at
//! most that long after), fires each batch's `safe` signal (the receiver
//! acknowledges it) and hands the batches on with their lsns. The ledger
//! sends back [`Settle`]: export markers and the watermark below which no
//! record is needed any more.
//!
//! Bounded: at `max_bytes` the writer stops reading new batches (the
//! receiver stops reading, the shims buffer) until a settle frees room.

use std::collections::HashSet;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use hermes_metrics::{MetricEncoder, StageMetrics};
use hermes_proto::wire::WireBatch;
use hermes_queue::{DiskQueue, QueueError, SpanKey};
use hermes_receiver::Ingested;
use prost::bytes::Bytes;
use tokio::sync::mpsc;

use crate::admin::{QueueLevel, QueueProbe};

/// Most batches appended in one commit.
const GROUP: usize = 64;
/// Records read per step of the replay.
const REPLAY_PAGE: usize = 64;

/// What the ledger tells the writer: markers of exported spans
/// `(last_lsn, keys)`, then delete every record below `below`.
#[derive(Debug, Default)]
pub struct Settle {
    pub exported: Vec<(u64, Vec<u8>)>,
    pub below: u64,
}

/// Gauges and counters of the persistent queue.
#[derive(Debug, Default)]
pub struct QueueStats {
    pub records: AtomicU64,
    pub bytes: AtomicU64,
    pub capacity_bytes: AtomicU64,
    pub appended_batches: AtomicU64,
    pub replayed_batches: AtomicU64,
    /// Records that could not be decoded at replay (skipped).
    pub corrupt_records: AtomicU64,
    /// Times the writer stopped reading because the queue was full.
    pub full: AtomicU64,
}

impl QueueStats {
    /// The queue's fill level in bytes, as the queue `persistent_bytes` of
    /// the channels' levels.
    pub fn fill_probe(stats: &Arc<Self>) -> QueueProbe {
        let stats = stats.clone();
        QueueProbe::new("persistent_bytes", move || {
            let read =
                |v: &AtomicU64| usize::try_from(v.load(Ordering::Relaxed)).unwrap_or(usize::MAX);
            QueueLevel {
                size: read(&stats.bytes),
                capacity: read(&stats.capacity_bytes),
            }
        })
    }
}

impl StageMetrics for QueueStats {
    fn encode(&self, m: &mut MetricEncoder<'_>) -> fmt::Result {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        m.gauge(
            "persistent_queue_records",
            "Event batches in the persistent queue (acknowledged, not yet settled).",
            load(&self.records),
        )?;
        for (name, help, value) in [
            (
                "persistent_queue_appended_batches",
                "Event batches written to the persistent queue.",
                &self.appended_batches,
            ),
            (
                "persistent_queue_replayed_batches",
                "Event batches replayed from the persistent queue at start.",
                &self.replayed_batches,
            ),
            (
                "persistent_queue_corrupt_records",
                "Records of the persistent queue that could not be decoded at replay (skipped).",
                &self.corrupt_records,
            ),
            (
                "persistent_queue_full",
                "Times the persistent queue reached queue.max_bytes and reading stopped.",
                &self.full,
            ),
        ] {
            m.counter(name, help, load(value))?;
        }
        Ok(())
    }
}

/// What a restart found in the queue, for the correlation stage.
#[derive(Debug, Default)]
pub struct Recovered {
    /// Spans a backend already has (export markers).
    pub exported: HashSet<SpanKey>,
    /// The last lsn replayed (0: nothing).
    pub replay_end: u64,
    /// Each shim instance's highest persisted seq: a batch resent after the
    /// restart with seqs up to it is a duplicate even when its records are
    /// gone.
    pub seqs: std::collections::HashMap<String, u64>,
}

/// The writer, opened before any port is bound.
pub struct Writer {
    queue: Arc<Mutex<DiskQueue>>,
    fsync_interval: Duration,
    max_bytes: u64,
    stats: Arc<QueueStats>,
}

impl Writer {
    /// Opens the queue in `dir` and reads what a restart must know.
    pub fn open(
        dir: &std::path::Path,
        max_bytes: u64,
        fsync_interval: Duration,
    ) -> Result<(Self, Recovered), QueueError> {
        let queue = DiskQueue::open(dir)?;
        let recovered = Recovered {
            exported: queue.exported()?,
            replay_end: queue.next_lsn().saturating_sub(1),
            seqs: queue.seqs()?,
        };
        let stats = Arc::new(QueueStats::default());
        stats.capacity_bytes.store(max_bytes, Ordering::Relaxed);
        let writer = Self {
            queue: Arc::new(Mutex::new(queue)),
            fsync_interval,
            max_bytes,
            stats,
        };
        writer.publish();
        Ok((writer, recovered))
    }

    pub fn stats(&self) -> Arc<QueueStats> {
        self.stats.clone()
    }

    /// Records held.
    pub fn records(&self) -> u64 {
        self.stats.records.load(Ordering::Relaxed)
    }

    fn publish(&self) {
        let queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        self.stats.records.store(queue.len(), Ordering::Relaxed);
        self.stats.bytes.store(queue.bytes(), Ordering::Relaxed);
    }

    /// Runs `f` on the queue on the blocking pool (redb commits fsync).
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut DiskQueue) -> Result<T, QueueError> + Send + 'static,
    ) -> Result<T, QueueError> {
        let queue = self.queue.clone();
        let result = tokio::task::spawn_blocking(move || {
            let mut queue = queue.lock().unwrap_or_else(PoisonError::into_inner);
            f(&mut queue)
        })
        .await
        .map_err(|e| QueueError::Task(e.to_string()))?;
        self.publish();
        result
    }

    /// Replays, then persists what the receiver sends until `ingest` closes,
    /// then applies settles until `settle` closes.
    pub async fn run(
        self,
        mut ingest: mpsc::Receiver<Ingested>,
        mut settle: mpsc::Receiver<Settle>,
        out: mpsc::Sender<Ingested>,
    ) {
        if let Err(e) = self.replay(&out).await {
            tracing::error!(error = %e, "persistent queue replay failed; the remaining records stay on disk for the next start");
        }
        let durable = self.fsync_interval.is_zero();
        let mut sync = tokio::time::interval(self.fsync_interval.max(Duration::from_millis(1)));
        sync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut dirty = false;
        let mut was_full = false;
        let mut out = Some(out);
        let mut settling = true;
        while out.is_some() || settling {
            let full = self.stats.bytes.load(Ordering::Relaxed) >= self.max_bytes;
            if full && !was_full {
                self.stats.full.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    max_bytes = self.max_bytes,
                    "persistent queue full: not reading new batches until exports settle records"
                );
            }
            was_full = full;
            let reading = out.is_some() && !full;
            tokio::select! {
                biased;
                next = settle.recv(), if settling => match next {
                    Some(s) => {
                        let now = unix_secs();
                        if let Err(e) = self.blocking(move |q| q.settle(&s.exported, s.below, now, durable)).await {
                            tracing::error!(error = %e, "persistent queue settle failed; records stay until the next one");
                        }
                        dirty |= !durable;
                    }
                    None => settling = false,
                },
                first = ingest.recv(), if reading => match first {
                    Some(first) => {
                        let mut group = vec![first];
                        while group.len() < GROUP {
                            match ingest.try_recv() {
                                Ok(more) => group.push(more),
                                Err(_) => break,
                            }
                        }
                        if let Some(sender) = &out
                            && !self.append(group, durable, sender).await
                        {
                            out = None;
                        }
                        dirty |= !durable;
                    }
                    // The receiver is gone: the correlation stage drains and settles.
                    None => out = None,
                },
                _ = sync.tick(), if dirty => {
                    if let Err(e) = self.blocking(DiskQueue::sync).await {
                        tracing::error!(error = %e, "persistent queue fsync failed");
                    }
                    dirty = false;
                }
                () = tokio::time::sleep(Duration::from_millis(50)), if full => {}
            }
        }
        if let Err(e) = self.blocking(DiskQueue::sync).await {
            tracing::error!(error = %e, "persistent queue fsync at shutdown failed");
        }
        tracing::debug!(records = self.records(), "queue writer stopped");
    }

    /// Appends a group in one commit, signals each batch safe, hands them
    /// on. False when the correlation stage is gone.
    async fn append(
        &self,
        group: Vec<Ingested>,
        durable: bool,
        out: &mpsc::Sender<Ingested>,
    ) -> bool {
        // Stored as they came (checked by the receiver), not re-encoded.
        let records: Vec<Bytes> = group.iter().map(|i| i.batch.bytes().clone()).collect();
        let mut seqs: Vec<(String, u64)> = Vec::new();
        for ingested in &group {
            let batch = &ingested.batch;
            if let (Some(shim), Some(last)) = (&batch.shim, batch.last_seq) {
                match seqs.iter_mut().find(|(id, _)| *id == shim.instance_id) {
                    Some((_, seq)) => *seq = (*seq).max(last),
                    None => seqs.push((shim.instance_id.clone(), last)),
                }
            }
        }
        let now = unix_secs();
        let first = match self
            .blocking(move |q| {
                let seqs: Vec<(&str, u64)> = seqs.iter().map(|(i, s)| (i.as_str(), *s)).collect();
                q.append(&records, &seqs, now, durable)
            })
            .await
        {
            Ok(first) => first,
            Err(e) => {
                // Dropping `safe` unfired ends the streams with UNAVAILABLE:
                // the shims keep the batches and resend them.
                tracing::error!(error = %e, batches = group.len(), "persistent queue write failed; the batches are not acknowledged");
                return true;
            }
        };
        self.stats
            .appended_batches
            .fetch_add(group.len() as u64, Ordering::Relaxed);
        for (lsn, mut ingested) in (first..).zip(group) {
            ingested.lsn = lsn;
            if let Some(safe) = ingested.safe.take() {
                let _ = safe.send(());
            }
            if out.send(ingested).await.is_err() {
                tracing::error!(
                    "the correlation stage is gone; persisted batches are replayed at the next start"
                );
                return false;
            }
        }
        true
    }

    /// Feeds every stored record to the correlation stage, oldest first. The first
    /// record of each shim instance raises the batch's `floor_seq` to its
    /// first seq: the records before it were settled (their spans exported),
    /// so the sequencer must not wait for them.
    async fn replay(&self, out: &mpsc::Sender<Ingested>) -> Result<(), QueueError> {
        let mut next = 0u64;
        let mut seen: HashSet<String> = HashSet::new();
        let mut replayed = 0u64;
        loop {
            let page = self
                .blocking(move |q| q.read_from(next, REPLAY_PAGE))
                .await?;
            let Some(&(last, _)) = page.last() else { break };
            next = last + 1;
            for (lsn, bytes) in page {
                let mut batch = match WireBatch::from_wire(Bytes::from(bytes)) {
                    Ok(batch) => batch,
                    Err(e) => {
                        self.stats.corrupt_records.fetch_add(1, Ordering::Relaxed);
                        tracing::error!(lsn, error = %e, "undecodable record in the persistent queue; skipped");
                        continue;
                    }
                };
                let instance = batch
                    .shim
                    .as_ref()
                    .map(|s| s.instance_id.clone())
                    .unwrap_or_default();
                if seen.insert(instance)
                    && let Some(first) = batch.first_seq
                {
                    batch.floor_seq = batch.floor_seq.max(first);
                }
                replayed += 1;
                self.stats.replayed_batches.fetch_add(1, Ordering::Relaxed);
                let ingested = Ingested {
                    batch,
                    lsn,
                    safe: None,
                    fleet: false,
                    fresh: false,
                    stream: 0,
                };
                if out.send(ingested).await.is_err() {
                    return Ok(());
                }
            }
        }
        if replayed > 0 {
            tracing::info!(batches = replayed, "replayed the persistent queue");
        }
        Ok(())
    }
}

fn unix_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
