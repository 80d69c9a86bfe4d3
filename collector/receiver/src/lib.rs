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
//!
//! Hostile input: with a [`BearerToken`] configured, a stream call without
//! the right `authorization: Bearer` metadata is answered `UNAUTHENTICATED`
//! before anything is read ([`auth`]). A message above
//! [`Limits::max_message_bytes`] ends its stream with `RESOURCE_EXHAUSTED`
//! as soon as its length prefix is read (its body is never buffered); a
//! malformed one with `INTERNAL`; every other stream goes on. Refusals are
//! counted in [`ReceiverStats`] and logged at the 1st, 2nd, 4th, 8th, …
//! occurrence, so a flood cannot flood the logs.
//!
//! The service listens on TCP or on a Unix domain socket ([`listener`]),
//! optionally with TLS, mutual when a client CA is given ([`tls`]).

pub mod auth;
pub mod listener;
pub mod tls;

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use hermes_proto::v1::event_ingest_server::{EventIngest, EventIngestServer};
use hermes_proto::v1::{Ack, EventBatch};
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Request, Response, Status, Streaming};

pub use auth::{AuthFailure, BearerToken, TokenError};
pub use listener::{ListenAddr, Listener};
pub use tls::{TlsError, TlsPem};

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
    /// Batches refused: invalid, malformed, or over the limits.
    pub batches_refused: AtomicU64,
    /// Stream calls refused for a missing or wrong bearer token.
    pub auth_failures: AtomicU64,
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
    token: Option<BearerToken>,
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
            token: None,
        }
    }

    /// Requires every stream call to present `token` (`authorization:
    /// Bearer <token>`); None accepts every call.
    pub fn with_token(mut self, token: Option<BearerToken>) -> Self {
        self.token = token;
        self
    }

    /// The tonic service, with the message size limit applied.
    pub fn into_server(self) -> EventIngestServer<Self> {
        let max = self.limits.max_message_bytes;
        EventIngestServer::new(self).max_decoding_message_size(max)
    }

    /// Serves the service on `listener`, with `tls` if given, until
    /// `shutdown` is cancelled; a Unix socket's file is removed when this
    /// returns. A client that fails the TLS handshake loses its connection
    /// only.
    pub async fn serve(
        self,
        listener: Listener,
        tls: Option<tonic::transport::ServerTlsConfig>,
        shutdown: CancellationToken,
    ) -> Result<(), tonic::transport::Error> {
        let service = self.into_server();
        let mut server = tonic::transport::Server::builder();
        if let Some(tls) = tls {
            server = server.tls_config(tls)?;
        }
        match listener {
            Listener::Tcp(listener) => {
                let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
                server
                    .serve_with_incoming_shutdown(service, incoming, shutdown.cancelled_owned())
                    .await
            }
            Listener::Unix(listener, socket_file) => {
                let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
                let served = server
                    .serve_with_incoming_shutdown(service, incoming, shutdown.cancelled_owned())
                    .await;
                drop(socket_file);
                served
            }
        }
    }

    /// Counts a refusal and tells whether to log it (the 1st, 2nd, 4th, 8th,
    /// … of its kind).
    fn count(counter: &AtomicU64) -> (u64, bool) {
        let n = counter.fetch_add(1, Ordering::Relaxed) + 1;
        (n, n.is_power_of_two())
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
        if let Some(token) = &self.token
            && let Err(failure) = token.check(request.metadata())
        {
            let (n, log) = Self::count(&self.stats.auth_failures);
            if log {
                tracing::warn!(
                    reason = failure.message(),
                    peer = ?request.remote_addr(),
                    auth_failures = n,
                    "refused an ingest stream (logged at the 1st, 2nd, 4th, ... refusal)"
                );
            }
            return Err(failure.status());
        }
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
                        let status = match status.code() {
                            // tonic reports a message over the size limit
                            // as OUT_OF_RANGE; the protocol says RESOURCE_EXHAUSTED.
                            Code::OutOfRange | Code::ResourceExhausted => {
                                Status::resource_exhausted(status.message().to_owned())
                            }
                            // Malformed message (a decoding error).
                            Code::Internal => status,
                            // The shim went away, or the transport failed.
                            _ => {
                                tracing::debug!(%status, "ingest stream ended with an error");
                                break;
                            }
                        };
                        this.refuse(status, &ack_tx).await;
                        break;
                    }
                };
                if let Err(status) = this.validate(&batch) {
                    this.refuse(status, &ack_tx).await;
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
    /// Counts and reports a refused batch, and ends the stream with `status`.
    async fn refuse(&self, status: Status, ack_tx: &mpsc::Sender<Result<Ack, Status>>) {
        let (n, log) = Self::count(&self.stats.batches_refused);
        if log {
            tracing::warn!(
                %status,
                batches_refused = n,
                "refused an event batch (logged at the 1st, 2nd, 4th, ... refusal)"
            );
        }
        let _ = ack_tx.send(Err(status)).await;
    }

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

#[cfg(test)]
mod tests;
