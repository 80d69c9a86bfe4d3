//! A minimal collector for trying the shim by hand: accepts
//! `EventIngest/Stream`, acknowledges every batch and prints one line per
//! event to stdout.
//!
//! `cargo run -p hermes-collector-shim --example dump_collector -- 127.0.0.1:4319`

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::pin::Pin;

use hermes_proto::received::ReceivedBatch;
use hermes_proto::server::event_ingest_server::{EventIngest, EventIngestServer};
use hermes_proto::v1::Ack;
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};

struct Dump;

#[tonic::async_trait]
impl EventIngest for Dump {
    type StreamStream =
        Pin<Box<dyn tokio_stream::Stream<Item = Result<Ack, Status>> + Send + 'static>>;

    async fn stream(
        &self,
        request: Request<Streaming<ReceivedBatch>>,
    ) -> Result<Response<Self::StreamStream>, Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(async move {
            while let Ok(Some(ReceivedBatch { batch, .. })) = inbound.message().await {
                let shim = batch.shim.clone().unwrap_or_default();
                println!(
                    "batch instance={} pid={} capture={} events={} dropped={}",
                    shim.instance_id,
                    shim.pid,
                    shim.capture,
                    batch.events.len(),
                    batch.dropped_events
                );
                for e in &batch.events {
                    let mut content: Vec<_> = e.content.keys().cloned().collect();
                    content.sort();
                    println!(
                        "  seq={} hook={} thread={} ids={:?} body={:?} content={:?}",
                        e.seq, e.hook, e.thread, e.ids, e.body, content
                    );
                }
                let ack = Ack {
                    first_seq: batch.events.first().map_or(0, |e| e.seq),
                    last_seq: batch.events.last().map_or(0, |e| e.seq),
                };
                if tx.send(Ok(ack)).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

fn main() {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:4319".to_owned());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&addr).await.unwrap();
        println!("listening on {}", listener.local_addr().unwrap());
        tonic::transport::Server::builder()
            .serve_with_incoming_shutdown(
                EventIngestServer::new(Dump),
                TcpListenerStream::new(listener),
                std::future::pending::<()>(),
            )
            .await
            .unwrap();
    });
}
