//! `hermes-loadgen`: streams realistic Hermes turns to a collector over the
//! `hermes.collector.v1` wire protocol, as many shims would.
//!
//! Each simulated agent ("instance") is one stream with its own instance id
//! and contiguous seqs. Its turns are the recorded hook calls of a real
//! Hermes run (`tests/fixtures/hermes-0.19.0/*.jsonl`), converted exactly as
//! the shim converts them (`hermes_collector_shim::convert`), with every
//! session id replaced by a fresh one per turn and the capture times moved to
//! now. At the end it prints one JSON line: events sent and acknowledged,
//! turns, seconds, events per second. It exits non-zero if a stream failed,
//! after printing what was acknowledged until then.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use clap::Parser;
use hermes_collector_shim::attempts::AttemptTracker;
use hermes_collector_shim::config::CaptureLevel;
use hermes_collector_shim::convert::{JsonKwargs, Stamp, to_event};
use hermes_proto::v1::event_ingest_client::EventIngestClient;
use hermes_proto::v1::{Event, EventBatch, ShimInfo};
use tokio::sync::mpsc;

/// Streams recorded Hermes turns with fresh ids to a collector.
#[derive(Debug, Parser, Clone)]
#[command(name = "hermes-loadgen")]
struct Args {
    /// The collector's ingest.
    #[arg(long, default_value = "http://127.0.0.1:4319")]
    endpoint: String,
    /// Fixture files whose turns are replayed, in rotation.
    #[arg(long, num_args = 1.., default_values_os_t = default_fixtures())]
    fixture: Vec<PathBuf>,
    /// Simulated agents (one stream each).
    #[arg(long, default_value_t = 4)]
    instances: usize,
    /// Turns per agent (one fixture replay each).
    #[arg(long, default_value_t = 100)]
    turns: usize,
    /// Events per batch.
    #[arg(long, default_value_t = 512)]
    batch: usize,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 300)]
    timeout_secs: u64,
}

fn default_fixtures() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/hermes-0.19.0");
    [
        "basic.jsonl",
        "retry.jsonl",
        "parallel.jsonl",
        "multiturn.jsonl",
    ]
    .iter()
    .map(|f| dir.join(f))
    .collect()
}

/// One fixture as the shim would have sent it: events and the session ids
/// they mention.
struct Template {
    events: Vec<Event>,
    sessions: Vec<String>,
}

fn load_template(path: &PathBuf) -> anyhow::Result<Template> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    let level = CaptureLevel::Metadata;
    let mut attempts = AttemptTracker::new(4096);
    let mut events = Vec::new();
    let mut sessions = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let record: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("{}: bad JSON line", path.display()))?;
        let hook = record["hook"].as_str().unwrap_or_default();
        if !level.hooks().contains(&hook) {
            continue;
        }
        let Some(kwargs) = record["kwargs"].as_object() else {
            continue;
        };
        let stamp = Stamp {
            seq: 0,
            hook,
            time_unix_nano: (record["t_wall"].as_f64().unwrap_or(0.0) * 1e9) as u64,
            mono_nano: (record["t_mono"].as_f64().unwrap_or(0.0) * 1e9) as u64,
            thread: record["thread"].as_str().unwrap_or("MainThread"),
        };
        let mut event = to_event(&stamp, &JsonKwargs(kwargs), level);
        attempts.stamp(&mut event);
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
        events.push(event);
    }
    if events.is_empty() {
        bail!("{}: no events", path.display());
    }
    Ok(Template { events, sessions })
}

/// The template's events for one turn of one instance: fresh session ids,
/// times moved so the first event is `now`.
fn instantiate(template: &Template, tag: &str, now: u64) -> Vec<Event> {
    let base = template.events.first().map_or(0, |e| e.time_unix_nano);
    let fresh = |s: &mut String| {
        for (i, old) in template.sessions.iter().enumerate() {
            if s.contains(old.as_str()) {
                *s = s.replace(old.as_str(), &format!("lg{tag}s{i}"));
            }
        }
    };
    let shift = |t: u64| {
        if t == 0 {
            0
        } else {
            now + t.saturating_sub(base)
        }
    };
    template
        .events
        .iter()
        .map(|e| {
            let mut e = e.clone();
            e.time_unix_nano = shift(e.time_unix_nano);
            if let Some(ids) = e.ids.as_mut() {
                for s in [
                    &mut ids.session_id,
                    &mut ids.turn_id,
                    &mut ids.api_request_id,
                    &mut ids.parent_session_id,
                    &mut ids.parent_turn_id,
                    &mut ids.child_session_id,
                ] {
                    fresh(s);
                }
            }
            if let Some(hermes_proto::v1::event::Body::Api(api)) = e.body.as_mut() {
                api.started_at_unix_nano = shift(api.started_at_unix_nano);
                api.ended_at_unix_nano = shift(api.ended_at_unix_nano);
            }
            e
        })
        .collect()
}

