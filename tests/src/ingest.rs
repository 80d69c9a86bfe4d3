//! Agents' events over the wire protocol, for tests that play an agent (or
//! an attacker) without the real one: the recorded fixtures converted
//! exactly as the shim converts them, batches with a shim identity, and one
//! stream exchange that returns the acknowledgements or the refusal.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::time::Duration;

use hermes_collector_shim::attempts::AttemptTracker;
use hermes_collector_shim::config::CaptureLevel;
use hermes_collector_shim::convert::{JsonKwargs, Stamp, to_event};
use hermes_proto::v1::event_ingest_client::EventIngestClient;
use hermes_proto::v1::{Event, EventBatch, ShimInfo};
use serde_json::Value as Json;

/// How long an exchange waits for each acknowledgement.
const WAIT: Duration = Duration::from_secs(30);

/// A recorded fixture of hermes-agent 0.19.0 (`basic`, `retry`, ...).
pub fn fixture(name: &str) -> PathBuf {
    crate::tests_dir().join(format!("fixtures/hermes-0.19.0/{name}.jsonl"))
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
    let level = CaptureLevel::Metadata;
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

/// Opens one stream to `endpoint` (`http://…` or `unix:…`) with `authorization`
/// metadata if given, sends `batches` and returns the last seqs of the acks,
/// or the status the call or the stream ended with.
pub fn exchange(
    endpoint: &str,
    authorization: Option<&str>,
    batches: Vec<EventBatch>,
) -> Result<Vec<u64>, tonic::Status> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(endpoint.to_owned())
            .unwrap()
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .unwrap_or_else(|e| panic!("connect {endpoint}: {e:?}"));
        let mut client = EventIngestClient::new(channel);
        let expected = batches.len();
        let mut request = tonic::Request::new(tokio_stream::iter(batches));
        if let Some(value) = authorization {
            request
                .metadata_mut()
                .insert("authorization", value.parse().unwrap());
        }
        let mut acks = client.stream(request).await?.into_inner();
        let mut seqs = Vec::new();
        while seqs.len() < expected {
            match tokio::time::timeout(WAIT, acks.message()).await {
                Ok(Ok(Some(ack))) => seqs.push(ack.last_seq),
                Ok(Ok(None)) => break,
                Ok(Err(status)) => return Err(status),
                Err(_) => panic!("no answer from {endpoint} within {WAIT:?}"),
            }
        }
        Ok(seqs)
    })
}
