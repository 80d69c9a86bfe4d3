//! The ingest's connections: how many may be open, how long each may stay
//! without doing anything useful, and when they close at shutdown.
//!
//! Owns the accept loop's stream ([`GuardedIncoming`]) and the wrapper of
//! every accepted connection ([`Guarded`]), which tonic serves like the bare
//! socket. The rules, each a defence against a client that only holds
//! connections open:
//! - At most [`ConnectionLimits::max_connections`] at once; a connection
//!   beyond it is accepted and closed at once (counted in
//!   [`ReceiverStats::connections_refused`]), so the client sees a closed
//!   connection instead of waiting in the kernel's queue, and the process
//!   keeps file descriptors for its other work (the admin server, the span
//!   file, the exporters).
//! - A connection must open an ingest stream that passes the bearer-token
//!   check within [`ConnectionLimits::handshake_timeout`] of being accepted
//!   (the TLS handshake and HTTP/2 preface included), else it is closed
//!   ([`ReceiverStats::connections_timed_out`]): without the token nobody
//!   holds a connection longer than that.
//! - A connection without any open ingest stream for
//!   [`ConnectionLimits::idle_timeout`] is closed (a shim keeps its stream
//!   open while it runs, so only a connection that stopped using it idles).
//! - Once shutdown starts, every connection still open after
//!   [`ConnectionLimits::shutdown_linger`] is closed, so the drain never
//!   waits on a client: its streams were already ended with `UNAVAILABLE`.
//! - An accept error (out of file descriptors, say) is counted and logged
//!   at powers of two, and accepting pauses briefly instead of spinning.
//!
//! Closing means the wrapper reports end-of-file to the reader and refuses
//! further writes; hyper then drops the connection and its socket.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tokio_stream::Stream;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::transport::server::Connected;

use crate::ReceiverStats;

/// How long accepting pauses after an accept error that is not about one
/// connection (e.g. `EMFILE`): the error would repeat at once.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Limits on the ingest's connections; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections open at once.
    pub max_connections: usize,
    /// Time from accept to the first ingest stream that passed the token
    /// check.
    pub handshake_timeout: Duration,
    /// Time a connection may stay without an open ingest stream.
    pub idle_timeout: Duration,
    /// Time connections are left to close themselves once shutdown starts.
    pub shutdown_linger: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            max_connections: 4096,
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            shutdown_linger: Duration::from_millis(500),
        }
    }
}

/// What the ingest service knows of the connection a stream came on: its
/// peer, and a handle to mark streams open. Reachable from a request's
/// extensions (`request.extensions().get::<Conn>()`), with TLS too.
#[derive(Debug, Clone)]
pub struct Conn {
    remote: Option<SocketAddr>,
    state: Arc<ConnState>,
}

#[derive(Debug)]
struct ConnState {
    opened: Instant,
    /// An ingest stream passed the token check on this connection.
    accepted: AtomicBool,
    /// Ingest streams open now.
    streams: AtomicU32,
    /// When the last stream ended, in milliseconds since `opened`.
    idle_since_ms: AtomicU64,
}

impl Conn {
    /// The peer's address (TCP only).
    pub fn remote(&self) -> Option<SocketAddr> {
        self.remote
    }

    /// Marks an ingest stream open on this connection until the guard is
    /// dropped: the connection is then past its handshake and not idle.
    pub fn stream_opened(&self) -> StreamGuard {
        self.state.accepted.store(true, Ordering::Relaxed);
        self.state.streams.fetch_add(1, Ordering::Relaxed);
        StreamGuard {
            state: Arc::clone(&self.state),
        }
    }
}

/// An open ingest stream on a [`Conn`]; see [`Conn::stream_opened`].
#[derive(Debug)]
pub struct StreamGuard {
    state: Arc<ConnState>,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let since = millis(self.state.opened.elapsed());
        self.state.idle_since_ms.store(since, Ordering::Relaxed);
        self.state.streams.fetch_sub(1, Ordering::Relaxed);
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A listener the guarded incoming stream accepts from.
pub trait Accept: Unpin {
    /// The accepted connection.
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// Accepts one connection, with its peer address when it has one.
    fn poll_accept(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<(Self::Io, Option<SocketAddr>)>>;
}

impl Accept for TcpListener {
    type Io = tokio::net::TcpStream;

