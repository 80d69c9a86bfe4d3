//! The service in process, over real sockets: bearer tokens, oversized
//! messages and events, per-stream rate limits, Unix sockets.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use hermes_proto::v1::event_ingest_client::EventIngestClient;
use hermes_proto::v1::{Event, EventBatch, ShimInfo};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint};

use super::*;
use hermes_e2e::ingest::{assert_paced, stream_batches};

const WAIT: Duration = Duration::from_secs(10);

struct Server {
    endpoint: String,
    stats: Arc<ReceiverStats>,
    stop: CancellationToken,
    served: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
    _batches: tokio::task::JoinHandle<()>,
}

/// A server on `addr` whose pipeline side is the test's (it gets the
/// `Ingested`s), its service set up by `setup`.
async fn serve(
    addr: ListenAddr,
    limits: Limits,
    setup: impl FnOnce(Ingest) -> Ingest,
) -> (Server, mpsc::Receiver<Ingested>) {
    let listener = Listener::bind(&addr).await.unwrap();
    let endpoint = match listener.local_addr().unwrap() {
        ListenAddr::Tcp(addr) => format!("http://{addr}"),
        unix @ ListenAddr::Unix(_) => unix.to_string(),
    };
    let (tx, rx) = mpsc::channel(64);
    let stats = Arc::new(ReceiverStats::default());
    let stop = CancellationToken::new();
    let ingest = setup(Ingest::new(tx, limits, stats.clone(), stop.clone()));
    let served = tokio::spawn(ingest.serve(listener, None, stop.clone()));
    let server = Server {
        endpoint,
        stats,
        stop,
        served,
        _batches: tokio::spawn(async {}),
    };
    (server, rx)
}

/// A server on `addr` that takes every batch, asking for `token` when set.
async fn start(addr: ListenAddr, limits: Limits, token: Option<&str>) -> Server {
    let token = token.map(|t| BearerToken::new(t).unwrap());
    let (mut server, mut rx) = serve(addr, limits, |ingest| ingest.with_token(token)).await;
    server._batches = tokio::spawn(async move { while rx.recv().await.is_some() {} });
    server
}

/// A server on loopback TCP that takes every batch, its limits the
/// defaults changed by `set`.
async fn start_tcp(set: impl FnOnce(&mut Limits)) -> Server {
    let mut limits = Limits::default();
    set(&mut limits);
    start(loopback(), limits, None).await
}

fn loopback() -> ListenAddr {
    ListenAddr::Tcp(([127, 0, 0, 1], 0).into())
}

async fn client(endpoint: &str) -> EventIngestClient<Channel> {
    hermes_e2e::ingest::connect(endpoint, None).await.unwrap()
}

fn batch(first_seq: u64, padding: usize) -> EventBatch {
    EventBatch {
        shim: Some(ShimInfo {
            instance_id: "i-1".into(),
            ..Default::default()
        }),
        events: vec![Event {
            seq: first_seq,
            hook: "x".repeat(padding.max(1)),
            ..Default::default()
        }],
        ..Default::default()
    }
}

#[tokio::test]
async fn bearer_token_is_required_and_failures_are_counted() {
    let server = start(loopback(), Limits::default(), Some("s3cret-token")).await;
    let mut client = client(&server.endpoint).await;

    let missing = stream_batches(&mut client, None, vec![batch(1, 1)])
        .await
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::Unauthenticated);
    assert_eq!(missing.message(), "missing bearer token");
    let wrong = stream_batches(&mut client, Some("Bearer guess"), vec![batch(1, 1)])
        .await
        .unwrap_err();
    assert_eq!(wrong.code(), tonic::Code::Unauthenticated);
    assert_eq!(wrong.message(), "invalid bearer token");
    assert!(!format!("{wrong:?}").contains("s3cret"));
    assert_eq!(server.stats.auth_failures.load(Ordering::Relaxed), 2);
    assert_eq!(server.stats.streams_opened.load(Ordering::Relaxed), 0);

    let acks = stream_batches(
        &mut client,
        Some("Bearer s3cret-token"),
        vec![batch(1, 1), batch(2, 1)],
    )
    .await
    .unwrap();
    assert_eq!(acks, [1, 2]);
    assert_eq!(server.stats.auth_failures.load(Ordering::Relaxed), 2);
    assert_eq!(server.stats.events_accepted.load(Ordering::Relaxed), 2);
    server.stop.cancel();
}

