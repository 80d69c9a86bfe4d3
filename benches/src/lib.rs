//! Shared helpers of the benchmarks: the recorded Hermes hook calls
//! (`tests/fixtures/hermes-0.19.0`), converted exactly as the shim's sender
//! converts them, and the spans the correlator builds from them.
//!
//! Used by the criterion benches (`benches/pipeline.rs`), by the helper
//! binaries of the load runs (`hermes-bench-sink`, `hermes-bench-driver`)
//! and by the load generator (`hermes-loadgen`): the fixture templates and
//! the ingest stream.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use hermes_collector_shim::attempts::AttemptTracker;
use hermes_collector_shim::config::CaptureLevel;
use hermes_collector_shim::convert::{JsonKwargs, Stamp, to_event};
use hermes_correlator::{Config, Correlator, FinishedSpan, to_resource_spans};
use hermes_proto::v1::event_ingest_client::EventIngestClient;
use hermes_proto::v1::{Ack, Event, EventBatch, ShimInfo, event::Body};
use hermes_span::trace::v1::ResourceSpans;
use tokio::sync::mpsc;

/// The fixture files, in the order the load generator rotates them.
pub const FIXTURES: [&str; 4] = [
    "basic.jsonl",
    "retry.jsonl",
    "parallel.jsonl",
    "multiturn.jsonl",
];

/// One recorded hook call.
#[derive(Clone, Debug)]
pub struct Call {
    pub hook: String,
    pub t_wall: f64,
    pub t_mono: f64,
    pub thread: String,
    pub kwargs: serde_json::Map<String, serde_json::Value>,
}

impl Call {
    /// The shim's stamp of this call with sequence number `seq`.
    pub fn stamp(&self, seq: u64) -> Stamp<'_> {
        Stamp {
            seq,
            hook: &self.hook,
            time_unix_nano: secs_to_nanos(self.t_wall),
            mono_nano: secs_to_nanos(self.t_mono),
            thread: &self.thread,
        }
    }
}

fn secs_to_nanos(secs: f64) -> u64 {
    if secs.is_finite() && secs > 0.0 {
        (secs * 1e9) as u64
    } else {
        0
    }
}

/// `tests/fixtures/hermes-0.19.0`, or `HERMES_FIXTURES_DIR`.
pub fn fixtures_dir() -> PathBuf {
    match std::env::var_os("HERMES_FIXTURES_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/hermes-0.19.0"),
    }
}

/// Every call of one fixture file (all hooks, registered or not).
pub fn load_calls(path: &Path) -> anyhow::Result<Vec<Call>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    let mut calls = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("{}: bad JSON line", path.display()))?;
        let Some(kwargs) = v["kwargs"].as_object() else {
            bail!("{}: a line without kwargs", path.display());
        };
        calls.push(Call {
            hook: v["hook"].as_str().unwrap_or_default().to_owned(),
            t_wall: v["t_wall"].as_f64().unwrap_or(0.0),
            t_mono: v["t_mono"].as_f64().unwrap_or(0.0),
            thread: v["thread"].as_str().unwrap_or("MainThread").to_owned(),
            kwargs: kwargs.clone(),
        });
    }
    if calls.is_empty() {
        bail!("{}: no calls", path.display());
    }
    Ok(calls)
}

/// Every call of the fixture `name` (one of [`FIXTURES`]).
pub fn load_fixture(name: &str) -> anyhow::Result<Vec<Call>> {
    load_calls(&fixtures_dir().join(name))
}

/// The events the shim sends for `calls` at `level`: registered hooks only,
/// seqs from 1 without holes, API attempts numbered.
pub fn convert(calls: &[Call], level: CaptureLevel) -> Vec<Event> {
    let mut attempts = AttemptTracker::new(4096);
    calls
        .iter()
        .filter(|c| level.hooks().contains(&c.hook.as_str()))
        .enumerate()
        .map(|(i, c)| {
            let mut event = to_event(&c.stamp(i as u64 + 1), &JsonKwargs(&c.kwargs), level);
            attempts.stamp(&mut event);
            event
        })
        .collect()
}

