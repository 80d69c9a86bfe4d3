//! One gRPC stream to the collector.
//!
//! Owns: a task that connects (TCP, or a Unix socket for `unix:/path`
//! endpoints), opens `EventIngest/Stream` with the bearer token if one is
//! configured, forwards the batches written to [`Conn::out`] and reports acks
//! and the end of the stream as [`ConnEvent`]s.
//!
//! In fleet mode ([`fleet_target`]) the stream call announces it
//! (`hermes-fleet: 1`) and [`ConnEvent::Connected`] says whether the
//! collector settles (response header `hermes-settles: 1`).
//!
//! Invariants: the task never outlives its [`Conn`] (dropping the handle
//! aborts it and closes the request stream), except when ended with
//! [`Conn::finish`]: then it writes its last batch, closes the request
//! stream and lives at most [`FINISH_GRACE`] longer, reporting to no one;
//! it reports [`ConnEvent::Closed`] at most once and as its last event; it
//! never logs. The token travels as a sensitive header (never indexed by
//! HPACK, redacted in `Debug`).

use std::net::SocketAddr;
use std::time::Duration;

use hermes_proto::v1::event_ingest_client::EventIngestClient;
use hermes_proto::v1::{Ack, EventBatch};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use super::fleet::FleetName;
use crate::config::CollectorEndpoint;

/// How long a stream ended by [`Conn::finish`] may still take to deliver
/// its last batches, a move's `handoff` among them. They wait behind what
/// the collector has not read yet: a replica whose ingest is backed up
/// reads them only once it caught up, seconds later under load. A handoff
/// that does not get through leaves that replica an agent gone without
/// handing off, whose open turns it closes as incomplete at the TTL or at
/// its drain, while the next replica exports them whole.
pub const FINISH_GRACE: Duration = Duration::from_secs(30);
/// Request metadata of a shim in fleet mode.
pub const FLEET_HEADER: &str = "hermes-fleet";
/// Response header of a collector that sends `settled_seq`.
pub const SETTLES_HEADER: &str = "hermes-settles";

/// Why a stream could not be opened or ended.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    /// TCP connect or HTTP/2 handshake failed.
    #[error("connect: {0}")]
    Connect(#[source] tonic::transport::Error),
    /// The collector refused or ended the stream with a status
    /// (`stream: Unauthenticated: invalid bearer token`).
    #[error("stream: {:?}: {}", .0.code(), .0.message())]
    Status(#[source] tonic::Status),
    /// The collector does not read this shim's wire protocol: it answered
    /// the stream call `UNIMPLEMENTED` (a collector of another major
    /// protocol release says which one it reads in the message).
    #[error(
        "the collector does not read this shim's wire protocol {} ({:?}: {}): use a collector release that accepts hermes-collector-shim {} (README.md, Compatibility)",
        hermes_proto::WIRE_PACKAGE,
        .0.code(),
        .0.message(),
        crate::SHIM_VERSION
    )]
    WireProtocol(#[source] tonic::Status),
    /// The collector closed the stream without a status.
    #[error("stream closed by the collector")]
    Ended,
}

/// What the connection task reports.
#[derive(Debug)]
pub enum ConnEvent {
    /// The collector answered the stream call; `settles`: with the
    /// response header `hermes-settles: 1`.
    Connected {
        /// Whether the collector sends `settled_seq` (fleet mode only).
        settles: bool,
    },
    /// An acknowledgement.
    Ack(Ack),
    /// The stream is over (last event).
    Closed(ConnError),
}

/// Handle on a connection task.
#[derive(Debug)]
pub struct Conn {
    /// Batches to write to the stream, in order.
    pub out: mpsc::Sender<EventBatch>,
    /// Events of the connection.
    pub events: mpsc::UnboundedReceiver<ConnEvent>,
    /// The task; taken by [`Conn::finish`].
    task: Option<JoinHandle<()>>,
    /// Starts the task's [`FINISH_GRACE`].
    finish: Option<oneshot::Sender<()>>,
    /// Set by [`Conn::finish`]: the task ends on its own.
    detach: bool,
}

