//! A fake collector for tests and trying the shim by hand (feature
//! `test-support`, and the crate's own unit tests): serves
//! `EventIngest/Stream` from a thread of its own with a single-threaded
//! runtime, records every batch it receives and acknowledges it, unless its
//! script ends the stream with a status instead. Stops and joins on drop.
//! As a fleet replica ([`FakeCollector::settling`]) it answers fleet streams
//! (`hermes-fleet: 1`) with `hermes-settles: 1`, and the test says when
//! events are settled ([`FakeCollector::settle`]) or the replica leaves
//! ([`FakeCollector::leave`]).
//!
//! The one fake ingest server of the shim's sender tests, the installed
//! wheel's end-to-end test (`hermes-e2e`, which cannot be a dev-dependency
//! of the shim: it depends on the shim) and the `dump_collector` example.

use std::net::{SocketAddr, ToSocketAddrs};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use hermes_proto::server::event_ingest_server::{EventIngest, EventIngestServer};
use hermes_proto::v1::{Ack, EventBatch};
use hermes_proto::wire::RawBatch;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::metadata::MetadataValue;
use tonic::{Request, Response, Status, Streaming};

/// One batch as the script sees it, before it is acknowledged.
pub struct Delivery<'a> {
    /// Streams opened before this batch's (0: the first stream).
    pub stream: usize,
    /// Batches received on this stream so far, this one included.
    pub batch_in_stream: usize,
    pub batch: &'a EventBatch,
}