/// A shim identity for instance `index`.
pub fn shim_info(index: u64, level: CaptureLevel) -> ShimInfo {
    ShimInfo {
        instance_id: format!(
            "{:032x}",
            (u128::from(std::process::id()) << 64) | u128::from(index)
        ),
        service_name: "hermes-bench".into(),
        host_name: "bench".into(),
        pid: std::process::id(),
        shim_version: env!("CARGO_PKG_VERSION").into(),
        capture: level.as_str().into(),
    }
}

/// The spans the correlator builds from `events` (everything flushed).
pub fn correlate(shim: &ShimInfo, events: &[Event]) -> Vec<FinishedSpan> {
    let mut correlator = Correlator::new(Config::default());
    let mut out = Vec::new();
    for event in events {
        correlator.ingest(shim, event, &mut out);
    }
    correlator.flush_all(&mut out);
    out
}

/// An export batch of about `spans` spans (whole fixture turns in rotation,
/// every turn under its own resource as with many agents), as the
/// correlation stage hands it to the processor.
pub fn span_batch(level: CaptureLevel, spans: usize) -> anyhow::Result<Vec<ResourceSpans>> {
    let mut per_fixture = Vec::new();
    for name in FIXTURES {
        let events = convert(&load_fixture(name)?, level);
        per_fixture.push(events);
    }
    let mut all: Vec<FinishedSpan> = Vec::new();
    let mut index = 0u64;
    while all.len() < spans {
        let events = &per_fixture[index as usize % per_fixture.len()];
        let finished = correlate(&shim_info(index % 8, level), events);
        let room = spans - all.len();
        all.extend(finished.into_iter().take(room));
        index += 1;
    }
    Ok(to_resource_spans(all))
}

/// Number of spans in a batch.
pub fn span_count(batch: &[ResourceSpans]) -> usize {
    batch
        .iter()
        .flat_map(|rs| &rs.scope_spans)
        .map(|ss| ss.spans.len())
        .sum()
}

/// Now, in ns since the epoch.
pub fn now_unix_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// One fixture as a template of turns: its events and the session ids they
/// mention (replaced by fresh ones per replay).
pub struct Template {
    pub events: Vec<Event>,
    pub sessions: Vec<String>,
}

impl Template {
    /// The template of fixture `name` at `level`.
    pub fn load(name: &str, level: CaptureLevel) -> anyhow::Result<Arc<Template>> {
        Template::from_file(&fixtures_dir().join(name), level).map(Arc::new)
    }

    /// The template of the fixture file `path` at `level`.
    pub fn from_file(path: &Path, level: CaptureLevel) -> anyhow::Result<Template> {
        let events = convert(&load_calls(path)?, level);
        let mut sessions: Vec<String> = Vec::new();
        for event in &events {
            if let Some(ids) = &event.ids {
                for s in [
                    &ids.session_id,
                    &ids.parent_session_id,
                    &ids.child_session_id,
                ] {
                    if !s.is_empty() && !sessions.contains(s) {
                        sessions.push(s.clone());
                    }
                }
            }
        }
        Ok(Template { events, sessions })
    }

    /// Capture time of the first event.
    pub fn base(&self) -> u64 {
        self.events.first().map_or(0, |e| e.time_unix_nano)
    }

    /// `event` with every session id replaced by one derived from `tag`.
    pub fn fresh(&self, event: &Event, tag: &str) -> Event {
        self.renamed(event, &format!("b{tag}"))
    }