    fn poll_accept(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<(Self::Io, Option<SocketAddr>)>> {
        let (stream, peer) = ready!(TcpListener::poll_accept(self, cx))?;
        // An ack is a small write and must not wait for the shim's TCP to
        // acknowledge the previous one.
        stream.set_nodelay(true)?;
        Poll::Ready(Ok((stream, Some(peer))))
    }
}

impl Accept for UnixListener {
    type Io = tokio::net::UnixStream;

    fn poll_accept(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<(Self::Io, Option<SocketAddr>)>> {
        let (stream, _) = ready!(UnixListener::poll_accept(self, cx))?;
        Poll::Ready(Ok((stream, None)))
    }
}

/// The connections `listener` accepts, each [`Guarded`], at most
/// `limits.max_connections` at once.
pub struct GuardedIncoming<L> {
    listener: L,
    limits: ConnectionLimits,
    permits: Arc<Semaphore>,
    stats: Arc<ReceiverStats>,
    shutdown: CancellationToken,
    backoff: Option<Pin<Box<Sleep>>>,
}

impl<L: Accept> GuardedIncoming<L> {
    /// Guards the connections of `listener`; `shutdown` starts their
    /// linger.
    pub fn new(
        listener: L,
        limits: ConnectionLimits,
        stats: Arc<ReceiverStats>,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            listener,
            permits: Arc::new(Semaphore::new(limits.max_connections.max(1))),
            limits,
            stats,
            shutdown,
            backoff: None,
        }
    }
}

impl<L: Accept> Stream for GuardedIncoming<L> {
    type Item = io::Result<Guarded<L::Io>>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(backoff) = this.backoff.as_mut() {
                ready!(backoff.as_mut().poll(cx));
                this.backoff = None;
            }
            let (io, remote) = match this.listener.poll_accept(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(accepted)) => accepted,
                Poll::Ready(Err(e)) if is_connection_error(&e) => continue,
                Poll::Ready(Err(e)) => {
                    let (n, log) = ReceiverStats::count(&this.stats.accept_errors);
                    if log {
                        tracing::warn!(
                            error = %e,
                            accept_errors = n,
                            "the ingest cannot accept connections; pausing (logged at the 1st, 2nd, 4th, ... error)"
                        );
                    }
                    this.backoff = Some(Box::pin(tokio::time::sleep(ACCEPT_BACKOFF)));
                    continue;
                }
            };
            let Ok(permit) = Arc::clone(&this.permits).try_acquire_owned() else {
                let (n, log) = ReceiverStats::count(&this.stats.connections_refused);
                if log {
                    tracing::warn!(
                        max_connections = this.limits.max_connections,
                        connections_refused = n,
                        "closed an ingest connection over receiver.max_connections (logged at the 1st, 2nd, 4th, ... time)"
                    );
                }
                drop(io);
                continue;
            };
            this.stats.connections_open.fetch_add(1, Ordering::Relaxed);
            return Poll::Ready(Some(Ok(Guarded::new(io, remote, this, permit))));
        }
    }
}

fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// An accepted connection that closes itself by the rules of the module
/// docs.
pub struct Guarded<IO> {
    io: IO,
    conn: Conn,
    limits: ConnectionLimits,
    stats: Arc<ReceiverStats>,
    /// The next moment a rule may close the connection.
    timer: Pin<Box<Sleep>>,
    shutdown: Pin<Box<WaitForCancellationFutureOwned>>,
    stopping: bool,
    closed: bool,
    _permit: OwnedSemaphorePermit,
}

