//! The collector's ingest: the `hermes.collector.v1.EventIngest` gRPC service.
//!
//! Each shim holds one bidirectional stream. Every batch it sends is handed
//! to the pipeline through a bounded channel ([`Ingested`]); awaiting a place
//! in that channel is the backpressure: a slow pipeline stops this stream's
//! reads, and HTTP/2 flow control stops the shim. A batch is acknowledged
//! once it is safe by the [`Delivery`] policy: once the pipeline has it
//! (`Memory`), or once the persistent queue has written it ([`Ingested::safe`]
//! fired, `Durable`; acks of one stream are sent in order, batches keep
//! flowing while earlier ones are written). The shim keeps every
//! unacknowledged batch and resends it after a reconnect.
//!
//! A closed pipeline channel (shutdown) ends the stream with `UNAVAILABLE`,
//! which the shim retries.
//!
//! Hostile input: with a [`BearerToken`] configured, a stream call without
//! the right `authorization: Bearer` metadata is answered `UNAUTHENTICATED`
//! before anything is read ([`auth`]). A message above
//! [`Limits::max_message_bytes`] ends its stream with `RESOURCE_EXHAUSTED`
//! as soon as its length prefix is read (its body is never buffered); a
//! malformed one with `INTERNAL`; a batch that breaks the rules of
//! [`validate`] (an event above [`Limits::max_event_bytes`], too many
//! events, no shim identity, seqs not increasing) with the status its
//! [`Refusal`] names; every other stream goes on. Refusals are
//! counted in [`ReceiverStats`] and logged at the 1st, 2nd, 4th, 8th, …
//! occurrence, so a flood cannot flood the logs. Each stream is paced by its
//! own token bucket ([`rate`]): past [`Limits::stream_events_per_sec`] and
//! its burst, the receiver delays reading that stream (counted in
//! [`ReceiverStats::throttled_batches`]); other streams are not slowed.
//!
//! The service listens on TCP or on a Unix domain socket ([`listener`]),
//! optionally with TLS, mutual when a client CA is given ([`tls`]).

pub mod auth;
pub mod conn;
pub mod fleet;
pub mod identity;
pub mod listener;
pub mod memory;
mod metrics;
pub mod rate;
pub mod tls;
pub mod validate;
pub mod versions;

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hermes_proto::server::event_ingest_server::{EventIngest, EventIngestServer};
use hermes_proto::v1::Ack;
use hermes_proto::wire::{RawBatch, WireBatch};
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::TlsConnectInfo;
use tonic::{Code, Request, Response, Status, Streaming};

pub use auth::{AuthFailure, BearerToken, TokenError};
pub use conn::{Conn, ConnectionLimits, GuardedIncoming};
pub use fleet::Settlements;
/// The largest `max_events_per_batch` a receiver can have: a batch of more
/// events is refused before its events are decoded.
pub use hermes_proto::wire::MAX_EVENTS as MAX_EVENTS_PER_BATCH;
pub use identity::{InstanceBindings, Principal};
pub use listener::{ListenAddr, Listener};
pub use memory::MemoryLimit;
pub use tls::{TlsError, TlsPem};
pub use validate::{Refusal, check_batch};
pub use versions::{UnknownShimVersions, WIRE_PACKAGE, WireGate};

/// One batch as received, ready for the pipeline.
#[derive(Debug)]
pub struct Ingested {
    /// Checked on the wire; its events are decoded by the stage that
    /// correlates them.
    pub batch: WireBatch,
    /// Position in the persistent queue (0: not persisted).
    pub lsn: u64,
    /// With [`Delivery::Durable`]: fired by the persistent queue once the
    /// batch is written; the receiver acknowledges it then. Dropping it
    /// unfired ends the stream with `UNAVAILABLE` (the shim resends).
    pub safe: Option<tokio::sync::oneshot::Sender<()>>,
    /// Came on a stream that announced fleet mode: its shim keeps the
    /// events until they are settled ([`fleet`]).
    pub fleet: bool,
    /// The first batch of a fleet stream. Such a shim sends every event
    /// it holds unsettled again on each new stream, so whatever this
    /// collector holds of the instance from an earlier stream (one that
    /// broke, or state replayed after a restart) is forgotten first and
    /// rebuilt from the resend: never mixed with it.
    pub fresh: bool,
    /// Which stream it came on: a number that grows with every stream the
    /// receiver opens (0: not a fleet stream). A handoff from a stream
    /// older than the instance's newest fresh one is stale.
    pub stream: u64,
}