impl Drop for Conn {
    fn drop(&mut self) {
        if !self.detach {
            if let Some(task) = &self.task {
                task.abort();
            }
        } else if let Some(finish) = self.finish.take() {
            let _ = finish.send(());
        }
    }
}

/// Connection options.
#[derive(Debug, Clone)]
pub struct ConnOptions {
    /// TCP connect timeout.
    pub connect_timeout: Duration,
    /// HTTP/2 keepalive ping interval.
    pub keepalive_interval: Duration,
    /// How long a keepalive ping may go unanswered.
    pub keepalive_timeout: Duration,
    /// Capacity of the outbound batch channel.
    pub out_capacity: usize,
}

impl Default for ConnOptions {
    fn default() -> Self {
        ConnOptions {
            connect_timeout: Duration::from_secs(2),
            keepalive_interval: Duration::from_secs(20),
            keepalive_timeout: Duration::from_secs(10),
            out_capacity: 64,
        }
    }
}

/// Why an endpoint cannot be used at all.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// The address is not a valid URI.
    #[error("endpoint: {0}")]
    Endpoint(#[source] tonic::transport::Error),
    /// The token cannot travel in a header (never shown).
    #[error("the bearer token cannot be sent as a header")]
    Token,
    /// An `https://` endpoint without a CA to check the collector against.
    #[error("an https:// endpoint needs HERMES_COLLECTOR_TLS_CA_FILE")]
    NoCa,
    /// The TLS material is not usable.
    #[error("TLS: {0}")]
    Tls(#[source] tonic::transport::Error),
    /// A fleet endpoint's name cannot be a request authority.
    #[error("the fleet endpoint's name cannot be a request authority")]
    Authority,
    /// A malformed `dns:///` endpoint.
    #[error("endpoint: {0}")]
    FleetName(&'static str),
}

/// Where to connect, and the credentials of the stream call.
#[derive(Debug, Clone)]
pub struct Target {
    endpoint: Endpoint,
    authorization: Option<MetadataValue<Ascii>>,
    /// Announce fleet mode on the stream call.
    fleet: bool,
}

/// Builds the target for `endpoint`: `http://host:port`, `https://host:port`
/// (TLS, checked against the configured CA, with the client certificate if
/// any), or `unix:/path` (tonic connects to the socket; the request's
/// authority is a placeholder).
pub fn target(endpoint: &CollectorEndpoint, options: &ConnOptions) -> Result<Target, TargetError> {
    let tls = endpoint.url.starts_with("https://");
    build(endpoint, options, &endpoint.url, tls, None)
}

/// The target of one replica of a fleet endpoint (`dns:///NAME:PORT`):
/// connects to `addr`, with `NAME:PORT` as the request's authority and
/// `NAME` as the TLS server name; TLS when a CA is configured. Announces
/// fleet mode on the stream call.
pub fn fleet_target(
    endpoint: &CollectorEndpoint,
    options: &ConnOptions,
    name: &FleetName,
    addr: SocketAddr,
) -> Result<Target, TargetError> {
    let tls = endpoint.tls.is_some();
    let scheme = if tls { "https" } else { "http" };
    let url = format!("{scheme}://{addr}");
    let mut target = build(endpoint, options, &url, tls, Some(&name.host))?;
    let origin = format!("{scheme}://{}:{}", name.host, name.port)
        .parse()
        .map_err(|_| TargetError::Authority)?;
    target.endpoint = target.endpoint.origin(origin);
    target.fleet = true;
    Ok(target)
}

fn build(
    endpoint: &CollectorEndpoint,
    options: &ConnOptions,
    url: &str,
    tls: bool,
    server_name: Option<&str>,
) -> Result<Target, TargetError> {
    let authorization = match &endpoint.token {
        Some(token) => {
            let mut value = MetadataValue::try_from(format!("Bearer {}", token.expose()))
                .map_err(|_| TargetError::Token)?;
            value.set_sensitive(true);
            Some(value)
        }
        None => None,
    };
    let mut target = Endpoint::from_shared(url.to_owned())
        .map_err(TargetError::Endpoint)?
        .connect_timeout(options.connect_timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(options.keepalive_interval)
        .keep_alive_timeout(options.keepalive_timeout)
        .keep_alive_while_idle(true);
    if tls {
        let tls = endpoint.tls.as_ref().ok_or(TargetError::NoCa)?;
        let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&tls.ca_pem));
        if let Some((cert, key)) = &tls.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        if let Some(name) = server_name {
            config = config.domain_name(name);
        }
        target = target.tls_config(config).map_err(TargetError::Tls)?;
    }
    Ok(Target {
        endpoint: target,
        authorization,
        fleet: false,
    })
}

impl Conn {
    /// Starts connecting on the current runtime.
    pub fn open(target: Target, options: &ConnOptions) -> Conn {
        let (out, out_rx) = mpsc::channel(options.out_capacity.max(1));
        let (events_tx, events) = mpsc::unbounded_channel();
        let (finish, finished) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let grace = async {
                // Dropped without a word: the handle is gone, and the
                // task aborted with it.
                if finished.await.is_ok() {
                    tokio::time::sleep(FINISH_GRACE).await;
                } else {
                    std::future::pending::<()>().await;
                }
            };
            let end = tokio::select! {
                end = drive(target, out_rx, &events_tx) => end,
                () = grace => ConnError::Ended,
            };
            let _ = events_tx.send(ConnEvent::Closed(end));
        });
        Conn {
            out,
            events,
            task: Some(task),
            finish: Some(finish),
            detach: false,
        }
    }

    /// Ends the stream after the batches written so far and `last`: the
    /// request stream closes once they are out, and the task ends when
    /// the collector closes its side, or after [`FINISH_GRACE`]. Its
    /// events are no longer read. Returns the task, for the sender to know
    /// when the stream's last batches are out.
    pub fn finish(mut self, last: Option<EventBatch>) -> Option<JoinHandle<()>> {
        let out = self.out.clone();
        if let Some(last) = last {
            // Behind the batches already queued; the task's own channel
            // bounds how long this waits.
            tokio::spawn(async move {
                let _ = tokio::time::timeout(FINISH_GRACE, out.send(last)).await;
            });
        }
        // Dropped now: starts the grace instead of aborting.
        self.detach = true;
        self.task.take()
    }
}