    /// `event` with the template's session id `i` replaced by
    /// `{prefix}s{i}` in every id that holds it.
    pub fn renamed(&self, event: &Event, prefix: &str) -> Event {
        let mut e = event.clone();
        if let Some(ids) = e.ids.as_mut() {
            for s in [
                &mut ids.session_id,
                &mut ids.turn_id,
                &mut ids.api_request_id,
                &mut ids.tool_call_id,
                &mut ids.parent_session_id,
                &mut ids.parent_turn_id,
                &mut ids.child_session_id,
            ] {
                for (i, old) in self.sessions.iter().enumerate() {
                    if s.contains(old.as_str()) {
                        *s = s.replace(old.as_str(), &format!("{prefix}s{i}"));
                    }
                }
            }
        }
        e
    }

    /// [`Template::fresh`], captured at `now` ([`restamp`]): one event of a
    /// replayed turn.
    pub fn fresh_at(&self, event: &Event, tag: &str, now: u64) -> Event {
        let mut e = self.fresh(event, tag);
        restamp(&mut e, now);
        e
    }
}

/// Moves the capture time of `event` to `now`, and its API start/end times
/// by the same amount.
pub fn restamp(event: &mut Event, now: u64) {
    let old = event.time_unix_nano;
    let shift = |t: &mut u64| {
        if *t != 0 {
            *t = (*t + now).saturating_sub(old);
        }
    };
    if let Some(Body::Api(api)) = event.body.as_mut() {
        shift(&mut api.started_at_unix_nano);
        shift(&mut api.ended_at_unix_nano);
    }
    event.time_unix_nano = now;
}

/// Opens `EventIngest/Stream` on `endpoint`: where to send batches, and
/// the acknowledgements.
pub async fn open_stream(
    endpoint: &str,
) -> anyhow::Result<(mpsc::Sender<EventBatch>, tonic::Streaming<Ack>)> {
    let mut client = EventIngestClient::connect(endpoint.to_owned())
        .await
        .context("connect")?;
    let (tx, rx) = mpsc::channel::<EventBatch>(16);
    let acks = client
        .stream(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .context("open stream")?
        .into_inner();
    Ok((tx, acks))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn fixtures_convert_and_correlate() {
        for name in FIXTURES {
            let events = convert(&load_fixture(name).unwrap(), CaptureLevel::Metadata);
            assert!(!events.is_empty(), "{name}");
            let spans = correlate(&shim_info(0, CaptureLevel::Metadata), &events);
            assert!(spans.len() >= 3, "{name}: {} spans", spans.len());
        }
        let batch = span_batch(CaptureLevel::Content, 100).unwrap();
        assert_eq!(span_count(&batch), 100);
    }

    /// benches/shim_hooks.py is the Python benchmarks' copy of the shim's
    /// metadata hooks: the same names, in the same order.
    #[test]
    fn python_benches_list_the_shims_metadata_hooks() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/shim_hooks.py");
        let text = std::fs::read_to_string(path).unwrap();
        let list = text
            .split_once("METADATA_HOOKS = [")
            .and_then(|(_, rest)| rest.split_once(']'))
            .map(|(list, _)| list)
            .expect("METADATA_HOOKS = [...] in shim_hooks.py");
        let names: Vec<&str> = list
            .split(',')
            .map(|n| n.trim().trim_matches('"'))
            .filter(|n| !n.is_empty())
            .collect();
        assert_eq!(names, hermes_collector_shim::config::METADATA_HOOKS);
    }

    #[test]
    fn restamp_moves_api_times() {
        let template = Template::load("basic.jsonl", CaptureLevel::Metadata).unwrap();
        let post = template
            .events
            .iter()
            .find(|e| e.hook == "post_api_request")
            .unwrap();
        let mut e = template.fresh(post, "x");
        assert!(e.ids.as_ref().unwrap().session_id.starts_with("bxs0"));
        restamp(&mut e, post.time_unix_nano + 1000);
        let Some(Body::Api(api)) = &e.body else {
            panic!("not an api body")
        };
        let Some(Body::Api(orig)) = &post.body else {
            panic!("not an api body")
        };
        assert_eq!(api.ended_at_unix_nano, orig.ended_at_unix_nano + 1000);
    }
}
