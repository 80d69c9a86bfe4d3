//! Agents' events over the wire protocol, for tests that play an agent (or
//! an attacker) without the real one: the recorded fixtures converted
//! exactly as the shim converts them, batches with a shim identity, and the
//! one ingest client every test uses ([`connect`], [`stream_batches`]; from
//! plain tests [`exchange`], [`exchange_tls`], and [`exchange_raw`] for
//! messages given as bytes) that returns the acknowledgements or the
//! refusal.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::time::Duration;

use hermes_collector_shim::attempts::AttemptTracker;
use hermes_collector_shim::config::CaptureLevel;
use hermes_collector_shim::convert::{JsonKwargs, Stamp, to_event};
use hermes_proto::v1::event_ingest_client::EventIngestClient;
use hermes_proto::v1::{Event, EventBatch, ShimInfo};
use serde_json::Value as Json;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

/// How long an exchange waits for each acknowledgement.
const WAIT: Duration = Duration::from_secs(30);

/// The recorded fixtures of hermes-agent 0.19.0: one turn with a tool
/// call, retried requests, parallel tool calls, three turns of a session.
pub const FIXTURES: [&str; 4] = ["basic", "retry", "parallel", "multiturn"];

/// A recorded fixture of hermes-agent 0.19.0 (one of [`FIXTURES`]), in
/// `tests/fixtures/hermes-0.19.0` or `$HERMES_FIXTURES_DIR`.
pub fn fixture(name: &str) -> PathBuf {
    let dir = std::env::var_os("HERMES_FIXTURES_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::tests_dir().join("fixtures/hermes-0.19.0"));
    dir.join(format!("{name}.jsonl"))
}

/// The records of a recorded fixture (one JSON object per line).
pub fn fixture_records(name: &str) -> Vec<Json> {
    let path = fixture(name);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Recorded hook calls as wire events at capture level `metadata`,
/// converted exactly as the shim does (numbered from 1, attempts stamped).
pub fn events_of(records: &[Json]) -> Vec<Event> {
    events_at(records, CaptureLevel::Metadata)
}

/// As [`events_of`] at capture `level` (the hooks it does not register
/// are skipped, as the shim never sees them).
pub fn events_at(records: &[Json], level: CaptureLevel) -> Vec<Event> {
    let mut tracker = AttemptTracker::new(64);
    let mut events = Vec::new();
    for r in records {
        let hook = r["hook"].as_str().unwrap();
        if !level.hooks().contains(&hook) {
            continue;
        }
        let stamp = Stamp {
            seq: events.len() as u64 + 1,
            hook,
            time_unix_nano: (r["t_wall"].as_f64().unwrap() * 1e9) as u64,
            mono_nano: (r["t_mono"].as_f64().unwrap() * 1e9) as u64,
            thread: r["thread"].as_str().unwrap_or(""),
        };
        let mut event = to_event(&stamp, &JsonKwargs(r["kwargs"].as_object().unwrap()), level);
        tracker.stamp(&mut event);
        events.push(event);
    }
    events
}

/// The basic fixture (one turn: two chats, one tool call) as wire events.
pub fn basic_events() -> Vec<Event> {
    events_of(&fixture_records("basic"))
}

/// Fixture `name` as wire events at capture `metadata` and at `content`.
pub fn fixture_events_both_levels(name: &str) -> [Vec<Event>; 2] {
    let records = fixture_records(name);
    [
        events_at(&records, CaptureLevel::Metadata),
        events_at(&records, CaptureLevel::Content),
    ]
}

/// The basic fixture's events before its turn's end (`post_llm_call`):
/// a turn still open.
pub fn basic_open_turn() -> Vec<Event> {
    let mut events = basic_events();
    let end = events
        .iter()
        .position(|e| e.hook == "post_llm_call")
        .unwrap_or(events.len());
    events.truncate(end);
    events
}

pub fn shim_info(instance_id: &str) -> ShimInfo {
    ShimInfo {
        instance_id: instance_id.into(),
        service_name: "security-test".into(),
        host_name: "host".into(),
        pid: 1,
        shim_version: "test".into(),
        capture: "metadata".into(),
    }
}

pub fn batch_of(instance_id: &str, events: Vec<Event>) -> EventBatch {
    EventBatch {
        shim: Some(shim_info(instance_id)),
        events,
        ..Default::default()
    }
}

/// A client of the ingest at `endpoint` (`http://…`, `https://…` with
/// `tls`, or `unix:…`); a failed connection (the TLS handshake included) as
/// text.
pub async fn connect(
    endpoint: &str,
    tls: Option<ClientTlsConfig>,
) -> Result<EventIngestClient<Channel>, String> {
    let mut channel = Endpoint::from_shared(endpoint.to_owned())
        .map_err(|e| format!("endpoint {endpoint}: {e:?}"))?
        .connect_timeout(Duration::from_secs(5));
    if let Some(tls) = tls {
        channel = channel
            .tls_config(tls)
            .map_err(|e| format!("tls config: {e:?}"))?;
    }
    let channel = channel
        .connect()
        .await
        .map_err(|e| format!("connect {endpoint}: {e:?}"))?;
    Ok(EventIngestClient::new(channel))
}

/// Opens one stream on `client` with `authorization` metadata if given,
/// sends `batches` and returns the last seqs of the acks, or the status the
/// call or the stream ended with. Panics when an acknowledgement takes more
/// than 30 s.
pub async fn stream_batches(
    client: &mut EventIngestClient<Channel>,
    authorization: Option<&str>,
    batches: Vec<EventBatch>,
) -> Result<Vec<u64>, tonic::Status> {
    let expected = batches.len();
    let mut request = tonic::Request::new(tokio_stream::iter(batches));
    if let Some(value) = authorization {
        request
            .metadata_mut()
            .insert("authorization", value.parse().unwrap());
    }
    let acks = client.stream(request).await?.into_inner();
    last_seqs(acks, expected).await
}

/// The last seqs of the first `expected` acknowledgements on `acks`, or
/// the status the stream ended with. Panics when one takes more than 30 s.
async fn last_seqs(
    mut acks: tonic::Streaming<hermes_proto::v1::Ack>,
    expected: usize,
) -> Result<Vec<u64>, tonic::Status> {
    let mut seqs = Vec::new();
    while seqs.len() < expected {
        match tokio::time::timeout(WAIT, acks.message()).await {
            Ok(Ok(Some(ack))) => seqs.push(ack.last_seq),
            Ok(Ok(None)) => break,
            Ok(Err(status)) => return Err(status),
            Err(_) => panic!("no acknowledgement within {WAIT:?}"),
        }
    }
    Ok(seqs)
}

/// One stream of a shim in fleet mode (`hermes-fleet: 1`): where its
/// further batches go (dropping it ends the stream), its acknowledgements
/// (settlement-only acks and `leave` among them), and whether the
/// collector answered `hermes-settles: 1`.
pub struct FleetStream {
    pub batches: tokio::sync::mpsc::Sender<EventBatch>,
    pub acks: tonic::Streaming<hermes_proto::v1::Ack>,
    pub settles: bool,
}

/// Opens a fleet stream on `client`, `first` its first batch.
pub async fn fleet_stream(
    client: &mut EventIngestClient<Channel>,
    first: EventBatch,
) -> Result<FleetStream, tonic::Status> {
    let (batches, rx) = tokio::sync::mpsc::channel(16);
    batches
        .send(first)
        .await
        .map_err(|_| tonic::Status::internal("stream closed"))?;
    let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    request.metadata_mut().insert(
        "hermes-fleet",
        tonic::metadata::MetadataValue::from_static("1"),
    );
    let response = client.stream(request).await?;
    let settles = response
        .metadata()
        .get("hermes-settles")
        .is_some_and(|v| v == "1");
    Ok(FleetStream {
        batches,
        acks: response.into_inner(),
        settles,
    })
}

impl FleetStream {
    /// Ends the stream (as a shim does after its handoff, or as it dies).
    pub fn end(&mut self) {
        let (closed, _) = tokio::sync::mpsc::channel(1);
        drop(std::mem::replace(&mut self.batches, closed));
    }

    /// The next acknowledgement, within 30 s; None when the stream ended.
    pub async fn next_ack(&mut self) -> Result<Option<hermes_proto::v1::Ack>, tonic::Status> {
        match tokio::time::timeout(WAIT, self.acks.message()).await {
            Ok(next) => next,
            Err(_) => panic!("no acknowledgement within {WAIT:?}"),
        }
    }
}

/// Runs `future` to completion on a runtime of its own, for plain
/// `#[test]`s.
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(future)
}

/// [`stream_batches`] on a new connection to `endpoint` (`http://…` or
/// `unix:…`), from a plain `#[test]`.
pub fn exchange(
    endpoint: &str,
    authorization: Option<&str>,
    batches: Vec<EventBatch>,
) -> Result<Vec<u64>, tonic::Status> {
    block_on(async {
        let mut client = connect(endpoint, None)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        stream_batches(&mut client, authorization, batches).await
    })
}

/// A message sent as the bytes it is, for a client that writes what no
/// shim would (a malformed `EventBatch` in a well-formed gRPC frame).
#[derive(Clone, PartialEq, Default)]
struct RawMessage(Vec<u8>);

impl std::fmt::Debug for RawMessage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RawMessage({} bytes)", self.0.len())
    }
}

