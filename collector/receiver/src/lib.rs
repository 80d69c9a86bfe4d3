//! The collector's ingest: the `hermes.collector.v1.EventIngest` gRPC service.
//!
//! Each shim holds one bidirectional stream. Every batch it sends is handed
//! to the pipeline through a bounded channel ([`Ingested`]); awaiting a place
//! in that channel is the backpressure: a slow pipeline stops this stream's
//! reads, and HTTP/2 flow control stops the shim. Only after the pipeline has
//! the batch is it acknowledged (the "in memory" delivery policy): the shim
//! keeps every unacknowledged batch and resends it after a reconnect.
//!
//! A closed pipeline channel (shutdown) ends the stream with `UNAVAILABLE`,
//! which the shim retries.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use hermes_proto::v1::event_ingest_server::{EventIngest, EventIngestServer};
use hermes_proto::v1::{Ack, EventBatch};
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

/// One batch as received, ready for the pipeline.
#[derive(Debug)]
pub struct Ingested {
    pub batch: EventBatch,
}

/// Limits of the ingest, enforced per message.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest encoded message accepted (tonic's `max_decoding_message_size`).
    pub max_message_bytes: usize,
    /// Most events in one batch.
    pub max_events_per_batch: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_message_bytes: 16 * 1024 * 1024,
            max_events_per_batch: 8192,
        }
    }
}

/// Counters of the ingest; all monotonic.
#[derive(Debug, Default)]
pub struct ReceiverStats {
    pub streams_opened: AtomicU64,
    pub batches_accepted: AtomicU64,
    pub events_accepted: AtomicU64,
    pub batches_refused: AtomicU64,
    /// Cumulative drops reported by shims (latest report of each stream summed
    /// as deltas).
    pub shim_dropped_events: AtomicU64,
}

/// The `EventIngest` service.
#[derive(Clone)]
pub struct Ingest {
    tx: mpsc::Sender<Ingested>,
    limits: Limits,
    stats: Arc<ReceiverStats>,
    shutdown: CancellationToken,
}

impl Ingest {
    /// Cancelling `shutdown` ends every open stream with `UNAVAILABLE` (the
    /// shims reconnect elsewhere or retry), so a graceful server shutdown does
    /// not wait on long-lived streams.
    pub fn new(
        tx: mpsc::Sender<Ingested>,
        limits: Limits,
        stats: Arc<ReceiverStats>,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            tx,
            limits,
            stats,
            shutdown,
        }
    }

    /// The tonic service, with the message size limit applied.
    pub fn into_server(self) -> EventIngestServer<Self> {
        let max = self.limits.max_message_bytes;
        EventIngestServer::new(self).max_decoding_message_size(max)
    }
}

type AckStream = Pin<Box<dyn Stream<Item = Result<Ack, Status>> + Send>>;

#[tonic::async_trait]
impl EventIngest for Ingest {
    type StreamStream = AckStream;

    async fn stream(
        &self,
        request: Request<Streaming<EventBatch>>,
    ) -> Result<Response<AckStream>, Status> {
        let mut inbound = request.into_inner();
        let (ack_tx, ack_rx) = mpsc::channel::<Result<Ack, Status>>(64);
        let this = self.clone();
        this.stats.streams_opened.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            let mut last_dropped = 0u64;
            loop {
                let next = tokio::select! {
                    next = inbound.message() => next,
                    () = this.shutdown.cancelled() => {
                        let _ = ack_tx.send(Err(Status::unavailable("collector is shutting down"))).await;
                        break;
                    }
                };
                let batch = match next {
                    Ok(Some(batch)) => batch,
                    Ok(None) => break,
                    Err(status) => {
                        tracing::debug!(%status, "ingest stream ended with an error");
                        break;
                    }
                };
                if let Err(status) = this.validate(&batch) {
                    this.stats.batches_refused.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%status, "refused an event batch");
                    let _ = ack_tx.send(Err(status)).await;
                    break;
                }
                if batch.dropped_events > last_dropped {
                    this.stats
                        .shim_dropped_events
                        .fetch_add(batch.dropped_events - last_dropped, Ordering::Relaxed);
                    last_dropped = batch.dropped_events;
                }
                let (Some(first), Some(last)) = (batch.events.first(), batch.events.last()) else {
                    continue;
                };
                let ack = Ack {
                    first_seq: first.seq,
                    last_seq: last.seq,
                };
                let events = batch.events.len() as u64;
                if this.tx.send(Ingested { batch }).await.is_err() {
                    let _ = ack_tx
                        .send(Err(Status::unavailable("collector is shutting down")))
                        .await;
                    break;
                }
                this.stats.batches_accepted.fetch_add(1, Ordering::Relaxed);
                this.stats
                    .events_accepted
                    .fetch_add(events, Ordering::Relaxed);
                if ack_tx.send(Ok(ack)).await.is_err() {
                    break;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(ack_rx))))
    }
}

impl Ingest {
    fn validate(&self, batch: &EventBatch) -> Result<(), Status> {
        let Some(shim) = &batch.shim else {
            return Err(Status::invalid_argument("event batch without shim info"));
        };
        if shim.instance_id.is_empty() {
            return Err(Status::invalid_argument(
                "event batch with an empty shim instance_id",
            ));
        }
        if batch.events.len() > self.limits.max_events_per_batch {
            return Err(Status::resource_exhausted(format!(
                "{} events in one batch, more than the limit of {}",
                batch.events.len(),
                self.limits.max_events_per_batch
            )));
        }
        if batch.events.windows(2).any(|w| w[0].seq >= w[1].seq) {
            return Err(Status::invalid_argument(
                "events of a batch must have strictly increasing seq",
            ));
        }
        Ok(())
    }
}
