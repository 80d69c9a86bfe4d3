//! `hermes-bench-floor`: the ingest side of the collector and nothing else,
//! to measure what receiving events costs before any correlation.
//!
//! It serves the collector's `EventIngest/Stream` on the same stack (tonic,
//! HTTP/2, the collector's `SliceCodec`, mimalloc) and acknowledges each batch
//! the way the collector does (first and last seq), then drops it. With
//! `--decode full` a batch is decoded into the collector's `EventBatch`, as
//! the collector's receiver does; with `--decode seqs` into a message that
//! declares only the events' seqs, so prost skips every other field (the
//! least any receiver must decode to acknowledge); with `--decode views`
//! every field is read and every string UTF-8-checked as with `full`, but
//! into borrowed views of the received bytes ([`EventView`]), with no
//! allocation per field: what decoding costs in the data layout
//! docs/BENCHMARKS.md proposes. Under `hermes-loadgen` its CPU per event is
//! the floor below which the collector cannot go with this transport and
//! wire format (`benches/collector_load.py --scenarios floor_full,...`).
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
use prost::encoding::{WireType, decode_key, decode_varint};
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
    /// Every field, into borrowed views of the received bytes.
    Views,
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

/// A batch as one `--decode` mode decodes it, and what it gives the
/// acknowledgement.
trait Batch: Send + 'static + Sized {
    /// The gRPC codec that decodes it.
    type Codec: tonic::codec::Codec<Encode = Ack, Decode = Self> + Default + Send + 'static;

    /// First and last seq, and the number of events (`None`: no event).
    fn range(&self) -> Result<Option<(u64, u64, u64)>, Status>;
}

/// First and last seq, and the number of `events`.
fn range_of<T>(events: &[T], seq: impl Fn(&T) -> u64) -> Option<(u64, u64, u64)> {
    Some((
        seq(events.first()?),
        seq(events.last()?),
        events.len() as u64,
    ))
}

impl Batch for EventBatch {
    type Codec = SliceCodec<Ack, EventBatch>;

    fn range(&self) -> Result<Option<(u64, u64, u64)>, Status> {
        Ok(range_of(&self.events, |e| e.seq))
    }
}

impl Batch for SeqBatch {
    type Codec = SliceCodec<Ack, SeqBatch>;

    fn range(&self) -> Result<Option<(u64, u64, u64)>, Status> {
        Ok(range_of(&self.events, |e| e.seq))
    }
}

impl Batch for ViewBatch {
    type Codec = RawCodec;

    fn range(&self) -> Result<Option<(u64, u64, u64)>, Status> {
        Ok(range_of(&self.events()?, |e| e.seq))
    }
}

/// One event as borrowed views of the received message: its strings are
/// slices of the receive buffer (UTF-8-checked), its numbers copied.
#[derive(Debug, Default, Clone, Copy)]
struct EventView<'a> {
    seq: u64,
    time_unix_nano: u64,
    hook: &'a str,
    schema_version: &'a str,
    thread: &'a str,
    /// `Ids`, by field number − 1.
    ids: [&'a str; 10],
    /// Field number of the body (10 … 16), 0 without one.
    body: u32,
    /// The body's strings, in wire order (the first 12).
    strings: [&'a str; 12],
    /// The body's integers, in wire order (the first 12).
    numbers: [u64; 12],
}

/// One field of a protobuf message.
enum Wire<'a> {
    Varint(u64),
    Fixed(u64),
    Bytes(&'a [u8]),
}

/// prost's own varint reader, its errors as the codec reports them.
fn varint(buf: &mut &[u8]) -> Result<u64, Status> {
    decode_varint(buf).map_err(|e| Status::internal(e.to_string()))
}

fn take<'a>(buf: &mut &'a [u8], n: usize) -> Result<&'a [u8], Status> {
    if buf.len() < n {
        return Err(Status::internal("truncated field"));
    }
    let (head, rest) = buf.split_at(n);
    *buf = rest;
    Ok(head)
}

/// The next field of `buf`: its number and value (the key read and
/// checked by prost, as its decoder does).
fn field<'a>(buf: &mut &'a [u8]) -> Result<(u32, Wire<'a>), Status> {
    let (number, wire_type) = decode_key(buf).map_err(|e| Status::internal(e.to_string()))?;
    let value = match wire_type {
        WireType::Varint => Wire::Varint(varint(buf)?),
        WireType::SixtyFourBit => Wire::Fixed(u64::from_le_bytes(
            take(buf, 8)?.try_into().unwrap_or_default(),
        )),
        WireType::LengthDelimited => {
            let len = usize::try_from(varint(buf)?).map_err(|_| Status::internal("length"))?;
            Wire::Bytes(take(buf, len)?)
        }
        WireType::ThirtyTwoBit => Wire::Fixed(u64::from(u32::from_le_bytes(
            take(buf, 4)?.try_into().unwrap_or_default(),
        ))),
        WireType::StartGroup | WireType::EndGroup => {
            return Err(Status::internal("unsupported wire type"));
        }
    };
    Ok((number, value))
}