#[derive(Default)]
struct Counters {
    sent: AtomicU64,
    acked: AtomicU64,
    turns: AtomicU64,
}

async fn run_instance(
    index: usize,
    args: Args,
    templates: Arc<Vec<Template>>,
    counters: Arc<Counters>,
) -> anyhow::Result<()> {
    let shim = ShimInfo {
        instance_id: format!(
            "{:032x}",
            (u128::from(std::process::id()) << 64) | index as u128
        ),
        service_name: "hermes-loadgen".into(),
        host_name: "loadgen".into(),
        pid: std::process::id(),
        shim_version: env!("CARGO_PKG_VERSION").into(),
        capture: "metadata".into(),
    };
    let mut client = EventIngestClient::connect(args.endpoint.clone())
        .await
        .context("connect")?;
    let (tx, rx) = mpsc::channel::<EventBatch>(16);
    let mut acks = client
        .stream(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .context("open stream")?
        .into_inner();
    let expected = expected_last(&args, &templates, index);
    let mut seq = 0u64;
    let mut last_seq = 0u64;
    let producer = {
        let counters = counters.clone();
        let shim = shim.clone();
        async move {
            let mut pending: Vec<Event> = Vec::with_capacity(args.batch);
            for turn in 0..args.turns {
                let template = &templates[(index + turn) % templates.len()];
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64);
                for mut event in instantiate(template, &format!("{index}t{turn}"), now) {
                    seq += 1;
                    event.seq = seq;
                    pending.push(event);
                    if pending.len() >= args.batch {
                        let events = std::mem::take(&mut pending);
                        counters
                            .sent
                            .fetch_add(events.len() as u64, Ordering::Relaxed);
                        let batch = EventBatch {
                            shim: Some(shim.clone()),
                            events,
                            dropped_events: 0,
                            floor_seq: 0,
                        };
                        tx.send(batch)
                            .await
                            .map_err(|_| anyhow::anyhow!("stream closed"))?;
                    }
                }
                counters.turns.fetch_add(1, Ordering::Relaxed);
            }
            if !pending.is_empty() {
                counters
                    .sent
                    .fetch_add(pending.len() as u64, Ordering::Relaxed);
                let batch = EventBatch {
                    shim: Some(shim.clone()),
                    events: pending,
                    dropped_events: 0,
                    floor_seq: 0,
                };
                tx.send(batch)
                    .await
                    .map_err(|_| anyhow::anyhow!("stream closed"))?;
            }
            anyhow::Ok(seq)
        }
    };
    let consumer = async {
        while let Some(ack) = acks.message().await.context("ack stream")? {
            let n = ack.last_seq - ack.first_seq + 1;
            last_seq = last_seq.max(ack.last_seq);
            counters.acked.fetch_add(n, Ordering::Relaxed);
            if last_seq >= expected {
                break;
            }
        }
        anyhow::Ok(())
    };
    let (produced, consumed) = tokio::join!(producer, consumer);
    produced?;
    consumed?;
    Ok(())
}

/// The last seq instance `index` sends.
fn expected_last(args: &Args, templates: &[Template], index: usize) -> u64 {
    (0..args.turns)
        .map(|turn| templates[(index + turn) % templates.len()].events.len() as u64)
        .sum()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let templates: Vec<Template> = args
        .fixture
        .iter()
        .map(load_template)
        .collect::<anyhow::Result<_>>()?;
    let templates = Arc::new(templates);
    let counters = Arc::new(Counters::default());
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for index in 0..args.instances {
        tasks.spawn(run_instance(
            index,
            args.clone(),
            templates.clone(),
            counters.clone(),
        ));
    }
    let mut failure = None;
    let deadline = tokio::time::sleep(Duration::from_secs(args.timeout_secs));
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            joined = tasks.join_next() => match joined {
                None => break,
                Some(Ok(Ok(()))) => {}
                Some(Ok(Err(e))) => { failure.get_or_insert(format!("{e:#}")); }
                Some(Err(e)) => { failure.get_or_insert(e.to_string()); }
            },
            () = &mut deadline => { failure.get_or_insert("timeout".to_owned()); break; }
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let sent = counters.sent.load(Ordering::Relaxed);
    let acked = counters.acked.load(Ordering::Relaxed);
    let summary = serde_json::json!({
        "instances": args.instances,
        "turns": counters.turns.load(Ordering::Relaxed),
        "events_sent": sent,
        "events_acked": acked,
        "seconds": secs,
        "events_per_second": if secs > 0.0 { acked as f64 / secs } else { 0.0 },
        "error": failure,
    });
    println!("{summary}");
    if let Some(e) = failure {
        bail!("load generation failed: {e}");
    }
    Ok(())
}