impl Ingested {
    /// A batch that needs no acknowledgement handshake.
    pub fn new(batch: WireBatch) -> Self {
        Self {
            batch,
            lsn: 0,
            safe: None,
            fleet: false,
            fresh: false,
            stream: 0,
        }
    }
}

/// When a batch is acknowledged to its shim.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Delivery {
    /// Once the pipeline's bounded channel has it.
    #[default]
    Memory,
    /// Once the persistent queue signals [`Ingested::safe`].
    Durable,
}

/// Limits of the ingest, enforced per message and per stream.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest encoded message accepted (tonic's `max_decoding_message_size`).
    pub max_message_bytes: usize,
    /// Most events in one batch.
    pub max_events_per_batch: usize,
    /// Largest encoded event; a batch holding a larger one is refused.
    pub max_event_bytes: usize,
    /// Average events per second one stream may send ([`rate`]).
    pub stream_events_per_sec: u64,
    /// Events one stream may send at once above that rate.
    pub stream_burst_events: u64,
    /// Concurrent ingest streams on one connection (HTTP/2
    /// `SETTINGS_MAX_CONCURRENT_STREAMS`): one connection cannot multiply
    /// its rate limit by opening streams. A shim uses one, plus one per
    /// spool file it replays.
    pub max_streams_per_connection: u32,
    /// How often the collector pings each connection (HTTP/2 PING).
    pub keepalive_interval: Duration,
    /// How long a ping may go unanswered before the connection is closed: a
    /// shim whose host vanished, or a connection a NAT or load balancer
    /// dropped without a word, would otherwise hold its streams forever.
    pub keepalive_timeout: Duration,
    /// How many connections, and how long one may stay without an accepted
    /// stream ([`conn`]).
    pub connections: ConnectionLimits,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_message_bytes: 16 * 1024 * 1024,
            max_events_per_batch: 8192,
            max_event_bytes: 1024 * 1024,
            stream_events_per_sec: 20_000,
            stream_burst_events: 40_000,
            max_streams_per_connection: 8,
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(20),
            connections: ConnectionLimits::default(),
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
    /// Batches refused with `UNAVAILABLE` above the memory limit.
    pub memory_refusals: AtomicU64,
    /// Batches refused because one of their events was above
    /// [`Limits::max_event_bytes`] (also counted in `batches_refused`).
    pub oversized_events: AtomicU64,
    /// Batches whose stream had to wait for its rate limit before they were
    /// forwarded (the stream was not read meanwhile).
    pub throttled_batches: AtomicU64,
    /// Cumulative drops reported by shims (latest report of each stream summed
    /// as deltas).
    pub shim_dropped_events: AtomicU64,
    /// Ingest connections open now (a gauge).
    pub connections_open: AtomicU64,
    /// Connections closed at once because `max_connections` were open.
    pub connections_refused: AtomicU64,
    /// Connections closed for opening no accepted stream within the
    /// handshake timeout.
    pub connections_timed_out: AtomicU64,
    /// Connections closed after the idle timeout without a stream.
    pub connections_idle_closed: AtomicU64,
    /// Accept errors other than a connection's own (e.g. out of file
    /// descriptors).
    pub accept_errors: AtomicU64,
    /// Batches refused for naming a shim instance that another client
    /// identity already uses.
    pub foreign_instance_refusals: AtomicU64,
    /// Calls to a release of the wire protocol this collector cannot read
    /// ([`versions`]).
    pub unreadable_wire_calls: AtomicU64,
    /// Streams from shim versions this collector does not know, by version.
    pub unknown_shim_versions: UnknownShimVersions,
}