impl<IO> Guarded<IO> {
    fn new<L>(
        io: IO,
        remote: Option<SocketAddr>,
        incoming: &GuardedIncoming<L>,
        permit: OwnedSemaphorePermit,
    ) -> Self {
        let opened = Instant::now();
        let limits = incoming.limits;
        Self {
            io,
            conn: Conn {
                remote,
                state: Arc::new(ConnState {
                    opened,
                    accepted: AtomicBool::new(false),
                    streams: AtomicU32::new(0),
                    idle_since_ms: AtomicU64::new(0),
                }),
            },
            limits,
            stats: Arc::clone(&incoming.stats),
            timer: Box::pin(tokio::time::sleep_until(opened + limits.handshake_timeout)),
            shutdown: Box::pin(incoming.shutdown.clone().cancelled_owned()),
            stopping: false,
            closed: false,
            _permit: permit,
        }
    }

    /// Applies the rules; true once the connection is to be closed.
    fn must_close(&mut self, cx: &mut Context<'_>) -> bool {
        if self.closed {
            return true;
        }
        if !self.stopping && self.shutdown.as_mut().poll(cx).is_ready() {
            self.stopping = true;
            let at = Instant::now() + self.limits.shutdown_linger;
            self.timer.as_mut().reset(at);
        }
        while self.timer.as_mut().poll(cx).is_ready() {
            let state = &self.conn.state;
            let now = Instant::now();
            let close = if self.stopping {
                Some(None)
            } else if !state.accepted.load(Ordering::Relaxed) {
                Some(Some(&self.stats.connections_timed_out))
            } else if state.streams.load(Ordering::Relaxed) > 0 {
                self.timer.as_mut().reset(now + self.limits.idle_timeout);
                None
            } else {
                let idle_since = Duration::from_millis(state.idle_since_ms.load(Ordering::Relaxed));
                let due = state.opened + idle_since + self.limits.idle_timeout;
                if due <= now {
                    Some(Some(&self.stats.connections_idle_closed))
                } else {
                    self.timer.as_mut().reset(due);
                    None
                }
            };
            if let Some(counter) = close {
                if let Some(counter) = counter {
                    counter.fetch_add(1, Ordering::Relaxed);
                }
                tracing::debug!(peer = ?self.conn.remote, stopping = self.stopping, "closing an ingest connection");
                self.closed = true;
                return true;
            }
        }
        false
    }
}

impl<IO> Drop for Guarded<IO> {
    fn drop(&mut self) {
        self.stats.connections_open.fetch_sub(1, Ordering::Relaxed);
    }
}

impl<IO> Connected for Guarded<IO> {
    type ConnectInfo = Conn;