impl prost::Message for RawMessage {
    fn encode_raw(&self, buf: &mut impl prost::bytes::BufMut) {
        buf.put_slice(&self.0);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: prost::encoding::WireType,
        buf: &mut impl prost::bytes::Buf,
        ctx: prost::encoding::DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        prost::encoding::skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        self.0.len()
    }

    fn clear(&mut self) {
        self.0.clear();
    }
}

/// [`exchange`] with each message given as its bytes on the wire: the
/// acknowledgements' last seqs, or the status the stream ended with.
pub fn exchange_raw(endpoint: &str, messages: Vec<Vec<u8>>) -> Result<Vec<u64>, tonic::Status> {
    block_on(async {
        let expected = messages.len();
        let acks = raw_stream(endpoint, tokio_stream::iter(messages)).await?;
        last_seqs(acks, expected).await
    })
}

/// A stream to `endpoint` on a new connection that sends each of
/// `messages` as the bytes it is: its acknowledgements.
pub async fn raw_stream(
    endpoint: &str,
    messages: impl tokio_stream::Stream<Item = Vec<u8>> + Send + 'static,
) -> Result<tonic::Streaming<hermes_proto::v1::Ack>, tonic::Status> {
    let channel = Endpoint::from_shared(endpoint.to_owned())
        .unwrap()
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect {endpoint}: {e:?}"));
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let request = tonic::Request::new(tokio_stream::StreamExt::map(messages, RawMessage));
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(
        "/hermes.collector.v1.EventIngest/Stream",
    );
    let codec = hermes_proto::codec::SliceCodec::<RawMessage, hermes_proto::v1::Ack>::default();
    Ok(grpc.streaming(request, path, codec).await?.into_inner())
}

