//! `hermes-bench-driver`: drives a collector over the wire protocol for the
//! load runs where `hermes-loadgen` (which replays turns as fast as it can,
//! with capture times moved into the future by the fixture's durations) does
//! not fit.
//!
//! * `open-turns`: opens N distinct turns (`pre_llm_call` and one
//!   `pre_tool_call` each, from the `basic` fixture with fresh ids), waits
//!   until every event is acknowledged, prints one JSON line and holds the
//!   streams open until SIGTERM/SIGINT (or `--hold-secs`). For RSS with many
//!   open turns.
//! * `paced`: each simulated agent replays the fixtures in rotation in real
//!   time (event gaps of the recording divided by `--speed`), stamps each
//!   event with the time it is "captured" (now), and batches like the shim's
//!   sender (at most `--batch` events or `--flush-ms`). For the delay from
//!   capture to export, measured by `hermes-bench-sink`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};
use hermes_benches::{FIXTURES, Template, now_unix_nanos, restamp, shim_info};
use hermes_collector_shim::config::CaptureLevel;
use hermes_proto::v1::event_ingest_client::EventIngestClient;
use hermes_proto::v1::{Event, EventBatch, ShimInfo};
use rand::Rng as _;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

#[derive(Debug, Parser)]
#[command(name = "hermes-bench-driver")]
struct Args {
    /// The collector's ingest (loopback).
    #[arg(long, global = true, default_value = "http://127.0.0.1:4319")]
    endpoint: String,
    /// Simulated agents (one stream each).
    #[arg(long, global = true, default_value_t = 4)]
    instances: usize,
    /// Capture level of the events (`metadata` or `content`).
    #[arg(long, global = true, default_value = "metadata")]
    capture: String,
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Debug, Subcommand)]
enum Mode {
    /// Open N turns and hold them open.
    OpenTurns {
        /// Turns to open, over all instances.
        #[arg(long)]
        turns: usize,
        /// Hold at most this long (0: until SIGTERM/SIGINT).
        #[arg(long, default_value_t = 0)]
        hold_secs: u64,
    },
    /// Replay whole turns in real time (or `--speed` times faster).
    Paced {
        /// Turns per agent.
        #[arg(long, default_value_t = 20)]
        turns: usize,
        /// Time compression of the recorded gaps between events.
        #[arg(long, default_value_t = 1.0)]
        speed: f64,
        /// Longest wait before a partial batch is sent (the shim: ~50 ms).
        #[arg(long, default_value_t = 50)]
        flush_ms: u64,
        /// Most events per batch (the shim: 512).
        #[arg(long, default_value_t = 512)]
        batch: usize,
    },
}