/// Decides per batch: `None` acknowledges it, a status ends its stream with
/// that status, the batch unacknowledged (it is recorded either way).
type Script = Arc<dyn Fn(&Delivery<'_>) -> Option<Status> + Send + Sync>;

/// Where a stream's answers go.
type Reply = mpsc::WeakSender<Result<Ack, Status>>;

#[derive(Clone, Default)]
struct Recorded {
    batches: Arc<Mutex<Vec<EventBatch>>>,
    streams: Arc<AtomicUsize>,
    /// Streams opened with `hermes-fleet: 1`.
    fleet_streams: Arc<AtomicUsize>,
    /// The answer channels of the fleet streams, for settlement acks (weak:
    /// a stream's answers end with its requests).
    fleet_replies: Arc<Mutex<Vec<Reply>>>,
    /// Set while the streams are not read (a replica backed up).
    paused: Arc<watch::Sender<bool>>,
}

#[derive(Clone)]
struct Service {
    recorded: Recorded,
    script: Script,
    settles: bool,
}

#[tonic::async_trait]
impl EventIngest for Service {
    type StreamStream =
        Pin<Box<dyn tokio_stream::Stream<Item = Result<Ack, Status>> + Send + 'static>>;

    async fn stream(
        &self,
        request: Request<Streaming<RawBatch>>,
    ) -> Result<Response<Self::StreamStream>, Status> {
        let stream = self.recorded.streams.fetch_add(1, Ordering::SeqCst);
        let fleet = request
            .metadata()
            .get("hermes-fleet")
            .is_some_and(|v| v == "1");
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(64);
        if fleet {
            self.recorded.fleet_streams.fetch_add(1, Ordering::SeqCst);
            if self.settles {
                lock(&self.recorded.fleet_replies).push(tx.downgrade());
            }
        }
        let batches = Arc::clone(&self.recorded.batches);
        let script = Arc::clone(&self.script);
        let mut paused = self.recorded.paused.subscribe();
        tokio::spawn(async move {
            let mut batch_in_stream = 0;
            loop {
                if paused.wait_for(|p| !p).await.is_err() {
                    return;
                }
                let Ok(Some(Ok(batch))) = inbound.message().await.map(|m| m.map(|w| w.to_batch()))
                else {
                    return;
                };
                batch_in_stream += 1;
                let verdict = script(&Delivery {
                    stream,
                    batch_in_stream,
                    batch: &batch,
                });
                let reply = match verdict {
                    Some(status) => Err(status),
                    None => Ok(Ack {
                        first_seq: batch.events.first().map_or(0, |e| e.seq),
                        last_seq: batch.events.last().map_or(0, |e| e.seq),
                        ..Ack::default()
                    }),
                };
                let ends = reply.is_err();
                lock(&batches).push(batch);
                if tx.send(reply).await.is_err() || ends {
                    return;
                }
            }
        });
        let mut response: Response<Self::StreamStream> =
            Response::new(Box::pin(ReceiverStream::new(rx)));
        if self.settles {
            response
                .metadata_mut()
                .insert("hermes-settles", MetadataValue::from_static("1"));
        }
        Ok(response)
    }
}

fn lock<T>(value: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    value.lock().unwrap_or_else(PoisonError::into_inner)
}

/// An in-process collector; see the module docs.
pub struct FakeCollector {
    addr: SocketAddr,
    recorded: Recorded,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeCollector {
    /// Acknowledges every batch, on 127.0.0.1:`port` (0: OS-chosen).
    pub fn start(port: u16) -> FakeCollector {
        FakeCollector::scripted(("127.0.0.1", port), |_| None)
    }

    /// Answers each batch as `script` says, on `addr`.
    ///
    /// # Panics
    /// When `addr` cannot be bound or the server thread cannot start.
    pub fn scripted(
        addr: impl ToSocketAddrs + std::fmt::Debug,
        script: impl Fn(&Delivery<'_>) -> Option<Status> + Send + Sync + 'static,
    ) -> FakeCollector {
        FakeCollector::serve(addr, false, Arc::new(script))
    }

    /// A fleet replica on `addr` that settles: acknowledges every batch,
    /// answers fleet streams with `hermes-settles: 1` and sends them the
    /// settlement and leave acks the test asks for.
    ///
    /// # Panics
    /// As [`FakeCollector::scripted`].
    pub fn settling(addr: impl ToSocketAddrs + std::fmt::Debug) -> FakeCollector {
        FakeCollector::serve(addr, true, Arc::new(|_| None))
    }

    fn serve(
        addr: impl ToSocketAddrs + std::fmt::Debug,
        settles: bool,
        script: Script,
    ) -> FakeCollector {
        let listener = std::net::TcpListener::bind(&addr)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .unwrap_or_else(|e| panic!("bind {addr:?}: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("local_addr: {e}"));
        let recorded = Recorded::default();
        let service = Service {
            recorded: recorded.clone(),
            script,
            settles,
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap_or_else(|e| panic!("fake collector runtime: {e}"));
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener)
                    .unwrap_or_else(|e| panic!("fake collector listener: {e}"));
                let stopped = async {
                    let _ = stopped.await;
                };
                let _ = tonic::transport::Server::builder()
                    .serve_with_incoming_shutdown(
                        EventIngestServer::new(service),
                        TcpListenerStream::new(listener),
                        stopped,
                    )
                    .await;
            });
        });
        FakeCollector {
            addr,
            recorded,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`, for the shim's endpoint setting.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The batches received, in arrival order (refused ones included).
    pub fn batches(&self) -> Vec<EventBatch> {
        lock(&self.recorded.batches).clone()
    }

    /// The seqs of every event received, in arrival order.
    pub fn seqs(&self) -> Vec<u64> {
        lock(&self.recorded.batches)
            .iter()
            .flat_map(|b| b.events.iter().map(|e| e.seq))
            .collect()
    }

    /// How many streams were opened.
    pub fn streams(&self) -> usize {
        self.recorded.streams.load(Ordering::SeqCst)
    }

    /// How many streams were opened in fleet mode (`hermes-fleet: 1`).
    pub fn fleet_streams(&self) -> usize {
        self.recorded.fleet_streams.load(Ordering::SeqCst)
    }

    /// How many handoff batches arrived.
    pub fn handoffs(&self) -> usize {
        lock(&self.recorded.batches)
            .iter()
            .filter(|b| b.handoff)
            .count()
    }

    /// Tells every open fleet stream that its events up to `seq` are
    /// settled (a settling replica only).
    pub fn settle(&self, seq: u64) {
        self.broadcast(&Ok(Ack {
            settled_seq: seq,
            ..Ack::default()
        }));
    }

    /// Tells every open fleet stream that this replica leaves the fleet (a
    /// settling replica only).
    pub fn leave(&self) {
        self.broadcast(&Ok(Ack {
            leave: true,
            ..Ack::default()
        }));
    }

    /// Stops reading every stream, as a replica whose ingest is backed up:
    /// what the shims write waits in the connections' flow-control windows
    /// and then in the shims.
    pub fn pause_reads(&self) {
        self.recorded.paused.send_replace(true);
    }

    /// Reads the streams again (after [`FakeCollector::pause_reads`]).
    pub fn resume_reads(&self) {
        self.recorded.paused.send_replace(false);
    }

    /// Ends every open fleet stream with `UNAVAILABLE` and stops, as a
    /// replica that dies (a settling replica only).
    pub fn kill(self) {
        self.broadcast(&Err(Status::unavailable("replica killed")));
    }

    fn broadcast(&self, reply: &Result<Ack, Status>) {
        lock(&self.recorded.fleet_replies).retain(|tx| {
            tx.upgrade()
                .is_some_and(|tx| match tx.try_send(reply.clone()) {
                    Ok(()) | Err(mpsc::error::TrySendError::Full(_)) => true,
                    Err(mpsc::error::TrySendError::Closed(_)) => false,
                })
        });
    }
}

impl Drop for FakeCollector {
    fn drop(&mut self) {
        self.stop.take().map(|stop| stop.send(()));
        if let Some(server) = self.thread.take() {
            let _ = server.join();
        }
    }
}