async fn drive(
    target: Target,
    out_rx: mpsc::Receiver<EventBatch>,
    events: &mpsc::UnboundedSender<ConnEvent>,
) -> ConnError {
    let channel = match target.endpoint.connect().await {
        Ok(channel) => channel,
        Err(e) => return ConnError::Connect(e),
    };
    let mut client = EventIngestClient::new(channel);
    let mut request = tonic::Request::new(ReceiverStream::new(out_rx));
    if let Some(authorization) = target.authorization {
        request
            .metadata_mut()
            .insert("authorization", authorization);
    }
    if target.fleet {
        request
            .metadata_mut()
            .insert(FLEET_HEADER, MetadataValue::from_static("1"));
    }
    let response = match client.stream(request).await {
        Ok(response) => response,
        Err(status) if status.code() == tonic::Code::Unimplemented => {
            return ConnError::WireProtocol(status);
        }
        Err(status) => return ConnError::Status(status),
    };
    let settles = target.fleet
        && response
            .metadata()
            .get(SETTLES_HEADER)
            .is_some_and(|v| v == "1");
    let _ = events.send(ConnEvent::Connected { settles });
    let mut acks = response.into_inner();
    loop {
        match acks.message().await {
            Ok(Some(ack)) => {
                // No reader: the stream was finished ([`Conn::finish`]); it
                // is read on until the collector ends it (after the last
                // batch is out) or the grace ends.
                let _ = events.send(ConnEvent::Ack(ack));
            }
            Ok(None) => return ConnError::Ended,
            Err(status) => return ConnError::Status(status),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use hermes_proto::server::event_ingest_server::{EventIngest, EventIngestServer};
    use hermes_proto::v1::{Event, ShimInfo};
    use hermes_proto::wire::RawBatch;
    use tokio_stream::Stream;
    use tonic::{Request, Response, Status, Streaming};

    use super::*;
    use crate::config::Token;

    const WAIT: Duration = Duration::from_secs(10);

    /// Accepts only `Bearer right-token`; acks every batch. With
    /// `other_protocol`, answers every call as a collector of another wire
    /// protocol release does.
    #[derive(Clone, Default)]
    struct TokenIngest {
        calls: Arc<AtomicUsize>,
        other_protocol: bool,
    }

    #[tonic::async_trait]
    impl EventIngest for TokenIngest {
        type StreamStream = Pin<Box<dyn Stream<Item = Result<Ack, Status>> + Send + 'static>>;

        async fn stream(
            &self,
            request: Request<Streaming<RawBatch>>,
        ) -> Result<Response<Self::StreamStream>, Status> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if self.other_protocol {
                return Err(Status::unimplemented(
                    "hermes-collector 9.0.0 reads the wire protocol hermes.collector.v2 only",
                ));
            }
            let authorization = request.metadata().get("authorization");
            if authorization.is_none_or(|v| v != "Bearer right-token") {
                return Err(Status::unauthenticated("invalid bearer token"));
            }
            let mut inbound = request.into_inner();
            let (tx, rx) = mpsc::channel(8);
            tokio::spawn(async move {
                while let Ok(Some(Ok(batch))) =
                    inbound.message().await.map(|m| m.map(|w| w.to_batch()))
                {
                    let seq = batch.events.first().map_or(0, |e| e.seq);
                    let ack = Ack {
                        first_seq: seq,
                        last_seq: seq,
                        ..Ack::default()
                    };
                    if tx.send(Ok(ack)).await.is_err() {
                        return;
                    }
                }
            });
            Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
        }
    }

    fn serve_tcp(service: TokenIngest) -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let _ = tonic::transport::Server::builder()
                .serve_with_incoming(
                    EventIngestServer::new(service),
                    tokio_stream::wrappers::TcpListenerStream::new(listener),
                )
                .await;
        });
        url
    }

    fn endpoint(url: &str, token: Option<&str>) -> CollectorEndpoint {
        CollectorEndpoint {
            url: url.to_owned(),
            token: token.and_then(Token::new),
            tls: None,
        }
    }

    fn batch(seq: u64) -> EventBatch {
        EventBatch {
            shim: Some(ShimInfo::default()),
            events: vec![Event {
                seq,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    /// Opens a connection, writes one batch, returns its first ack or how
    /// the stream ended.
    async fn one_batch(endpoint: &CollectorEndpoint) -> Result<Ack, ConnError> {
        let options = ConnOptions::default();
        let mut conn = Conn::open(target(endpoint, &options).unwrap(), &options);
        conn.out.send(batch(7)).await.unwrap();
        loop {
            match tokio::time::timeout(WAIT, conn.events.recv()).await {
                Ok(Some(ConnEvent::Connected { .. })) => {}
                Ok(Some(ConnEvent::Ack(ack))) => return Ok(ack),
                Ok(Some(ConnEvent::Closed(e))) => return Err(e),
                Ok(None) => return Err(ConnError::Ended),
                Err(_) => panic!("no answer within {WAIT:?}"),
            }
        }
    }

    #[test]
    fn the_token_stays_out_of_debug_output() {
        let endpoint = endpoint("http://127.0.0.1:1", Some("right-token"));
        let target = target(&endpoint, &ConnOptions::default()).unwrap();
        assert!(!format!("{endpoint:?}").contains("right-token"));
        assert!(!format!("{target:?}").contains("right-token"));
    }

    #[test]
    fn https_needs_a_ca() {
        let error = target(
            &endpoint("https://127.0.0.1:1", None),
            &ConnOptions::default(),
        )
        .unwrap_err();
        assert!(matches!(error, TargetError::NoCa), "{error:?}");
    }

    #[tokio::test]
    async fn sends_the_bearer_token_and_reports_a_refusal() {
        let service = TokenIngest::default();
        let url = serve_tcp(service.clone());
        let ack = one_batch(&endpoint(&url, Some("right-token")))
            .await
            .unwrap();
        assert_eq!(ack.last_seq, 7);
        for token in [None, Some("wrong-token")] {
            let error = one_batch(&endpoint(&url, token)).await.unwrap_err();
            assert!(
                matches!(&error, ConnError::Status(s) if s.code() == tonic::Code::Unauthenticated),
                "{error:?}"
            );
            assert_eq!(
                error.to_string(),
                "stream: Unauthenticated: invalid bearer token"
            );
        }
        assert_eq!(service.calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_collector_of_another_wire_protocol_is_named_in_the_error() {
        let url = serve_tcp(TokenIngest {
            other_protocol: true,
            ..TokenIngest::default()
        });
        let error = one_batch(&endpoint(&url, Some("right-token")))
            .await
            .unwrap_err();
        assert!(matches!(error, ConnError::WireProtocol(_)), "{error:?}");
        let text = error.to_string();
        assert!(
            text.starts_with(
                "the collector does not read this shim's wire protocol hermes.collector.v1 \
                 (Unimplemented: hermes-collector 9.0.0 reads the wire protocol hermes.collector.v2 only)"
            ),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "use a collector release that accepts hermes-collector-shim {}",
                crate::SHIM_VERSION
            )),
            "{text}"
        );
    }

    #[tokio::test]
    async fn connects_over_a_unix_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ingest.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        tokio::spawn(tonic::transport::Server::builder().serve_with_incoming(
            EventIngestServer::new(TokenIngest::default()),
            tokio_stream::wrappers::UnixListenerStream::new(listener),
        ));
        let url = format!("unix:{}", path.display());
        let ack = one_batch(&endpoint(&url, Some("right-token")))
            .await
            .unwrap();
        assert_eq!(ack.last_seq, 7);
        let missing = dir.path().join("missing.sock");
        let error = one_batch(&endpoint(&format!("unix:{}", missing.display()), None))
            .await
            .unwrap_err();
        assert!(matches!(error, ConnError::Connect(_)), "{error:?}");
    }

    /// A refused sender retries with its usual backoff, not in a loop, and
    /// shows why in `last_error`.
    #[test]
    fn a_refused_sender_backs_off() {
        struct Passthrough;
        impl crate::sender::Convert for Passthrough {
            type Item = Event;
            fn convert(&mut self, items: Vec<Event>) -> Vec<Event> {
                items
            }
        }
        let service = TokenIngest::default();
        let (url_tx, url_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server_service = service.clone();
        let server = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                url_tx.send(serve_tcp(server_service)).unwrap();
                let _ = stopped.await;
            });
        });
        let url = url_rx.recv_timeout(WAIT).unwrap();
        let mut config = crate::sender::SenderConfig::new(
            endpoint(&url, Some("wrong-token")),
            ShimInfo::default(),
        );
        config.backoff_min = Duration::from_millis(50);
        config.backoff_max = Duration::from_millis(400);
        config.linger = Duration::from_millis(1);
        config.close_grace = Duration::from_millis(100);
        let (tx, rx) = crate::queue::event_queue::<Event>(16);
        let shared = Arc::new(crate::sender::SenderShared::default());
        let thread = crate::sender::spawn(
            rx,
            Passthrough,
            config,
            Arc::clone(&shared),
            Arc::clone(tx.counters()),
        )
        .unwrap();
        assert!(
            tx.push(Event {
                seq: 1,
                ..Default::default()
            })
            .is_ok()
        );
        assert!(!shared.wait_settled(1, Duration::from_millis(1500)));
        let calls = service.calls.load(Ordering::SeqCst);
        // Delays of about 50, 100, 200, 400, 400 ms: a handful of attempts.
        assert!((2..=12).contains(&calls), "{calls} stream calls in 1.5 s");
        let stats = shared.stats();
        assert!(!stats.connected);
        assert!(
            stats.last_error.contains("Unauthenticated"),
            "{}",
            stats.last_error
        );
        drop(tx);
        thread.join().unwrap();
        let _ = stop.send(());
        server.join().unwrap();
    }
}
