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
//!   event with the time it is "captured" (now) and hands it to its own
//!   instance of the shim's sender (`hermes_collector_shim::sender`: its
//!   thread, queue, timers and wakes, as in an agent process), or with
//!   `--sender batched` batches it on the driver's runtime (≤ 512 events or
//!   `--flush-ms`; a fraction of the CPU of a sender thread per agent, for
//!   rates where those threads would take the machine). For the delay from
//!   capture to export, measured by `hermes-bench-sink`.
//! * `idle-sender`: starts one shim sender per instance, connected to the
//!   collector and given no events, and reports the CPU time and the
//!   wake-ups of their threads over `--secs` (from
//!   `/proc/self/task/*/schedstat`): what an idle agent process pays for the
//!   sender's looks at its empty queue.
//! * `otlp`: not a collector's load but an OTLP relay's: the spans the
//!   correlator builds from the fixtures' turns (fresh ids, in rotation, as
//!   `hermes-loadgen` sends them), sent as OTLP/gRPC export requests of
//!   `--spans-per-request` spans, one connection per instance, each request
//!   awaited, as fast as it goes. For another collector (an OTLP relay)
//!   given the same spans our collector exports (`collector_load.py`'s
//!   `relay` scenario).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};
use hermes_benches::{FIXTURES, Template, correlate, now_unix_nanos, shim_info};
use hermes_collector_shim::config::{CaptureLevel, DEFAULT_QUEUE_EVENTS, wakes_sender};
use hermes_collector_shim::sender::{
    self, DEFAULT_IDLE_POLL_MAX, DEFAULT_IDLE_SLEEP_AFTER, PassThrough, SenderConfig, Started,
};
use hermes_correlator::{FinishedSpan, to_resource_spans};
use hermes_proto::v1::{Event, EventBatch, ShimInfo};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
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
        /// How each agent sends its events.
        #[arg(long, value_enum, default_value_t = SenderKind::Shim)]
        sender: SenderKind,
        /// `--sender shim`: its timers.
        #[command(flatten)]
        timers: SenderTimers,
        /// `--sender batched`: the longest a partial batch waits, ms.
        #[arg(long, default_value_t = 50)]
        flush_ms: u64,
    },
    /// The spans of the fixtures' turns as OTLP/gRPC export requests.
    Otlp {
        /// Turns per instance.
        #[arg(long, default_value_t = 2500)]
        turns: usize,
        /// Spans per export request (at least; whole turns).
        #[arg(long, default_value_t = 256)]
        spans_per_request: usize,
    },
    /// Idle senders: their threads' CPU time and wake-ups.
    IdleSender {
        /// How long to measure.
        #[arg(long, default_value_t = 30)]
        secs: u64,
        /// The senders' timers.
        #[command(flatten)]
        timers: SenderTimers,
    },
}

/// Overrides of the shim sender's timers (default: the shim's).
#[derive(Debug, Clone, Copy, clap::Args)]
struct SenderTimers {
    /// The sender's `idle_poll_max`, ms.
    #[arg(long)]
    idle_poll_max_ms: Option<u64>,
    /// The sender's `idle_sleep_after`, ms (a large value: it never sleeps).
    #[arg(long)]
    idle_sleep_after_ms: Option<u64>,
}

impl SenderTimers {
    fn apply(&self, config: &mut SenderConfig) {
        if let Some(ms) = self.idle_poll_max_ms {
            config.idle_poll_max = Duration::from_millis(ms);
        }
        if let Some(ms) = self.idle_sleep_after_ms {
            config.idle_sleep_after = Duration::from_millis(ms);
        }
    }
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
        let (tx, mut acks) = hermes_benches::open_stream(endpoint).await?;
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
            ..Default::default()
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
                    let mut e = template.fresh_at(e, &format!("{index}o{turn}"), now);
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

/// How a simulated agent's events leave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum SenderKind {
    /// Its own instance of the shim's sender (thread, queue, timers, wakes).
    Shim,
    /// Batched on the driver's runtime: at most 512 events or `--flush-ms`
    /// (much cheaper to generate than a sender thread per agent).
    Batched,
}

/// How the simulated agents send (`paced`'s options).
#[derive(Debug, Clone, Copy)]
struct SenderChoice {
    kind: SenderKind,
    /// `SenderKind::Shim`: the sender's timers.
    timers: SenderTimers,
    /// `SenderKind::Batched`: the longest a partial batch waits.
    flush: Duration,
}

/// Where one simulated agent hands its events.
enum Outlet {
    Shim(Started<Event>),
    Batched {
        stream: Stream,
        pending: Vec<Event>,
        first_pending: Option<Instant>,
        flush: Duration,
    },
}

impl Outlet {
    async fn open(endpoint: &str, shim: ShimInfo, sender: SenderChoice) -> anyhow::Result<Outlet> {
        Ok(match sender.kind {
            SenderKind::Shim => Outlet::Shim(start_sender(endpoint, shim, sender.timers)?),
            SenderKind::Batched => Outlet::Batched {
                stream: Stream::open(endpoint, shim).await?,
                pending: Vec::with_capacity(BATCH),
                first_pending: None,
                flush: sender.flush,
            },
        })
    }

