//! The bounded channels' fill levels on `/metrics`
//! (`hermes_collector_queue_size`/`_capacity{queue="…"}`), read at scrape
//! time through weak senders.

use std::fmt;
use std::sync::Arc;

use hermes_metrics::{Kind, MetricEncoder, StageMetrics};
use tokio::sync::mpsc;

/// Reads one bounded channel's occupancy at scrape time.
#[derive(Clone)]
pub struct QueueProbe {
    name: &'static str,
    read: Arc<dyn Fn() -> QueueLevel + Send + Sync>,
}

/// One reading of a [`QueueProbe`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLevel {
    /// Items waiting (or places reserved) in the channel.
    pub size: usize,
    /// The channel's capacity.
    pub capacity: usize,
}

impl QueueProbe {
    /// A probe from any reading function; `name` becomes the `queue` label.
    pub fn new(name: &'static str, read: impl Fn() -> QueueLevel + Send + Sync + 'static) -> Self {
        Self {
            name,
            read: Arc::new(read),
        }
    }

    /// A probe of a tokio channel through a weak sender: it never keeps the
    /// channel open. Once every sender is gone, the size reads 0.
    pub fn from_sender<T: Send + 'static>(name: &'static str, sender: &mpsc::Sender<T>) -> Self {
        let weak = sender.downgrade();
        let capacity = sender.max_capacity();
        Self::new(name, move || {
            let size = weak
                .upgrade()
                .map_or(0, |s| s.max_capacity().saturating_sub(s.capacity()));
            QueueLevel { size, capacity }
        })
    }

    /// The `queue` label.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Reads the channel now.
    pub fn read(&self) -> QueueLevel {
        (self.read)()
    }
}

impl fmt::Debug for QueueProbe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueueProbe")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// A gauge family of the probed channels: its name, its help and what it
/// reads of a channel's level.
type QueueGauge = (&'static str, &'static str, fn(&QueueLevel) -> usize);

/// Every probed channel, encoded as two families labelled `queue`.
#[derive(Debug)]
pub struct Queues(pub Vec<QueueProbe>);

impl StageMetrics for Queues {
    fn encode(&self, m: &mut MetricEncoder<'_>) -> fmt::Result {
        let levels: Vec<(&str, QueueLevel)> = self.0.iter().map(|q| (q.name(), q.read())).collect();
        let families: [QueueGauge; 2] = [
            ("queue_size", "Items waiting in a bounded channel.", |l| {
                l.size
            }),
            ("queue_capacity", "Capacity of a bounded channel.", |l| {
                l.capacity
            }),
        ];
        for (family, help, value) in families {
            let values = levels
                .iter()
                .map(|(name, level)| (*name, value(level) as u64));
            m.family(Kind::Gauge, (family, help, "queue"), values)?;
        }
        Ok(())
    }
}