impl ReceiverStats {
    /// Counts one occurrence and tells whether to log it (the 1st, 2nd, 4th,
    /// 8th, … of its kind), so a flood cannot flood the logs.
    pub fn count(counter: &AtomicU64) -> (u64, bool) {
        let n = counter.fetch_add(1, Ordering::Relaxed) + 1;
        (n, n.is_power_of_two())
    }
}

/// The `EventIngest` service.
#[derive(Clone)]
pub struct Ingest {
    tx: mpsc::Sender<Ingested>,
    limits: Limits,
    stats: Arc<ReceiverStats>,
    shutdown: CancellationToken,
    token: Option<BearerToken>,
    delivery: Delivery,
    memory: Option<Arc<MemoryLimit>>,
    bindings: Arc<InstanceBindings>,
    settlements: Arc<Settlements>,
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
            delivery: Delivery::Memory,
            memory: None,
            bindings: Arc::default(),
            settlements: Arc::default(),
        }
    }

    /// Where the correlation stage publishes what is settled, and the
    /// drain asks fleet streams to leave ([`fleet`]).
    pub fn with_settlements(mut self, settlements: Arc<Settlements>) -> Self {
        self.settlements = settlements;
        self
    }

    /// Refuses batches with `UNAVAILABLE` while `limit` says the process is
    /// above its memory limit (read as batches arrive, see [`MemoryLimit`]).
    pub fn with_memory_limit(mut self, limit: Option<Arc<MemoryLimit>>) -> Self {
        self.memory = limit;
        self
    }

    /// Sets when batches are acknowledged (default [`Delivery::Memory`]).
    pub fn with_delivery(mut self, delivery: Delivery) -> Self {
        self.delivery = delivery;
        self
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
        let mut server = tonic::transport::Server::builder()
            .max_concurrent_streams(Some(self.limits.max_streams_per_connection))
            .http2_keepalive_interval(Some(self.limits.keepalive_interval))
            .http2_keepalive_timeout(Some(self.limits.keepalive_timeout));
        let limits = self.limits.connections;
        let stats = Arc::clone(&self.stats);
        let service = WireGate::new(self.into_server(), Arc::clone(&stats));
        if let Some(tls) = tls {
            server = server.tls_config(tls)?;
        }
        match listener {
            Listener::Tcp(listener) => {
                let incoming = GuardedIncoming::new(listener, limits, stats, shutdown.clone());
                server
                    .serve_with_incoming_shutdown(service, incoming, shutdown.cancelled_owned())
                    .await
            }
            Listener::Unix(listener, socket_file) => {
                let incoming = GuardedIncoming::new(listener, limits, stats, shutdown.clone());
                let served = server
                    .serve_with_incoming_shutdown(service, incoming, shutdown.cancelled_owned())
                    .await;
                drop(socket_file);
                served
            }
        }
    }
}

type AckStream = Pin<Box<dyn Stream<Item = Result<Ack, Status>> + Send>>;

#[tonic::async_trait]
impl EventIngest for Ingest {
    type StreamStream = AckStream;

