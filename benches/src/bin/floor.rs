//! `hermes-bench-floor`: the ingest side of the collector and nothing else,
//! to measure what receiving events costs before any correlation.
//!
//! It serves the collector's `EventIngest/Stream` on the same stack (tonic,
//! HTTP/2, the collector's `SliceCodec`, mimalloc) and acknowledges each batch
//! the way the collector does (first and last seq), then drops it. With
//! `--decode full` a batch is decoded into the collector's `EventBatch`, as
//! the collector's receiver does; with `--decode seqs` into a message that
//! declares only the events' seqs, so prost skips every other field (the
//! least any receiver must decode to acknowledge). Under `hermes-loadgen`
//! its CPU per event is the floor below which the collector cannot go with
//! this transport and wire format (`benches/collector_load.py --scenarios
//! floor`, docs/BENCHMARKS.md).
//!
//! Prints one JSON line on exit (SIGTERM or SIGINT): batches and events
//! received.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use hermes_proto::codec::SliceCodec;
use hermes_proto::v1::{Ack, EventBatch};
use tokio::signal::unix::{SignalKind, signal};
use tokio_stream::{Stream, StreamExt as _};
use tonic::body::Body;
use tonic::codegen::{BoxFuture, http};
use tonic::server::{Grpc, NamedService, StreamingService};
use tonic::{Request, Response, Status, Streaming};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Decode {
    /// Every field, into the collector's `EventBatch`.
    Full,
    /// Only the events' seqs; prost skips the other fields.
    Seqs,
}

/// The ingest side of the collector alone (receive, decode, acknowledge).
#[derive(Debug, Parser)]
#[command(name = "hermes-bench-floor")]
struct Args {
    /// Address to listen on (loopback only).
    #[arg(long, default_value = "127.0.0.1:4319")]
    listen: SocketAddr,
    /// How much of each batch to decode.
    #[arg(long, value_enum, default_value_t = Decode::Full)]
    decode: Decode,
    /// Worker threads of the runtime (0: one per CPU).
    #[arg(long, default_value_t = 0)]
    worker_threads: usize,
}

/// An `EventBatch` of which only the events' seqs are decoded.
#[derive(Clone, PartialEq, prost::Message)]
struct SeqBatch {
    #[prost(message, repeated, tag = "2")]
    events: Vec<SeqEvent>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct SeqEvent {
    #[prost(uint64, tag = "1")]
    seq: u64,
}

/// What a decoded batch gives the acknowledgement.
trait Batch: prost::Message + Default + Send + 'static {
    /// First and last seq, and the number of events.
    fn range(&self) -> Option<(u64, u64, u64)>;
}

impl Batch for EventBatch {
    fn range(&self) -> Option<(u64, u64, u64)> {
        let (first, last) = (self.events.first()?, self.events.last()?);
        Some((first.seq, last.seq, self.events.len() as u64))
    }
}

impl Batch for SeqBatch {
    fn range(&self) -> Option<(u64, u64, u64)> {
        let (first, last) = (self.events.first()?, self.events.last()?);
        Some((first.seq, last.seq, self.events.len() as u64))
    }
}

#[derive(Debug, Default)]
struct Counts {
    batches: AtomicU64,
    events: AtomicU64,
}

type AckStream = Pin<Box<dyn Stream<Item = Result<Ack, Status>> + Send>>;

/// The `EventIngest/Stream` method, decoding batches as `M`.
struct Method<M> {
    counts: Arc<Counts>,
    batch: std::marker::PhantomData<fn() -> M>,
}

impl<M: Batch> StreamingService<M> for Method<M> {
    type Response = Ack;
    type ResponseStream = AckStream;
    type Future = BoxFuture<Response<AckStream>, Status>;

    fn call(&mut self, request: Request<Streaming<M>>) -> Self::Future {
        let counts = Arc::clone(&self.counts);
        Box::pin(async move {
            let acks = request.into_inner().filter_map(move |batch| match batch {
                Ok(batch) => {
                    let (first_seq, last_seq, n) = batch.range()?;
                    counts.batches.fetch_add(1, Ordering::Relaxed);
                    counts.events.fetch_add(n, Ordering::Relaxed);
                    Some(Ok(Ack {
                        first_seq,
                        last_seq,
                    }))
                }
                Err(status) => Some(Err(status)),
            });
            Ok(Response::new(Box::pin(acks) as AckStream))
        })
    }
}

/// The service, routed like the generated `EventIngestServer`.
struct Floor<M> {
    counts: Arc<Counts>,
    batch: std::marker::PhantomData<fn() -> M>,
}

impl<M> Clone for Floor<M> {
    fn clone(&self) -> Self {
        Self {
            counts: Arc::clone(&self.counts),
            batch: std::marker::PhantomData,
        }
    }
}

impl<M> NamedService for Floor<M> {
    const NAME: &'static str = "hermes.collector.v1.EventIngest";
}

impl<M: Batch> tonic::codegen::Service<http::Request<Body>> for Floor<M> {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let method = Method::<M> {
            counts: Arc::clone(&self.counts),
            batch: std::marker::PhantomData,
        };
        Box::pin(async move {
            if request.uri().path() != "/hermes.collector.v1.EventIngest/Stream" {
                return Ok(Status::unimplemented("only EventIngest/Stream").into_http());
            }
            let mut grpc = Grpc::new(SliceCodec::<Ack, M>::default())
                .apply_max_message_size_config(Some(64 << 20), None);
            Ok(grpc.streaming(method, request).await)
        })
    }
}

async fn serve<M: Batch>(args: &Args, counts: Arc<Counts>) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("bind {}", args.listen))?;
    eprintln!(
        "hermes-bench-floor: listening on {} ({:?})",
        listener.local_addr()?,
        args.decode
    );
    let service = Floor::<M> {
        counts,
        batch: std::marker::PhantomData,
    };
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(incoming),
    );
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    server.abort();
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if !args.listen.ip().is_loopback() {
        anyhow::bail!("--listen must be a loopback address");
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if args.worker_threads > 0 {
        builder.worker_threads(args.worker_threads);
    }
    let runtime = builder.build()?;
    let counts = Arc::new(Counts::default());
    runtime.block_on(async {
        match args.decode {
            Decode::Full => serve::<EventBatch>(&args, Arc::clone(&counts)).await,
            Decode::Seqs => serve::<SeqBatch>(&args, Arc::clone(&counts)).await,
        }
    })?;
    println!(
        "{}",
        serde_json::json!({
            "batches": counts.batches.load(Ordering::Relaxed),
            "events": counts.events.load(Ordering::Relaxed),
        })
    );
    Ok(())
}
