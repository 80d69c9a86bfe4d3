//! The service in process, over real sockets: bearer tokens, oversized
//! messages, Unix sockets.

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

const WAIT: Duration = Duration::from_secs(10);

struct Server {
    endpoint: String,
    stats: Arc<ReceiverStats>,
    stop: CancellationToken,
    served: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
    _batches: tokio::task::JoinHandle<()>,
}

async fn start(addr: ListenAddr, limits: Limits, token: Option<&str>) -> Server {
    let listener = Listener::bind(&addr).await.unwrap();
    let endpoint = match listener.local_addr().unwrap() {
        ListenAddr::Tcp(addr) => format!("http://{addr}"),
        unix @ ListenAddr::Unix(_) => unix.to_string(),
    };
    let (tx, mut rx) = mpsc::channel(64);
    let batches = tokio::spawn(async move { while rx.recv().await.is_some() {} });
    let stats = Arc::new(ReceiverStats::default());
    let stop = CancellationToken::new();
    let ingest = Ingest::new(tx, limits, stats.clone(), stop.clone())
        .with_token(token.map(|t| BearerToken::new(t).unwrap()));
    let served = tokio::spawn(ingest.serve(listener, None, stop.clone()));
    Server {
        endpoint,
        stats,
        stop,
        served,
        _batches: batches,
    }
}

async fn client(endpoint: &str) -> EventIngestClient<Channel> {
    let channel = Endpoint::from_shared(endpoint.to_owned())
        .unwrap()
        .connect()
        .await
        .unwrap();
    EventIngestClient::new(channel)
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

/// Opens a stream, sends `batches`, and returns the acks' last seqs or the
/// status the stream ended with.
async fn exchange(
    client: &mut EventIngestClient<Channel>,
    token: Option<&str>,
    batches: Vec<EventBatch>,
) -> Result<Vec<u64>, tonic::Status> {
    let expected = batches.len();
    let mut request = tonic::Request::new(tokio_stream::iter(batches));
    if let Some(token) = token {
        request
            .metadata_mut()
            .insert("authorization", token.parse().unwrap());
    }
    let mut acks = client.stream(request).await?.into_inner();
    let mut seqs = Vec::new();
    while seqs.len() < expected {
        match tokio::time::timeout(WAIT, acks.message()).await {
            Ok(Ok(Some(ack))) => seqs.push(ack.last_seq),
            Ok(Ok(None)) => break,
            Ok(Err(status)) => return Err(status),
            Err(_) => panic!("no answer within {WAIT:?}"),
        }
    }
    Ok(seqs)
}

#[tokio::test]
async fn bearer_token_is_required_and_failures_are_counted() {
    let server = start(
        ListenAddr::Tcp(([127, 0, 0, 1], 0).into()),
        Limits::default(),
        Some("s3cret-token"),
    )
    .await;
    let mut client = client(&server.endpoint).await;

    let missing = exchange(&mut client, None, vec![batch(1, 1)])
        .await
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::Unauthenticated);
    assert_eq!(missing.message(), "missing bearer token");
    let wrong = exchange(&mut client, Some("Bearer guess"), vec![batch(1, 1)])
        .await
        .unwrap_err();
    assert_eq!(wrong.code(), tonic::Code::Unauthenticated);
    assert_eq!(wrong.message(), "invalid bearer token");
    assert!(!format!("{wrong:?}").contains("s3cret"));
    assert_eq!(server.stats.auth_failures.load(Ordering::Relaxed), 2);
    assert_eq!(server.stats.streams_opened.load(Ordering::Relaxed), 0);

    let acks = exchange(
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
    let limits = Limits {
        max_message_bytes: 4096,
        ..Limits::default()
    };
    let server = start(ListenAddr::Tcp(([127, 0, 0, 1], 0).into()), limits, None).await;
    let mut flooder = client(&server.endpoint).await;
    let mut honest = client(&server.endpoint).await;

    let huge = exchange(&mut flooder, None, vec![batch(1, 1), batch(2, 1 << 20)])
        .await
        .unwrap_err();
    assert_eq!(huge.code(), tonic::Code::ResourceExhausted, "{huge:?}");
    assert_eq!(server.stats.batches_refused.load(Ordering::Relaxed), 1);

    let acks = exchange(&mut honest, None, vec![batch(1, 100), batch(2, 100)])
        .await
        .unwrap();
    assert_eq!(acks, [1, 2]);
    // The flooder's connection itself still works for well-formed streams.
    let acks = exchange(&mut flooder, None, vec![batch(3, 100)])
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
    let acks = exchange(&mut client, Some("Bearer tok"), vec![batch(1, 1)])
        .await
        .unwrap();
    assert_eq!(acks, [1]);
    let refused = exchange(&mut client, None, vec![batch(2, 1)])
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