    async fn stream(
        &self,
        request: Request<Streaming<RawBatch>>,
    ) -> Result<Response<AckStream>, Status> {
        if let Some(token) = &self.token
            && let Err(failure) = token.check(request.metadata())
        {
            let (n, log) = ReceiverStats::count(&self.stats.auth_failures);
            if log {
                tracing::warn!(
                    reason = failure.message(),
                    peer = ?request.extensions().get::<Conn>().and_then(Conn::remote),
                    auth_failures = n,
                    "refused an ingest stream (logged at the 1st, 2nd, 4th, ... refusal)"
                );
            }
            return Err(failure.status());
        }
        // Past the token check: the connection has done its handshake.
        let open = request.extensions().get::<Conn>().map(Conn::stream_opened);
        let principal = request
            .extensions()
            .get::<TlsConnectInfo<Conn>>()
            .and_then(TlsConnectInfo::peer_certs)
            .and_then(|certs| certs.first().map(|c| self.bindings.principal(c.as_ref())));
        let fleet = request
            .metadata()
            .get(fleet::FLEET_METADATA)
            .is_some_and(|v| v == "1");
        let mut inbound = request.into_inner();
        let (ack_tx, ack_rx) = mpsc::channel::<Result<Ack, Status>>(64);
        let this = self.clone();
        let stream = this.stats.streams_opened.fetch_add(1, Ordering::Relaxed) + 1;
        if fleet {
            this.settlements.stream_opened();
        }
        let durable_acks = match this.delivery {
            Delivery::Memory => None,
            Delivery::Durable => Some(spawn_acker(ack_tx.clone())),
        };
        tokio::spawn(async move {
            let _open = open;
            // The instance this stream's principal was last allowed.
            let mut claimed: Option<String> = None;
            let mut last_dropped = 0u64;
            let mut version_noted = false;
            let mut rate = rate::StreamRate::new(&this.limits, tokio::time::Instant::now());
            // A fleet stream's instance and its settled seq.
            let mut subscription: Option<(String, tokio::sync::watch::Receiver<u64>)> = None;
            let mut left = false;
            let mut handed_off = false;
            let mut fresh = fleet;
            loop {
                let next = tokio::select! {
                    next = inbound.message() => next,
                    () = this.shutdown.cancelled() => {
                        let _ = ack_tx.send(Err(Status::unavailable("collector is shutting down"))).await;
                        break;
                    }
                    settled_seq = settled(&mut subscription) => {
                        let ack = Ack { settled_seq, ..Ack::default() };
                        if ack_tx.send(Ok(ack)).await.is_err() {
                            break;
                        }
                        continue;
                    }
                    () = this.settlements.leaving().cancelled(), if fleet && !left => {
                        left = true;
                        let ack = Ack { leave: true, ..Ack::default() };
                        if ack_tx.send(Ok(ack)).await.is_err() {
                            break;
                        }
                        continue;
                    }
                };
                let raw = match next {
                    Ok(Some(raw)) => raw,
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
                // Paced and held to the memory limit by its event count,
                // and decoded only once the pipeline's queue has room for
                // it: a stream waiting for room holds the batch's bytes, not
                // the views of its events (several times their size).
                let events = match raw.events() {
                    Ok(events) => events,
                    Err(e) => {
                        this.refuse(Status::from(e), &ack_tx).await;
                        break;
                    }
                };
                if events > this.limits.max_events_per_batch {
                    let refusal = Refusal::TooManyEvents {
                        events,
                        limit: this.limits.max_events_per_batch,
                    };
                    this.refuse(refusal.status(), &ack_tx).await;
                    break;
                }
                if !this.pace(&mut rate, events, &ack_tx).await {
                    break;
                }
                if let Some(memory) = &this.memory
                    && memory.is_over()
                {
                    let (n, log) = ReceiverStats::count(&this.stats.memory_refusals);
                    if log {
                        tracing::warn!(
                            memory_refusals = n,
                            "refused a batch above the memory limit (logged at the 1st, 2nd, 4th, ... refusal)"
                        );
                    }
                    let _ = ack_tx
                        .send(Err(Status::unavailable(format!(
                            "the collector is above its memory limit of {} MiB; resend later",
                            memory.limit_bytes() / (1024 * 1024)
                        ))))
                        .await;
                    break;
                }
                let Ok(room) = this.tx.reserve().await else {
                    let _ = ack_tx
                        .send(Err(Status::unavailable("collector is shutting down")))
                        .await;
                    break;
                };
                let batch = match raw.decode() {
                    Ok(batch) => batch,
                    Err(e) => {
                        this.refuse(Status::from(e), &ack_tx).await;
                        break;
                    }
                };
                if let Err(status) = this.validate(&batch) {
                    this.refuse(status, &ack_tx).await;
                    break;
                }
                if let Some(principal) = principal
                    && let Err(status) = this.claim(&batch, principal, &mut claimed)
                {
                    let _ = ack_tx.send(Err(status)).await;
                    break;
                }
                if fleet && subscription.is_none() {
                    let instance = batch.shim.as_ref().map_or("", |s| s.instance_id.as_str());
                    let rx = this.settlements.subscribe(instance);
                    subscription = Some((instance.to_owned(), rx));
                }
                if !version_noted {
                    version_noted = true;
                    this.note_shim_version(&batch);
                }
                if batch.dropped_events > last_dropped {
                    this.stats
                        .shim_dropped_events
                        .fetch_add(batch.dropped_events - last_dropped, Ordering::Relaxed);
                    last_dropped = batch.dropped_events;
                }
                if batch.handoff {
                    // The shim moves to another replica: the stage forgets
                    // its open state; nothing to acknowledge.
                    this.settlements.handed_off();
                    handed_off = true;
                    let ingested = Ingested {
                        batch,
                        lsn: 0,
                        safe: None,
                        fleet,
                        fresh: std::mem::take(&mut fresh),
                        stream: if fleet { stream } else { 0 },
                    };
                    room.send(ingested);
                    continue;
                }
                let (Some(first_seq), Some(last_seq)) = (batch.first_seq, batch.last_seq) else {
                    continue;
                };
                let ack = Ack {
                    first_seq,
                    last_seq,
                    ..Ack::default()
                };
                let events = batch.events as u64;
                let (safe, written) = match durable_acks {
                    Some(_) => {
                        let (tx, rx) = tokio::sync::oneshot::channel();
                        (Some(tx), Some(rx))
                    }
                    None => (None, None),
                };
                let ingested = Ingested {
                    batch,
                    lsn: 0,
                    safe,
                    fleet,
                    fresh: std::mem::take(&mut fresh),
                    stream: if fleet { stream } else { 0 },
                };
                room.send(ingested);
                this.stats.batches_accepted.fetch_add(1, Ordering::Relaxed);
                this.stats
                    .events_accepted
                    .fetch_add(events, Ordering::Relaxed);
                let sent = match (&durable_acks, written) {
                    (Some(acker), Some(written)) => acker.send((written, ack)).await.is_ok(),
                    _ => ack_tx.send(Ok(ack)).await.is_ok(),
                };
                if !sent {
                    break;
                }
            }
            if fleet {
                let abandoned = !handed_off && !this.shutdown.is_cancelled();
                this.settlements.stream_closed(subscription, abandoned);
            }
        });
        let mut response: Response<AckStream> =
            Response::new(Box::pin(ReceiverStream::new(ack_rx)));
        response.metadata_mut().insert(
            fleet::SETTLES_HEADER,
            tonic::metadata::MetadataValue::from_static("1"),
        );
        Ok(response)
    }
}

/// The next settled seq of a fleet stream's instance; never, before the
/// stream's first batch named it (or for a stream not in fleet mode).
async fn settled(subscription: &mut Option<(String, tokio::sync::watch::Receiver<u64>)>) -> u64 {
    if let Some((_, rx)) = subscription
        && rx.changed().await.is_ok()
    {
        return *rx.borrow_and_update();
    }
    std::future::pending().await
}

/// Acknowledges the batches of one stream in order, each once the persistent
/// queue has written it; a batch whose write failed ends the stream with
/// `UNAVAILABLE` (the shim resends it). Bounded: at most 64 batches of one
/// stream wait for their write.
fn spawn_acker(
    ack_tx: mpsc::Sender<Result<Ack, Status>>,
) -> mpsc::Sender<(tokio::sync::oneshot::Receiver<()>, Ack)> {
    let (tx, mut rx) = mpsc::channel::<(tokio::sync::oneshot::Receiver<()>, Ack)>(64);
    tokio::spawn(async move {
        while let Some((written, ack)) = rx.recv().await {
            let reply = match written.await {
                Ok(()) => Ok(ack),
                Err(_) => Err(Status::unavailable(
                    "the collector could not persist the batch; resend it",
                )),
            };
            let failed = reply.is_err();
            if ack_tx.send(reply).await.is_err() || failed {
                break;
            }
        }
    });
    tx
}

impl Ingest {
    /// Counts and reports a refused batch, and ends the stream with `status`.
    async fn refuse(&self, status: Status, ack_tx: &mpsc::Sender<Result<Ack, Status>>) {
        let (n, log) = ReceiverStats::count(&self.stats.batches_refused);
        if log {
            tracing::warn!(
                %status,
                batches_refused = n,
                "refused an event batch (logged at the 1st, 2nd, 4th, ... refusal)"
            );
        }
        let _ = ack_tx.send(Err(status)).await;
    }