#[tokio::test]
async fn oversized_message_is_refused_and_other_streams_go_on() {
    let server = start_tcp(|l| l.max_message_bytes = 4096).await;
    let mut flooder = client(&server.endpoint).await;
    let mut honest = client(&server.endpoint).await;

    let huge = stream_batches(&mut flooder, None, vec![batch(1, 1), batch(2, 1 << 20)])
        .await
        .unwrap_err();
    assert_eq!(huge.code(), tonic::Code::ResourceExhausted, "{huge:?}");
    assert_eq!(server.stats.batches_refused.load(Ordering::Relaxed), 1);

    let acks = stream_batches(&mut honest, None, vec![batch(1, 100), batch(2, 100)])
        .await
        .unwrap();
    assert_eq!(acks, [1, 2]);
    // The flooder's connection itself still works for well-formed streams.
    let acks = stream_batches(&mut flooder, None, vec![batch(3, 100)])
        .await
        .unwrap();
    assert_eq!(acks, [3]);
    server.stop.cancel();
}

#[tokio::test]
async fn serves_on_a_unix_socket_and_removes_it_at_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ingest.sock");
    let server = start(
        ListenAddr::Unix(path.clone()),
        Limits::default(),
        Some("tok"),
    )
    .await;
    assert_eq!(server.endpoint, format!("unix:{}", path.display()));
    let mut client = client(&server.endpoint).await;
    let acks = stream_batches(&mut client, Some("Bearer tok"), vec![batch(1, 1)])
        .await
        .unwrap();
    assert_eq!(acks, [1]);
    let refused = stream_batches(&mut client, None, vec![batch(2, 1)])
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);

    drop(client);
    server.stop.cancel();
    tokio::time::timeout(WAIT, server.served)
        .await
        .expect("server stops")
        .unwrap()
        .unwrap();
    assert!(!path.exists(), "the socket file is removed at shutdown");
}

/// A loopback server whose pipeline side is the test's: it gets the
/// `Ingested`s.
async fn start_with(
    delivery: Delivery,
    memory: Option<Arc<MemoryLimit>>,
) -> (Server, mpsc::Receiver<Ingested>) {
    serve(loopback(), Limits::default(), |ingest| {
        ingest.with_delivery(delivery).with_memory_limit(memory)
    })
    .await
}

#[tokio::test]
async fn durable_delivery_acks_in_order_once_written_and_never_a_lost_write() {
    let (server, mut pipeline) = start_with(Delivery::Durable, None).await;
    let mut client = client(&server.endpoint).await;
    let (tx, rx) = mpsc::channel(8);
    let mut acks = client
        .stream(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    for seq in 1..=3 {
        tx.send(batch(seq, 1)).await.unwrap();
    }
    let mut got: Vec<Ingested> = Vec::new();
    while got.len() < 3 {
        got.push(
            tokio::time::timeout(WAIT, pipeline.recv())
                .await
                .unwrap()
                .unwrap(),
        );
    }
    // Nothing is acknowledged before the queue says the batch is written.
    assert!(
        tokio::time::timeout(Duration::from_millis(200), acks.message())
            .await
            .is_err()
    );
    // Written out of order: acks still come in stream order.
    let [first, second, third]: [Ingested; 3] = got.try_into().unwrap();
    second.safe.unwrap().send(()).unwrap();
    first.safe.unwrap().send(()).unwrap();
    assert_eq!(acks.message().await.unwrap().unwrap().last_seq, 1);
    assert_eq!(acks.message().await.unwrap().unwrap().last_seq, 2);
    // A failed write (the signal dropped unfired) ends the stream with
    // UNAVAILABLE: the shim resends batch 3.
    drop(third.safe);
    let status = acks.message().await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    server.stop.cancel();
}

#[tokio::test]
async fn above_the_memory_limit_batches_are_refused_with_unavailable() {
    let limit = MemoryLimit::new(1, Duration::from_secs(3600));
    let (server, mut pipeline) = start_with(Delivery::Memory, Some(limit)).await;
    let mut client = client(&server.endpoint).await;
    let refused = stream_batches(&mut client, None, vec![batch(1, 1)])
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains("memory limit"), "{refused:?}");
    assert_eq!(server.stats.memory_refusals.load(Ordering::Relaxed), 1);
    assert!(pipeline.try_recv().is_err(), "nothing reached the pipeline");
    server.stop.cancel();
}

