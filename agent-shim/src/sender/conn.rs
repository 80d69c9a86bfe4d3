//! One gRPC stream to the collector.
//!
//! Owns: a task that connects, opens `EventIngest/Stream`, forwards the
//! batches written to [`Conn::out`] and reports acks and the end of the
//! stream as [`ConnEvent`]s.
//!
//! Invariants: the task never outlives its [`Conn`] (dropping the handle
//! aborts it and closes the request stream); it reports [`ConnEvent::Closed`]
//! at most once and as its last event; it never logs.

use std::time::Duration;

use hermes_proto::v1::event_ingest_client::EventIngestClient;
use hermes_proto::v1::{Ack, EventBatch};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Endpoint;

/// Why a stream could not be opened or ended.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    /// TCP connect or HTTP/2 handshake failed.
    #[error("connect: {0}")]
    Connect(#[source] tonic::transport::Error),
    /// The collector refused or ended the stream with a status.
    #[error("stream: {0}")]
    Status(#[source] tonic::Status),
    /// The collector closed the stream without a status.
    #[error("stream closed by the collector")]
    Ended,
}

/// What the connection task reports.
#[derive(Debug)]
pub enum ConnEvent {
    /// The collector answered the stream call.
    Connected,
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
    task: JoinHandle<()>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.task.abort();
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

/// Builds the endpoint for `url`.
pub fn endpoint(url: &str, options: &ConnOptions) -> Result<Endpoint, tonic::transport::Error> {
    Ok(Endpoint::from_shared(url.to_owned())?
        .connect_timeout(options.connect_timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(options.keepalive_interval)
        .keep_alive_timeout(options.keepalive_timeout)
        .keep_alive_while_idle(true))
}

impl Conn {
    /// Starts connecting on the current runtime.
    pub fn open(endpoint: Endpoint, options: &ConnOptions) -> Conn {
        let (out, out_rx) = mpsc::channel(options.out_capacity.max(1));
        let (events_tx, events) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            let end = drive(endpoint, out_rx, &events_tx).await;
            let _ = events_tx.send(ConnEvent::Closed(end));
        });
        Conn { out, events, task }
    }
}

async fn drive(
    endpoint: Endpoint,
    out_rx: mpsc::Receiver<EventBatch>,
    events: &mpsc::UnboundedSender<ConnEvent>,
) -> ConnError {
    let channel = match endpoint.connect().await {
        Ok(channel) => channel,
        Err(e) => return ConnError::Connect(e),
    };
    let mut client = EventIngestClient::new(channel);
    let response = match client.stream(ReceiverStream::new(out_rx)).await {
        Ok(response) => response,
        Err(status) => return ConnError::Status(status),
    };
    let _ = events.send(ConnEvent::Connected);
    let mut acks = response.into_inner();
    loop {
        match acks.message().await {
            Ok(Some(ack)) => {
                if events.send(ConnEvent::Ack(ack)).is_err() {
                    return ConnError::Ended;
                }
            }
            Ok(None) => return ConnError::Ended,
            Err(status) => return ConnError::Status(status),
        }
    }
}