    fn connect_info(&self) -> Conn {
        self.conn.clone()
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Guarded<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.must_close(cx) {
            // End of file: the server drops the connection.
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Guarded<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.closed {
            return Poll::Ready(Err(io::ErrorKind::ConnectionAborted.into()));
        }
        Pin::new(&mut this.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.closed {
            return Poll::Ready(Err(io::ErrorKind::ConnectionAborted.into()));
        }
        Pin::new(&mut this.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio_stream::StreamExt as _;

    async fn incoming(
        limits: ConnectionLimits,
    ) -> (
        GuardedIncoming<TcpListener>,
        SocketAddr,
        Arc<ReceiverStats>,
        CancellationToken,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stats = Arc::new(ReceiverStats::default());
        let shutdown = CancellationToken::new();
        let incoming = GuardedIncoming::new(listener, limits, stats.clone(), shutdown.clone());
        (incoming, addr, stats, shutdown)
    }

    /// One client connected through a guard with default limits; both ends
    /// stay open while it lives.
    struct OneClient {
        /// The server side, as the guard hands it out.
        io: Guarded<tokio::net::TcpStream>,
        stats: Arc<ReceiverStats>,
        shutdown: CancellationToken,
        _client: tokio::net::TcpStream,
        _incoming: GuardedIncoming<TcpListener>,
    }

    async fn one_client() -> OneClient {
        let (mut incoming, addr, stats, shutdown) = incoming(ConnectionLimits::default()).await;
        let client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let io = incoming.next().await.unwrap().unwrap();
        OneClient {
            io,
            stats,
            shutdown,
            _client: client,
            _incoming: incoming,
        }
    }

    /// Reads from the server side until it reports end of file (the guard
    /// closed it) and returns how long that took.
    async fn until_closed(mut io: Guarded<tokio::net::TcpStream>) -> Duration {
        let start = Instant::now();
        let mut buf = [0u8; 64];
        loop {
            if io.read(&mut buf).await.unwrap() == 0 {
                return start.elapsed();
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_connection_is_closed_after_the_handshake_timeout() {
        let limits = ConnectionLimits::default();
        let c = one_client().await;
        assert_eq!(c.stats.connections_open.load(Ordering::Relaxed), 1);
        let took = until_closed(c.io).await;
        assert_eq!(took, limits.handshake_timeout);
        assert_eq!(c.stats.connections_timed_out.load(Ordering::Relaxed), 1);
        assert_eq!(c.stats.connections_open.load(Ordering::Relaxed), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_with_a_stream_stays_until_idle_after_it() {
        let limits = ConnectionLimits::default();
        let c = one_client().await;
        let conn = c.io.connect_info();
        let stream = conn.stream_opened();
        let closed = tokio::spawn(until_closed(c.io));
        // Open streams keep it past both timeouts.
        tokio::time::sleep(limits.idle_timeout * 3).await;
        assert!(!closed.is_finished());
        drop(stream);
        let ended = Instant::now();
        let took = closed.await.unwrap();
        assert!(took >= limits.idle_timeout * 3 + limits.idle_timeout);
        assert!(ended.elapsed() <= limits.idle_timeout + Duration::from_millis(1));
        assert_eq!(c.stats.connections_idle_closed.load(Ordering::Relaxed), 1);
        assert_eq!(c.stats.connections_timed_out.load(Ordering::Relaxed), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_closes_every_connection_after_the_linger() {
        let limits = ConnectionLimits::default();
        let c = one_client().await;
        let _stream = c.io.connect_info().stream_opened();
        let closed = tokio::spawn(until_closed(c.io));
        tokio::time::sleep(Duration::from_secs(1)).await;
        c.shutdown.cancel();
        let start = Instant::now();
        closed.await.unwrap();
        assert_eq!(start.elapsed(), limits.shutdown_linger);
    }

    #[tokio::test]
    async fn accepted_tcp_connections_do_not_delay_small_writes() {
        let c = one_client().await;
        assert!(c.io.io.nodelay().unwrap());
    }

    #[tokio::test]
    async fn connections_over_the_limit_are_closed_at_once() {
        let limits = ConnectionLimits {
            max_connections: 2,
            ..ConnectionLimits::default()
        };
        let (mut incoming, addr, stats, _shutdown) = incoming(limits).await;
        let mut clients = Vec::new();
        let mut kept = Vec::new();
        for _ in 0..2 {
            clients.push(tokio::net::TcpStream::connect(addr).await.unwrap());
            kept.push(incoming.next().await.unwrap().unwrap());
        }
        let mut third = tokio::net::TcpStream::connect(addr).await.unwrap();
        let accept = tokio::spawn(async move {
            let next = incoming.next().await;
            (incoming, next)
        });
        // The third is accepted and closed: its read ends at once.
        let mut buf = [0u8; 8];
        let n = tokio::time::timeout(Duration::from_secs(5), third.read(&mut buf))
            .await
            .unwrap()
            .unwrap_or(0);
        assert_eq!(n, 0);
        assert_eq!(stats.connections_refused.load(Ordering::Relaxed), 1);
        // A slot frees when a kept connection ends.
        drop(kept.pop());
        let mut fourth = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (_incoming, next) = accept.await.unwrap();
        let mut io = next.unwrap().unwrap();
        fourth.write_all(b"ping").await.unwrap();
        let mut got = [0u8; 4];
        io.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping");
    }
}