    /// Checks that `principal` may send under the batch's shim instance
    /// ([`identity`]); `claimed` caches the stream's last allowed instance.
    fn claim(
        &self,
        batch: &WireBatch,
        principal: Principal,
        claimed: &mut Option<String>,
    ) -> Result<(), Status> {
        let instance = batch.shim.as_ref().map_or("", |s| s.instance_id.as_str());
        if claimed.as_deref() == Some(instance) {
            return Ok(());
        }
        if self.bindings.claim(instance, principal) {
            *claimed = Some(instance.to_owned());
            return Ok(());
        }
        let (n, log) = ReceiverStats::count(&self.stats.foreign_instance_refusals);
        if log {
            tracing::warn!(
                foreign_instance_refusals = n,
                "refused a batch for a shim instance that another client certificate uses (logged at the 1st, 2nd, 4th, ... refusal)"
            );
        }
        Err(Status::permission_denied(
            "this shim instance id belongs to another client certificate",
        ))
    }

    /// Counts and logs a stream whose shim release this collector does not
    /// know ([`versions`]); its batches are accepted all the same.
    fn note_shim_version(&self, batch: &WireBatch) {
        let version = batch.shim.as_ref().map_or("", |s| s.shim_version.as_str());
        if versions::is_known_shim(version) {
            return;
        }
        let (label, n) = self.stats.unknown_shim_versions.count(version);
        if n.is_power_of_two() {
            tracing::warn!(
                shim_version = %label,
                collector_version = versions::COLLECTOR_VERSION,
                streams = n,
                "a shim of a release this collector does not know connected; its events are accepted \
                 (wire protocol hermes.collector.v1; README.md, Compatibility) \
                 (logged at the 1st, 2nd, 4th, ... stream of that version)"
            );
        }
    }