/// Sends the basic fixture's events as instance `instance_id` on a new
/// stream to `endpoint` and asserts that every one was acknowledged.
pub fn send_basic_turn(endpoint: &str, instance_id: &str) {
    let events = basic_events();
    let last: Vec<u64> = events.last().map(|e| e.seq).into_iter().collect();
    let acks = exchange(endpoint, None, vec![batch_of(instance_id, events)])
        .unwrap_or_else(|status| panic!("the basic turn of {instance_id} was refused: {status:?}"));
    assert_eq!(acks, last, "one ack, of the last event");
}

/// [`exchange`] over TLS with `tls`; any failure, of the handshake
/// included, as text.
pub fn exchange_tls(
    endpoint: &str,
    tls: ClientTlsConfig,
    batches: Vec<EventBatch>,
) -> Result<Vec<u64>, String> {
    block_on(async {
        let mut client = connect(endpoint, Some(tls)).await?;
        stream_batches(&mut client, None, batches)
            .await
            .map_err(|status| format!("stream: {status:?}"))
    })
}

/// What a rate limit test sees: the flooding stream's `flood` (its
/// acknowledgements, and how long it took) was paced, never refused: one
/// acknowledgement per batch of `batches`, the last `last_seq`, no sooner
/// than `at_least`; and a stream beside it that took `honest_took` was not
/// (under half the flood's time).
pub fn assert_paced(
    flood: (Result<Vec<u64>, tonic::Status>, Duration),
    batches: usize,
    last_seq: u64,
    at_least: Duration,
    honest_took: Duration,
) {
    let (acks, flood_took) = flood;
    let acks = acks.unwrap_or_else(|status| panic!("paced, never refused: {status:?}"));
    assert_eq!(acks.len(), batches, "one ack a batch: {acks:?}");
    assert_eq!(acks.last(), Some(&last_seq));
    assert!(
        flood_took >= at_least,
        "the flood took {flood_took:?}, under {at_least:?}"
    );
    assert!(
        honest_took < flood_took / 2,
        "{honest_took:?} vs {flood_took:?}"
    );
}