fn text(bytes: &[u8]) -> Result<&str, Status> {
    std::str::from_utf8(bytes).map_err(|_| Status::internal("invalid UTF-8"))
}

/// Checks every string of a message whose length-delimited fields are all
/// strings (`ShimInfo`, a `map<string, string>` entry).
fn strings_only(mut buf: &[u8]) -> Result<(), Status> {
    while !buf.is_empty() {
        if let (_, Wire::Bytes(b)) = field(&mut buf)? {
            text(b)?;
        }
    }
    Ok(())
}

/// The body message `number` of an event into `view`.
fn body<'a>(number: u32, mut buf: &'a [u8], view: &mut EventView<'a>) -> Result<(), Status> {
    view.body = number;
    let (mut s, mut n) = (0, 0);
    while !buf.is_empty() {
        match field(&mut buf)? {
            // ApiCall.usage: numbers only.
            (14, Wire::Bytes(usage)) if number == 12 => {
                let mut usage = usage;
                while !usage.is_empty() {
                    if let (_, Wire::Varint(v)) = field(&mut usage)?
                        && let Some(slot) = view.numbers.get_mut(n)
                    {
                        *slot = v;
                        n += 1;
                    }
                }
            }
            // Other.fields: map<string, Scalar> entries.
            (1, Wire::Bytes(entry)) if number == 16 => {
                let mut entry = entry;
                while !entry.is_empty() {
                    match field(&mut entry)? {
                        (1, Wire::Bytes(key)) => {
                            text(key)?;
                        }
                        (2, Wire::Bytes(scalar)) => strings_only(scalar)?,
                        _ => {}
                    }
                }
            }
            (_, Wire::Bytes(b)) => {
                let t = text(b)?;
                if let Some(slot) = view.strings.get_mut(s) {
                    *slot = t;
                    s += 1;
                }
            }
            (_, Wire::Varint(v) | Wire::Fixed(v)) => {
                if let Some(slot) = view.numbers.get_mut(n) {
                    *slot = v;
                    n += 1;
                }
            }
        }
    }
    Ok(())
}

fn event(mut buf: &[u8]) -> Result<EventView<'_>, Status> {
    let mut view = EventView::default();
    while !buf.is_empty() {
        match field(&mut buf)? {
            (1, Wire::Varint(v)) => view.seq = v,
            (2, Wire::Bytes(b)) => view.hook = text(b)?,
            (3, Wire::Bytes(b)) => view.schema_version = text(b)?,
            (4, Wire::Fixed(v)) => view.time_unix_nano = v,
            (6, Wire::Bytes(b)) => view.thread = text(b)?,
            (7, Wire::Bytes(mut ids)) => {
                while !ids.is_empty() {
                    if let (number @ 1..=10, Wire::Bytes(b)) = field(&mut ids)? {
                        view.ids[number as usize - 1] = text(b)?;
                    }
                }
            }
            (number @ 10..=16, Wire::Bytes(b)) => body(number, b, &mut view)?,
            (20, Wire::Bytes(entry)) => strings_only(entry)?,
            _ => {}
        }
    }
    Ok(view)
}

/// An `EventBatch` read as views of its bytes.
#[derive(Default)]
struct ViewBatch {
    bytes: prost::bytes::Bytes,
}

impl ViewBatch {
    /// The events, checked as prost would check them.
    fn events(&self) -> Result<Vec<EventView<'_>>, Status> {
        let mut events = Vec::with_capacity(512);
        let mut buf = &self.bytes[..];
        while !buf.is_empty() {
            match field(&mut buf)? {
                (1, Wire::Bytes(shim)) => strings_only(shim)?,
                (2, Wire::Bytes(event_bytes)) => events.push(event(event_bytes)?),
                _ => {}
            }
        }
        Ok(events)
    }
}

/// The codec of `--decode views`: a received message is handed on as its
/// bytes (split off tonic's buffer, not copied).
#[derive(Debug, Default, Clone, Copy)]
struct RawCodec;

struct RawDecoder;

impl tonic::codec::Decoder for RawDecoder {
    type Item = ViewBatch;
    type Error = Status;