    /// [`check_batch`], counting an oversized event.
    fn validate(&self, received: &WireBatch) -> Result<(), Status> {
        check_batch(received, &self.limits).map_err(|refusal| {
            if matches!(refusal, Refusal::EventTooLarge { .. }) {
                self.stats.oversized_events.fetch_add(1, Ordering::Relaxed);
            }
            refusal.status()
        })
    }

    /// Applies the stream's rate limit to a batch of `events`: waits (not
    /// reading the stream) while its bucket is in debt. False when the
    /// collector shut down meanwhile (the stream then ends with
    /// `UNAVAILABLE`; the batch was neither forwarded nor acknowledged).
    async fn pace(
        &self,
        rate: &mut rate::StreamRate,
        events: usize,
        ack_tx: &mpsc::Sender<Result<Ack, Status>>,
    ) -> bool {
        let Some(wait) = rate.take(events as u64, tokio::time::Instant::now()) else {
            return true;
        };
        let (n, log) = ReceiverStats::count(&self.stats.throttled_batches);
        if log {
            tracing::info!(
                wait_ms = wait.as_millis() as u64,
                limit = self.limits.stream_events_per_sec,
                throttled_batches = n,
                "an ingest stream is over its rate limit; reading it slower (logged at the 1st, 2nd, 4th, ... time)"
            );
        }
        tokio::select! {
            () = tokio::time::sleep(wait) => true,
            () = self.shutdown.cancelled() => {
                let _ = ack_tx.send(Err(Status::unavailable("collector is shutting down"))).await;
                false
            }
        }
    }
}

#[cfg(test)]
mod tests;