    /// Waits until `due`; a batching outlet sends what it holds meanwhile.
    async fn wait_until(&mut self, due: Instant) -> anyhow::Result<()> {
        if let Outlet::Batched {
            stream,
            pending,
            first_pending,
            flush,
        } = self
        {
            while let Some(at) = first_pending.map(|t| t + *flush)
                && at <= due
            {
                tokio::time::sleep_until(at.into()).await;
                stream.send(std::mem::take(pending)).await?;
                *first_pending = None;
            }
        }
        tokio::time::sleep_until(due.into()).await;
        Ok(())
    }

    async fn push(&mut self, event: Event) -> anyhow::Result<()> {
        match self {
            Outlet::Shim(Started { tx, .. }) => {
                let pushed = if wakes_sender(&event.hook) {
                    tx.push_and_wake(event)
                } else {
                    tx.push(event)
                };
                if pushed.is_err() {
                    bail!("the sender's queue refused an event");
                }
            }
            Outlet::Batched {
                stream,
                pending,
                first_pending,
                ..
            } => {
                pending.push(event);
                first_pending.get_or_insert_with(Instant::now);
                if pending.len() >= BATCH {
                    stream.send(std::mem::take(pending)).await?;
                    *first_pending = None;
                }
            }
        }
        Ok(())
    }