    fn decode(
        &mut self,
        buf: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<ViewBatch>, Status> {
        use prost::bytes::Buf as _;
        let len = buf.remaining();
        Ok(Some(ViewBatch {
            bytes: buf.copy_to_bytes(len),
        }))
    }
}

impl tonic::codec::Codec for RawCodec {
    type Encode = Ack;
    type Decode = ViewBatch;
    type Encoder = <SliceCodec<Ack, EventBatch> as tonic::codec::Codec>::Encoder;
    type Decoder = RawDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        SliceCodec::<Ack, EventBatch>::default().encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawDecoder
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
            let acks =
                request
                    .into_inner()
                    .filter_map(move |batch| match batch.and_then(|b| b.range()) {
                        Ok(Some((first_seq, last_seq, n))) => {
                            counts.batches.fetch_add(1, Ordering::Relaxed);
                            counts.events.fetch_add(n, Ordering::Relaxed);
                            Some(Ok(Ack {
                                first_seq,
                                last_seq,
                                ..Default::default()
                            }))
                        }
                        Ok(None) => None,
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
            let mut grpc =
                Grpc::new(M::Codec::default()).apply_max_message_size_config(Some(64 << 20), None);
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
    // One worker per CPU, or TOKIO_WORKER_THREADS, as the collector's default.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let counts = Arc::new(Counts::default());
    runtime.block_on(async {
        match args.decode {
            Decode::Full => serve::<EventBatch>(&args, Arc::clone(&counts)).await,
            Decode::Seqs => serve::<SeqBatch>(&args, Arc::clone(&counts)).await,
            Decode::Views => serve::<ViewBatch>(&args, Arc::clone(&counts)).await,
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use hermes_benches::{FIXTURES, convert, load_fixture, shim_info};
    use hermes_collector_shim::config::CaptureLevel;
    use hermes_proto::v1::event::Body;
    use prost::Message as _;

    /// The non-empty strings of a body in field order (proto3 leaves empty
    /// strings off the wire), read from prost's decoded message.
    fn body_strings(body: &Body) -> Vec<String> {
        let fields: Vec<&str> = match body {
            Body::Session(b) => vec![
                &b.model,
                &b.platform,
                &b.reason,
                &b.old_session_id,
                &b.new_session_id,
            ]
            .into_iter()
            .map(String::as_str)
            .collect(),
            Body::Turn(b) => vec![b.model.as_str(), &b.platform, &b.reason, &b.sender_id],
            Body::Api(b) => vec![
                b.model.as_str(),
                &b.platform,
                &b.provider,
                &b.base_url,
                &b.api_mode,
                &b.finish_reason,
                &b.response_model,
                &b.reason,
                &b.error_type,
                &b.error_message,
            ],
            Body::Tool(b) => vec![
                b.tool_name.as_str(),
                &b.status,
                &b.error_type,
                &b.error_message,
            ],
            Body::Subagent(b) => vec![
                b.child_role.as_str(),
                &b.child_status,
                &b.child_goal,
                &b.child_summary,
            ],
            Body::Approval(b) => std::iter::once(b.pattern_key.as_str())
                .chain(b.pattern_keys.iter().map(String::as_str))
                .chain([
                    b.surface.as_str(),
                    &b.choice,
                    &b.decided_by,
                    &b.session_key,
                    &b.command,
                    &b.description,
                ])
                .collect(),
            Body::Other(_) => Vec::new(),
        };
        let mut strings: Vec<String> = fields
            .into_iter()
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .take(12)
            .collect();
        strings.resize(12, String::new());
        strings
    }

    #[test]
    fn views_read_what_prost_decodes() {
        for level in [CaptureLevel::Metadata, CaptureLevel::Content] {
            let events: Vec<_> = FIXTURES
                .iter()
                .flat_map(|name| convert(&load_fixture(name).unwrap(), level))
                .collect();
            let batch = EventBatch {
                shim: Some(shim_info(0, level)),
                events,
                ..Default::default()
            };
            let views = ViewBatch {
                bytes: batch.encode_to_vec().into(),
            };
            let read = views.events().unwrap();
            assert_eq!(read.len(), batch.events.len());
            for (view, event) in read.iter().zip(&batch.events) {
                assert_eq!(view.seq, event.seq);
                assert_eq!(view.time_unix_nano, event.time_unix_nano);
                assert_eq!(view.hook, event.hook);
                assert_eq!(view.thread, event.thread);
                let ids = event.ids.clone().unwrap_or_default();
                assert_eq!(view.ids[0], ids.session_id);
                assert_eq!(view.ids[2], ids.turn_id);
                assert_eq!(view.ids[3], ids.api_request_id);
                assert_eq!(view.ids[4], ids.tool_call_id);
                if let Some(body) = &event.body {
                    let strings: Vec<_> = view.strings.iter().map(|s| (*s).to_owned()).collect();
                    if !matches!(body, Body::Other(_)) {
                        assert_eq!(strings, body_strings(body), "{}", event.hook);
                    }
                }
            }
            assert_eq!(views.range().unwrap(), batch.range().unwrap(), "{level:?}");
        }
    }

    #[test]
    fn views_refuse_what_prost_refuses() {
        let bad = ViewBatch {
            bytes: vec![0x12, 0x03, 0x12, 0x01, 0xff].into(),
        };
        assert!(bad.events().is_err(), "invalid UTF-8 in a hook name");
        assert!(EventBatch::decode(&bad.bytes[..]).is_err());
        let truncated = ViewBatch {
            bytes: vec![0x12, 0x05, 0x08].into(),
        };
        assert!(truncated.events().is_err());
    }
}