#[tokio::test]
async fn a_batch_is_decoded_only_once_the_pipeline_has_room_for_it() {
    // The pipeline takes nothing: its queue (64 batches) fills, and the next
    // batch waits as its bytes. One whose instance id is not UTF-8, which
    // only decoding finds, is refused once there is room, not before.
    let (server, mut pipeline) = serve(loopback(), Limits::default(), |ingest| ingest).await;
    let (tx, rx) = mpsc::channel(128);
    let mut acks = hermes_e2e::ingest::raw_stream(
        &server.endpoint,
        tokio_stream::wrappers::ReceiverStream::new(rx),
    )
    .await
    .unwrap();
    for seq in 1..=64 {
        tx.send(prost::Message::encode_to_vec(&batch(seq, 1)))
            .await
            .unwrap();
        let ack = tokio::time::timeout(WAIT, acks.message()).await.unwrap();
        assert_eq!(ack.unwrap().unwrap().last_seq, seq);
    }
    let mut bad = prost::Message::encode_to_vec(&batch(65, 1));
    let at = bad.windows(3).position(|w| w == b"i-1").unwrap();
    bad[at] = 0xff;
    tx.send(bad).await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(300), acks.message())
            .await
            .is_err(),
        "refused while the queue was full"
    );
    assert!(pipeline.recv().await.is_some());
    let refused = tokio::time::timeout(WAIT, acks.message())
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Internal, "{refused:?}");
    server.stop.cancel();
}