    /// Sends what is held and waits until events 1..=`last` are acknowledged.
    async fn finish(self, last: u64) -> anyhow::Result<()> {
        let timeout = Duration::from_secs(60);
        match self {
            Outlet::Shim(Started { tx, shared, thread }) => {
                let deadline = Instant::now() + timeout;
                while shared.settled_events() < last {
                    if Instant::now() > deadline {
                        bail!(
                            "events not settled within {timeout:?} ({})",
                            shared.stats().last_error
                        );
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                let acked = shared.stats().acked_events;
                // The queue closes: the sender thread ends.
                drop(tx);
                drop(thread);
                if acked < last {
                    bail!("{} of {last} events not acknowledged", last - acked);
                }
            }
            Outlet::Batched {
                stream,
                pending,
                first_pending,
                flush,
            } => {
                if let Some(at) = first_pending {
                    tokio::time::sleep_until((at + flush).into()).await;
                    stream.send(pending).await?;
                }
                stream.wait_acked(last, timeout).await?;
            }
        }
        Ok(())
    }
}

/// A shim sender of ready events with the shim's defaults (and the timers
/// given).
fn start_sender(
    endpoint: &str,
    shim: ShimInfo,
    timers: SenderTimers,
) -> anyhow::Result<Started<Event>> {
    let mut config = SenderConfig::new(endpoint, shim);
    timers.apply(&mut config);
    sender::start(PassThrough, config, DEFAULT_QUEUE_EVENTS).context("start the sender thread")
}

/// Most events per batch of a batching outlet (the shim's default).
const BATCH: usize = 512;

/// One simulated agent.
#[allow(clippy::too_many_arguments)]
async fn paced_instance(
    endpoint: String,
    index: usize,
    level: CaptureLevel,
    templates: Arc<Vec<Arc<Template>>>,
    turns: usize,
    speed: f64,
    sender: SenderChoice,
    stagger: Duration,
    counters: Arc<Counters>,
) -> anyhow::Result<()> {
    let mut outlet = Outlet::open(&endpoint, shim_info(index as u64, level), sender).await?;
    tokio::time::sleep(stagger).await;
    let mut seq = 0u64;
    for turn in 0..turns {
        let template = &templates[(index + turn) % templates.len()];
        let base = template.base();
        let turn_start = Instant::now();
        for e in &template.events {
            let offset = Duration::from_nanos(e.time_unix_nano.saturating_sub(base));
            outlet
                .wait_until(turn_start + offset.div_f64(speed))
                .await?;
            let mut e = template.fresh_at(e, &format!("{index}p{turn}"), now_unix_nanos());
            seq += 1;
            e.seq = seq;
            outlet
                .push(e)
                .await
                .with_context(|| format!("instance {index}"))?;
            counters.events.fetch_add(1, Ordering::Relaxed);
        }
        counters.turns.fetch_add(1, Ordering::Relaxed);
    }
    outlet
        .finish(seq)
        .await
        .with_context(|| format!("instance {index}"))
}

async fn paced(
    args: &Args,
    level: CaptureLevel,
    turns: usize,
    speed: f64,
    sender: SenderChoice,
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
            sender,
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
            "sender": format!("{:?}", sender.kind).to_lowercase(),
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

/// CPU time (ns) and times scheduled of this process's sender threads, from
/// `/proc/self/task/*/schedstat` (their `comm` is the thread name cut to 15
/// bytes).
fn sender_threads_schedstat() -> anyhow::Result<(u64, u64, usize)> {
    let comm = &sender::THREAD_NAME.as_bytes()[..15];
    let (mut cpu_ns, mut slices, mut threads) = (0u64, 0u64, 0usize);
    for task in std::fs::read_dir("/proc/self/task").context("read /proc/self/task")? {
        let path = task?.path();
        let Ok(name) = std::fs::read(path.join("comm")) else {
            continue;
        };
        if name.trim_ascii_end() != comm {
            continue;
        }
        let stat = std::fs::read_to_string(path.join("schedstat"))?;
        let fields: Vec<u64> = stat
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()
            .context("parse schedstat")?;
        let [run_ns, _wait_ns, timeslices] = fields[..] else {
            bail!("unexpected schedstat {stat:?}");
        };
        cpu_ns += run_ns;
        slices += timeslices;
        threads += 1;
    }
    Ok((cpu_ns, slices, threads))
}

async fn idle_sender(
    args: &Args,
    level: CaptureLevel,
    secs: u64,
    timers: SenderTimers,
) -> anyhow::Result<()> {
    let senders = (0..args.instances)
        .map(|index| start_sender(&args.endpoint, shim_info(index as u64, level), timers))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !senders.iter().all(|s| s.shared.is_connected()) {
        if Instant::now() > deadline {
            bail!("the senders did not connect within 10 s");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Past the back-off from `linger` to `idle_poll_max`, and past
    // `idle_sleep_after` unless it is longer than the measurement: the
    // steady state of an idle agent.
    let sleep_after = timers
        .idle_sleep_after_ms
        .map_or(DEFAULT_IDLE_SLEEP_AFTER, Duration::from_millis);
    let settle = Duration::from_secs(1)
        + if sleep_after < Duration::from_secs(secs) {
            sleep_after
        } else {
            Duration::ZERO
        };
    tokio::time::sleep(settle).await;
    let (cpu0, slices0, threads) = sender_threads_schedstat()?;
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let (cpu1, slices1, _) = sender_threads_schedstat()?;
    let elapsed = started.elapsed().as_secs_f64();
    let per_thread_second = |v: u64| v as f64 / threads.max(1) as f64 / elapsed;
    println!(
        "{}",
        serde_json::json!({
            "mode": "idle-sender",
            "threads": threads,
            "seconds": elapsed,
            "idle_poll_max_ms": timers.idle_poll_max_ms.unwrap_or(DEFAULT_IDLE_POLL_MAX.as_millis() as u64),
            "idle_sleep_after_ms": sleep_after.as_millis() as u64,
            "asleep": senders.iter().filter(|s| s.shared.stats().asleep).count(),
            "cpu_us_per_thread_second": per_thread_second(cpu1.saturating_sub(cpu0)) / 1e3,
            "wakeups_per_thread_second": per_thread_second(slices1.saturating_sub(slices0)),
        })
    );
    drop(senders);
    Ok(())
}

/// `otlp` mode: see the module docs.
async fn otlp(
    args: &Args,
    level: CaptureLevel,
    turns: usize,
    spans_per_request: usize,
) -> anyhow::Result<()> {
    let templates = FIXTURES
        .iter()
        .map(|name| Template::load(name, level))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for index in 0..args.instances {
        let mut client = TraceServiceClient::connect(args.endpoint.clone())
            .await
            .context("connect")?;
        let templates = templates.clone();
        let shim = shim_info(index as u64, level);
        tasks.spawn(async move {
            let (mut spans, mut requests) = (0u64, 0u64);
            let mut pending = Vec::new();
            for turn in 0..turns {
                let template = &templates[turn % templates.len()];
                let now = now_unix_nanos();
                let events: Vec<Event> = template
                    .events
                    .iter()
                    .map(|e| template.fresh_at(e, &format!("{index}r{turn}"), now))
                    .collect();
                pending.extend(correlate(&shim, &events));
                if pending.len() >= spans_per_request || turn + 1 == turns {
                    spans += pending.len() as u64;
                    requests += 1;
                    let request = otlp_request(std::mem::take(&mut pending));
                    client.export(request).await.context("export")?;
                }
            }
            anyhow::Ok((spans, requests))
        });
    }
    let (mut spans, mut requests) = (0u64, 0u64);
    while let Some(done) = tasks.join_next().await {
        let (s, r) = done??;
        spans += s;
        requests += r;
    }
    println!(
        "{}",
        serde_json::json!({
            "mode": "otlp",
            "spans": spans,
            "requests": requests,
            "seconds": started.elapsed().as_secs_f64(),
        })
    );
    Ok(())
}

/// `spans` as one OTLP export request, grouped as the collector exports
/// them (a `ResourceSpans` per resource).
fn otlp_request(spans: Vec<FinishedSpan>) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: to_resource_spans(spans).iter().map(Into::into).collect(),
    }
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
            sender,
            timers,
            flush_ms,
        } => {
            let sender = SenderChoice {
                kind: sender,
                timers,
                flush: Duration::from_millis(flush_ms),
            };
            paced(&args, level, turns, speed, sender).await
        }
        Mode::IdleSender { secs, timers } => idle_sender(&args, level, secs, timers).await,
        Mode::Otlp {
            turns,
            spans_per_request,
        } => otlp(&args, level, turns, spans_per_request).await,
    }
}