/// One open stream to the collector.
struct Stream {
    shim: ShimInfo,
    tx: mpsc::Sender<EventBatch>,
    acked: Arc<AtomicU64>,
    acks: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Stream {
    async fn open(endpoint: &str, shim: ShimInfo) -> anyhow::Result<Stream> {
        let mut client = EventIngestClient::connect(endpoint.to_owned())
            .await
            .context("connect")?;
        let (tx, rx) = mpsc::channel::<EventBatch>(16);
        let mut acks = client
            .stream(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .context("open stream")?
            .into_inner();
        let acked = Arc::new(AtomicU64::new(0));
        let last = acked.clone();
        let acks = tokio::spawn(async move {
            while let Some(ack) = acks.message().await.context("ack stream")? {
                last.fetch_max(ack.last_seq, Ordering::Relaxed);
            }
            anyhow::Ok(())
        });
        Ok(Stream {
            shim,
            tx,
            acked,
            acks,
        })
    }

    async fn send(&self, events: Vec<Event>) -> anyhow::Result<()> {
        let batch = EventBatch {
            shim: Some(self.shim.clone()),
            events,
            dropped_events: 0,
            floor_seq: 0,
        };
        self.tx
            .send(batch)
            .await
            .map_err(|_| anyhow::anyhow!("stream closed"))
    }

    async fn wait_acked(&self, seq: u64, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        while self.acked.load(Ordering::Relaxed) < seq {
            if self.acks.is_finished() {
                bail!("ack stream ended before seq {seq}");
            }
            if Instant::now() > deadline {
                bail!("seq {seq} not acknowledged within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }
}

async fn open_turns(
    args: &Args,
    level: CaptureLevel,
    turns: usize,
    hold_secs: u64,
) -> anyhow::Result<()> {
    let template = Template::load("basic.jsonl", level)?;
    let pick = |hook: &str| {
        template
            .events
            .iter()
            .find(|e| e.hook == hook)
            .cloned()
            .with_context(|| format!("no {hook} in the basic fixture"))
    };
    let opening = [pick("pre_llm_call")?, pick("pre_tool_call")?];
    let started = Instant::now();
    let mut streams = Vec::new();
    let mut tasks = tokio::task::JoinSet::new();
    for index in 0..args.instances {
        let stream = Arc::new(Stream::open(&args.endpoint, shim_info(index as u64, level)).await?);
        streams.push(stream.clone());
        let template = template.clone();
        let opening = opening.clone();
        let share = turns / args.instances + usize::from(index < turns % args.instances);
        tasks.spawn(async move {
            let mut seq = 0u64;
            let mut pending = Vec::with_capacity(512);
            for turn in 0..share {
                let now = now_unix_nanos();
                for e in &opening {
                    let mut e = template.fresh(e, &format!("{index}o{turn}"));
                    restamp(&mut e, now);
                    seq += 1;
                    e.seq = seq;
                    pending.push(e);
                }
                if pending.len() >= 512 {
                    stream.send(std::mem::take(&mut pending)).await?;
                }
            }
            if !pending.is_empty() {
                stream.send(pending).await?;
            }
            stream.wait_acked(seq, Duration::from_secs(120)).await?;
            anyhow::Ok(seq)
        });
    }
    let mut events = 0u64;
    while let Some(done) = tasks.join_next().await {
        events += done??;
    }
    println!(
        "{}",
        serde_json::json!({
            "mode": "open-turns",
            "turns": turns,
            "events": events,
            "seconds": started.elapsed().as_secs_f64(),
            "ready": true,
        })
    );
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let hold = async {
        if hold_secs > 0 {
            tokio::time::sleep(Duration::from_secs(hold_secs)).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
        () = hold => {}
    }
    drop(streams);
    Ok(())
}

#[derive(Default)]
struct Counters {
    events: AtomicU64,
    turns: AtomicU64,
}

#[allow(clippy::too_many_arguments)]
async fn paced_instance(
    endpoint: String,
    index: usize,
    level: CaptureLevel,
    templates: Arc<Vec<Arc<Template>>>,
    turns: usize,
    speed: f64,
    flush: Duration,
    batch: usize,
    stagger: Duration,
    counters: Arc<Counters>,
) -> anyhow::Result<()> {
    let stream = Stream::open(&endpoint, shim_info(index as u64, level)).await?;
    tokio::time::sleep(stagger).await;
    let mut seq = 0u64;
    let mut pending: Vec<Event> = Vec::with_capacity(batch);
    let mut first_pending: Option<Instant> = None;
    for turn in 0..turns {
        let template = &templates[(index + turn) % templates.len()];
        let base = template.base();
        let turn_start = Instant::now();
        for e in &template.events {
            let offset = Duration::from_nanos(e.time_unix_nano.saturating_sub(base));
            let due = turn_start + offset.div_f64(speed);
            // Flush partial batches while waiting for the next capture.
            loop {
                let flush_at = first_pending.map(|t| t + flush);
                match flush_at {
                    Some(at) if at <= due => {
                        tokio::time::sleep_until(at.into()).await;
                        stream.send(std::mem::take(&mut pending)).await?;
                        first_pending = None;
                    }
                    _ => {
                        tokio::time::sleep_until(due.into()).await;
                        break;
                    }
                }
            }
            let mut e = template.fresh(e, &format!("{index}p{turn}"));
            restamp(&mut e, now_unix_nanos());
            seq += 1;
            e.seq = seq;
            pending.push(e);
            first_pending.get_or_insert_with(Instant::now);
            counters.events.fetch_add(1, Ordering::Relaxed);
            if pending.len() >= batch {
                stream.send(std::mem::take(&mut pending)).await?;
                first_pending = None;
            }
        }
        counters.turns.fetch_add(1, Ordering::Relaxed);
    }
    if let Some(at) = first_pending {
        tokio::time::sleep_until((at + flush).into()).await;
        stream.send(std::mem::take(&mut pending)).await?;
    }
    stream.wait_acked(seq, Duration::from_secs(60)).await?;
    Ok(())
}

async fn paced(
    args: &Args,
    level: CaptureLevel,
    turns: usize,
    speed: f64,
    flush_ms: u64,
    batch: usize,
) -> anyhow::Result<()> {
    if speed <= 0.0 || !speed.is_finite() {
        bail!("--speed must be positive");
    }
    let templates: Vec<Arc<Template>> = FIXTURES
        .iter()
        .map(|name| Template::load(name, level))
        .collect::<anyhow::Result<_>>()?;
    let templates = Arc::new(templates);
    let counters = Arc::new(Counters::default());
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let mut rng = rand::rng();
    for index in 0..args.instances {
        // Agents start spread over the first second (of recorded time).
        let stagger = Duration::from_secs_f64(rng.random::<f64>() / speed);
        tasks.spawn(paced_instance(
            args.endpoint.clone(),
            index,
            level,
            templates.clone(),
            turns,
            speed,
            Duration::from_millis(flush_ms),
            batch.max(1),
            stagger,
            counters.clone(),
        ));
    }
    let mut failure = None;
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                failure.get_or_insert(format!("{e:#}"));
            }
            Err(e) => {
                failure.get_or_insert(e.to_string());
            }
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let events = counters.events.load(Ordering::Relaxed);
    println!(
        "{}",
        serde_json::json!({
            "mode": "paced",
            "instances": args.instances,
            "speed": speed,
            "turns": counters.turns.load(Ordering::Relaxed),
            "events": events,
            "seconds": secs,
            "events_per_second": events as f64 / secs.max(1e-9),
            "error": failure,
        })
    );
    if let Some(e) = failure {
        bail!("paced run failed: {e}");
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let level = match CaptureLevel::parse(&args.capture) {
        Some(CaptureLevel::Lean) | None => bail!("--capture must be metadata or content"),
        Some(level) => level,
    };
    if args.instances == 0 {
        bail!("--instances must be at least 1");
    }
    match args.mode {
        Mode::OpenTurns { turns, hold_secs } => open_turns(&args, level, turns, hold_secs).await,
        Mode::Paced {
            turns,
            speed,
            flush_ms,
            batch,
        } => paced(&args, level, turns, speed, flush_ms, batch).await,
    }
}