/// A batch of `n` small events from `first_seq` on, of instance `instance`.
fn events_batch(instance: &str, first_seq: u64, n: u64) -> EventBatch {
    EventBatch {
        shim: Some(ShimInfo {
            instance_id: instance.into(),
            ..Default::default()
        }),
        events: (first_seq..first_seq + n)
            .map(|seq| Event {
                seq,
                hook: "pre_tool_call".into(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

#[tokio::test]
async fn an_event_above_max_event_bytes_is_refused_naming_the_limit() {
    let server = start_tcp(|l| l.max_event_bytes = 1000).await;
    let mut sender = client(&server.endpoint).await;

    // The message is far below max_message_bytes; one event is not.
    let mut big = events_batch("i-1", 1, 3);
    big.events[1].hook = "x".repeat(2000);
    let refused = stream_batches(&mut sender, None, vec![events_batch("i-1", 10, 1), big])
        .await
        .unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    assert!(refused.message().contains("max_event_bytes"), "{refused:?}");
    assert!(refused.message().contains("seq 2"), "{refused:?}");
    assert_eq!(server.stats.oversized_events.load(Ordering::Relaxed), 1);
    assert_eq!(server.stats.batches_refused.load(Ordering::Relaxed), 1);
    // The batch before it was accepted; other streams go on.
    assert_eq!(server.stats.batches_accepted.load(Ordering::Relaxed), 1);
    let acks = stream_batches(&mut sender, None, vec![events_batch("i-1", 20, 3)])
        .await
        .unwrap();
    assert_eq!(acks, [22]);
    server.stop.cancel();
}

#[tokio::test]
async fn a_stream_over_its_rate_is_read_slower_and_other_streams_are_not() {
    // 100 events/s, bursts of 20: 200 events take about 1.8 s.
    let server = start_tcp(|l| {
        l.stream_events_per_sec = 100;
        l.stream_burst_events = 20;
    })
    .await;
    let mut flooder = client(&server.endpoint).await;
    let mut honest = client(&server.endpoint).await;

    let started = tokio::time::Instant::now();
    let flood = tokio::spawn(async move {
        let batches = (0..40)
            .map(|i| events_batch("flood", 1 + i * 5, 5))
            .collect();
        let acks = stream_batches(&mut flooder, None, batches).await;
        (acks, started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The flooder is being paced now; another stream is read at once.
    let honest_started = tokio::time::Instant::now();
    let acks = stream_batches(
        &mut honest,
        None,
        vec![
            events_batch("honest", 1, 10),
            events_batch("honest", 11, 10),
        ],
    )
    .await
    .unwrap();
    let honest_took = honest_started.elapsed();
    assert_eq!(acks, [10, 20]);
    assert!(!flood.is_finished(), "the flood was not paced");

    let flood = tokio::time::timeout(WAIT, flood).await.unwrap().unwrap();
    // 200 events at 100/s after a burst of 20.
    assert_paced(flood, 40, 200, Duration::from_millis(1500), honest_took);
    let throttled = server.stats.throttled_batches.load(Ordering::Relaxed);
    assert!((30..=40).contains(&throttled), "{throttled}");
    assert_eq!(server.stats.batches_refused.load(Ordering::Relaxed), 0);
    assert_eq!(server.stats.events_accepted.load(Ordering::Relaxed), 220);
    server.stop.cancel();
}

#[tokio::test]
async fn one_connection_gets_at_most_its_stream_limit() {
    let server = start_tcp(|l| l.max_streams_per_connection = 1).await;
    // Two clients over one connection.
    let mut first = client(&server.endpoint).await;
    let mut second = first.clone();
    let (tx, rx) = mpsc::channel(4);
    let mut acks = first
        .stream(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    tx.send(batch(1, 1)).await.unwrap();
    assert_eq!(acks.message().await.unwrap().unwrap().last_seq, 1);
    // The second stream waits for a free slot instead of running beside it.
    let waiting = stream_batches(&mut second, None, vec![batch(1, 1)]);
    tokio::pin!(waiting);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut waiting)
            .await
            .is_err()
    );
    drop(tx);
    drop(acks);
    let acks = tokio::time::timeout(WAIT, waiting).await.unwrap().unwrap();
    assert_eq!(acks, [1]);
    server.stop.cancel();
}

#[tokio::test]
async fn a_connection_that_answers_no_ping_is_closed() {
    let server = start_tcp(|l| {
        l.keepalive_interval = Duration::from_millis(100);
        l.keepalive_timeout = Duration::from_millis(100);
    })
    .await;
    let addr = server.endpoint.trim_start_matches("http://").to_owned();
    // A client that says hello in HTTP/2 and then falls silent, as one whose
    // host vanished: it reads, but answers nothing (not even the ping).
    let mut peer = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    hello.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]); // empty SETTINGS
    tokio::io::AsyncWriteExt::write_all(&mut peer, &hello)
        .await
        .unwrap();
    let closed = async {
        let mut buf = [0u8; 1024];
        loop {
            match tokio::io::AsyncReadExt::read(&mut peer, &mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(WAIT, closed)
        .await
        .expect("the silent connection was not closed");
    server.stop.cancel();
}

/// A shim of a release this collector does not know is accepted, counted
/// under its version and logged; a known release is not counted.
#[tokio::test]
async fn an_unknown_shim_version_is_accepted_and_counted() {
    let server = start_tcp(|_| {}).await;
    let mut client = client(&server.endpoint).await;
    let from = |version: &str, seq: u64| {
        let mut batch = batch(seq, 1);
        if let Some(shim) = batch.shim.as_mut() {
            shim.shim_version = version.to_owned();
        }
        batch
    };
    let own = versions::COLLECTOR_VERSION;
    let acks = stream_batches(&mut client, None, vec![from(own, 1), from(own, 2)])
        .await
        .unwrap();
    assert_eq!(acks, [1, 2]);
    assert!(server.stats.unknown_shim_versions.snapshot().is_empty());
    for seq in [3, 4] {
        // Two streams of two batches each: counted once per stream.
        let acks = stream_batches(
            &mut client,
            None,
            vec![from("99.1.0", seq * 10), from("99.1.0", seq * 10 + 1)],
        )
        .await
        .unwrap();
        assert_eq!(acks, [seq * 10, seq * 10 + 1]);
    }
    assert_eq!(
        server.stats.unknown_shim_versions.snapshot(),
        [("99.1.0".to_owned(), 2)]
    );
    assert_eq!(server.stats.events_accepted.load(Ordering::Relaxed), 6);
    server.stop.cancel();
}

/// A shim of another release of the wire protocol gets `UNIMPLEMENTED`
/// naming the protocol this collector reads; the call is counted, and v1
/// streams on the same connection go on.
#[tokio::test]
async fn another_wire_protocol_is_refused_with_a_clear_error() {
    use hermes_proto::codec::SliceCodec;
    use hermes_proto::v1::Ack;
    use tonic::codegen::http::uri::PathAndQuery;

    let server = start_tcp(|_| {}).await;
    let channel = Endpoint::from_shared(server.endpoint.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.unwrap();
    let refused = grpc
        .streaming(
            tonic::Request::new(tokio_stream::iter(vec![batch(1, 1)])),
            PathAndQuery::from_static("/hermes.collector.v2.EventIngest/Stream"),
            SliceCodec::<EventBatch, Ack>::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unimplemented, "{refused:?}");
    assert!(
        refused
            .message()
            .contains("reads the wire protocol hermes.collector.v1 only")
            && refused.message().contains("hermes.collector.v2"),
        "{refused:?}"
    );
    assert_eq!(
        server.stats.unreadable_wire_calls.load(Ordering::Relaxed),
        1
    );
    let acks = stream_batches(
        &mut EventIngestClient::new(channel),
        None,
        vec![batch(1, 1)],
    )
    .await
    .unwrap();
    assert_eq!(acks, [1]);
    assert_eq!(
        server.stats.unreadable_wire_calls.load(Ordering::Relaxed),
        1
    );
    server.stop.cancel();
}

/// A server whose pipeline side is the test's, settling into the
/// returned registry.
async fn serve_fleet() -> (Server, mpsc::Receiver<Ingested>, Arc<Settlements>) {
    let settlements = Arc::new(Settlements::default());
    let (server, pipeline) = serve(loopback(), Limits::default(), {
        let settlements = settlements.clone();
        |ingest| ingest.with_settlements(settlements)
    })
    .await;
    (server, pipeline, settlements)
}

/// A stream call in fleet mode sending what `rx` gives.
fn fleet_request(
    rx: mpsc::Receiver<EventBatch>,
) -> tonic::Request<tokio_stream::wrappers::ReceiverStream<EventBatch>> {
    let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    request
        .metadata_mut()
        .insert(fleet::FLEET_METADATA, "1".parse().unwrap());
    request
}

/// Waits (at most [`WAIT`]) until `done`, failing with `what`.
async fn eventually(what: &str, done: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_fleet_stream_learns_settlement_and_leave_and_hands_off() {
    let (server, mut pipeline, settlements) = serve_fleet().await;
    let mut client = client(&server.endpoint).await;
    let (tx, rx) = mpsc::channel(8);
    let request = fleet_request(rx);
    tx.send(batch(1, 1)).await.unwrap();
    let response = client.stream(request).await.unwrap();
    assert_eq!(
        response.metadata().get(fleet::SETTLES_HEADER).unwrap(),
        "1",
        "this collector settles"
    );
    let mut acks = response.into_inner();
    let ack = acks.message().await.unwrap().unwrap();
    assert_eq!((ack.first_seq, ack.last_seq, ack.settled_seq), (1, 1, 0));
    let ingested = tokio::time::timeout(WAIT, pipeline.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(
        ingested.fleet,
        "the pipeline knows the batch's shim keeps it"
    );
    assert!(settlements.is_connected("i-1"));

    // The stage settled seq 1: a settlement-only ack.
    settlements.publish("i-1", 1);
    let ack = tokio::time::timeout(WAIT, acks.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!((ack.first_seq, ack.last_seq, ack.settled_seq), (0, 0, 1));
    assert!(!ack.leave);
    // A second stream of the instance (a reconnect before the first one is
    // gone) learns the current value at once.
    let (tx2, rx2) = mpsc::channel(8);
    tx2.send(batch(2, 1)).await.unwrap();
    let mut acks2 = client
        .stream(fleet_request(rx2))
        .await
        .unwrap()
        .into_inner();
    let mut got = Vec::new();
    for _ in 0..2 {
        let ack = tokio::time::timeout(WAIT, acks2.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        got.push((ack.last_seq, ack.settled_seq));
    }
    got.sort_unstable();
    assert_eq!(got, [(0, 1), (2, 0)]);
    tokio::time::timeout(WAIT, pipeline.recv())
        .await
        .unwrap()
        .unwrap();
    drop(tx2);
    assert!(acks2.message().await.unwrap().is_none());

    // The drain asks it to leave; it hands off and ends its stream.
    settlements.leave();
    let ack = tokio::time::timeout(WAIT, acks.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(ack.leave, "{ack:?}");
    let mut handoff = batch(1, 1);
    handoff.events.clear();
    handoff.handoff = true;
    tx.send(handoff).await.unwrap();
    let ingested = tokio::time::timeout(WAIT, pipeline.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(ingested.batch.handoff && ingested.fleet);
    assert_eq!(settlements.handoffs(), 1);
    drop(tx);
    assert!(
        tokio::time::timeout(WAIT, acks.message())
            .await
            .unwrap()
            .unwrap()
            .is_none()
    );
    eventually("the stream is gone", || settlements.streams() == 0).await;
    assert!(!settlements.is_connected("i-1"));
    assert!(!settlements.is_abandoned("i-1"), "it handed off");
    server.stop.cancel();
}

#[tokio::test]
async fn a_fleet_stream_that_ends_without_a_handoff_is_abandoned_until_it_returns() {
    let (server, mut pipeline, settlements) = serve_fleet().await;
    let mut client = client(&server.endpoint).await;
    for round in 0..2 {
        let (tx, rx) = mpsc::channel(8);
        let request = fleet_request(rx);
        tx.send(batch(1 + round, 1)).await.unwrap();
        let mut acks = client.stream(request).await.unwrap().into_inner();
        assert_eq!(acks.message().await.unwrap().unwrap().last_seq, 1 + round);
        tokio::time::timeout(WAIT, pipeline.recv())
            .await
            .unwrap()
            .unwrap();
        assert!(!settlements.is_abandoned("i-1"), "connected (again)");
        // The agent goes away without a handoff.
        drop(tx);
        assert!(acks.message().await.unwrap().is_none());
        eventually("presumed dead", || settlements.is_abandoned("i-1")).await;
    }
    server.stop.cancel();
}

#[tokio::test]
async fn a_stream_without_fleet_mode_gets_the_header_and_no_settlement() {
    let (server, mut pipeline, settlements) = serve_fleet().await;
    let mut client = client(&server.endpoint).await;
    let (tx, rx) = mpsc::channel(8);
    tx.send(batch(1, 1)).await.unwrap();
    let response = client
        .stream(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap();
    assert_eq!(response.metadata().get(fleet::SETTLES_HEADER).unwrap(), "1");
    let mut acks = response.into_inner();
    assert_eq!(acks.message().await.unwrap().unwrap().last_seq, 1);
    let ingested = tokio::time::timeout(WAIT, pipeline.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(!ingested.fleet);
    assert!(
        !settlements.is_connected("i-1"),
        "not watched: nothing to tell it"
    );
    assert_eq!(settlements.streams(), 0);
    drop(tx);
    server.stop.cancel();
}
