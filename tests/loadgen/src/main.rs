//! `hermes-loadgen`: streams realistic Hermes turns to a collector over the
//! `hermes.collector.v1` wire protocol, as many shims would.
//!
//! Each simulated agent ("instance") has its own instance id (unique per
//! run) and contiguous seqs. Its turns are the recorded hook calls of a real
//! Hermes run (`tests/fixtures/hermes-0.19.0/*.jsonl`), converted exactly as
//! the shim converts them (`hermes_collector_shim::convert`), with every
//! session id replaced by a fresh one per turn and the capture times moved to
//! now. At the end it prints one JSON line: events sent and acknowledged,
//! turns, seconds, events per second.
//!
//! Two ways to send:
//! - default: each instance drives the shim's real sender core
//!   (`hermes_collector_shim::sender`: unacknowledged batches kept, reconnect
//!   with jittered backoff, resend), so a collector that is killed and
//!   restarted, or that pushes back, only delays it; it exits 0 once every
//!   event is acknowledged, non-zero at `--timeout-secs` or when nothing was
//!   acknowledged for `--give-up-secs` while events were outstanding (the
//!   collector is gone for good);
//! - `--raw`: one raw stream per instance, as fast as the collector takes
//!   it; exits non-zero if a stream fails.
//!
//! Either way it prints the summary (what was acknowledged until then)
//! before exiting.
//!
//! `--expect-spans FILE` writes the spans the collector must produce for
//! exactly the events sent (`trace_id/span_id` in hex, one per line, sorted,
//! unique), computed in process by the collector's own sequencer and
//! correlator with default settings, so a test can compare them with what an
//! OTLP receiver got.

use std::collections::BTreeSet;
use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use clap::Parser;
use hermes_benches::{FIXTURES, Template, open_stream, restamp};
use hermes_collector_shim::attempts::AttemptTracker;
use hermes_collector_shim::config::CaptureLevel;
use hermes_collector_shim::sender::{self, PassThrough, SenderConfig, SenderShared, Started};
use hermes_correlator::sequencer::{Sequencer, SequencerConfig};
use hermes_correlator::{Correlation, Correlator, FinishedSpan};
use hermes_proto::v1::{Event, EventBatch, ShimInfo};

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
    /// One raw stream per instance that fails when the collector goes away,
    /// instead of the shim's sender core (which resends unacknowledged
    /// batches after reconnecting with backoff).
    #[arg(long)]
    raw: bool,
    /// Give up when no event was acknowledged for this many seconds while
    /// some were outstanding (0: wait until `--timeout-secs`). Not with `--raw`.
    #[arg(long, default_value_t = 20)]
    give_up_secs: u64,
    /// Write the spans the collector must produce for the events sent
    /// (`trace_id/span_id` hex per line, sorted, unique) to this file.
    #[arg(long, value_name = "FILE")]
    expect_spans: Option<PathBuf>,
}

fn default_fixtures() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/hermes-0.19.0");
    FIXTURES.iter().map(|f| dir.join(f)).collect()
}

/// The template's events for one turn of one instance: fresh session ids
/// (`lg<run>i<instance>t<turn>s<n>`), times moved so the first event is `now`
/// and the others keep their distance to it.
fn instantiate(template: &Template, tag: &str, now: u64) -> Vec<Event> {
    let base = template.base();
    let prefix = format!("lg{tag}");
    template
        .events
        .iter()
        .map(|e| {
            let mut e = template.renamed(e, &prefix);
            let at = now + e.time_unix_nano.saturating_sub(base);
            restamp(&mut e, at);
            e
        })
        .collect()
}

/// The fixture file `path` as the shim would have sent it.
fn load_template(path: &Path) -> anyhow::Result<Template> {
    let template = Template::from_file(path, CaptureLevel::Metadata)?;
    if template.events.is_empty() {
        bail!("{}: no events", path.display());
    }
    Ok(template)
}

/// A random number per run (no extra dependency: std's randomly keyed
/// hasher, over the time and the pid).
fn run_nonce() -> u64 {
    let mut hasher = std::hash::RandomState::new().build_hasher();
    hasher.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.write_u32(std::process::id());
    hasher.finish()
}

fn now_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The spans the collector must produce: its sequencer and correlator, with
/// default settings, over the events sent.
struct Expect {
    correlation: Correlation,
    out: Vec<FinishedSpan>,
    ids: BTreeSet<String>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Expect {
    fn new() -> Self {
        Expect {
            correlation: Correlation::new(
                Sequencer::new(SequencerConfig::default()),
                Correlator::new(hermes_correlator::Config::default()),
            ),
            out: Vec::new(),
            ids: BTreeSet::new(),
        }
    }

    fn push(&mut self, shim: &ShimInfo, event: &Event) {
        self.correlation.push_batch(
            shim,
            0,
            [event.clone()],
            0,
            event.time_unix_nano,
            &mut self.out,
        );
        self.drain();
    }

    fn drain(&mut self) {
        for span in self.out.drain(..) {
            self.ids.insert(format!(
                "{}/{}",
                hex(&span.span.trace_id),
                hex(&span.span.span_id)
            ));
        }
    }

    /// Closes everything (as the collector does at shutdown); the span ids.
    fn finish(&mut self) -> BTreeSet<String> {
        self.correlation.flush_all(&mut self.out);
        self.drain();
        std::mem::take(&mut self.ids)
    }
}

type SharedExpect = Option<Arc<Mutex<Expect>>>;

fn expect_push(expect: &SharedExpect, shim: &ShimInfo, event: &Event) {
    if let Some(expect) = expect {
        expect
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(shim, event);
    }
}

#[derive(Default)]
struct Counters {
    sent: AtomicU64,
    acked: AtomicU64,
    turns: AtomicU64,
    /// Senders of the instances (not `--raw`), for their counters.
    senders: Mutex<Vec<Arc<SenderShared>>>,
}

impl Counters {
    fn senders(&self) -> Vec<Arc<SenderShared>> {
        self.senders
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// What every instance shares.
struct Run {
    args: Args,
    templates: Vec<Template>,
    nonce: u64,
    counters: Counters,
    expect: SharedExpect,
}

impl Run {
    fn shim(&self, index: usize) -> ShimInfo {
        ShimInfo {
            instance_id: format!("{:016x}{:016x}", self.nonce, index as u64),
            service_name: "hermes-loadgen".into(),
            host_name: "loadgen".into(),
            pid: std::process::id(),
            shim_version: env!("CARGO_PKG_VERSION").into(),
            capture: "metadata".into(),
        }
    }

    /// The events of turn `turn` of instance `index`, numbered from
    /// `*seq + 1` and with their API attempts numbered as the shim's sender
    /// does.
    fn turn_events(
        &self,
        index: usize,
        turn: usize,
        seq: &mut u64,
        attempts: &mut AttemptTracker,
    ) -> Vec<Event> {
        let template = &self.templates[(index + turn) % self.templates.len()];
        let tag = format!("{:08x}i{index}t{turn}", self.nonce as u32);
        let mut events = instantiate(template, &tag, now_nanos());
        for event in &mut events {
            *seq += 1;
            event.seq = *seq;
            attempts.stamp(event);
        }
        events
    }
}

/// One instance on one raw stream; fails when the stream does.
async fn run_instance(index: usize, run: Arc<Run>) -> anyhow::Result<()> {
    let args = &run.args;
    let counters = &run.counters;
    let shim = run.shim(index);
    let (tx, mut acks) = open_stream(&args.endpoint).await?;
    let expected = expected_last(args, &run.templates, index);
    let mut last_seq = 0u64;
    let producer = {
        let shim = shim.clone();
        let run = Arc::clone(&run);
        async move {
            let mut seq = 0u64;
            let mut attempts = AttemptTracker::default();
            let mut pending: Vec<Event> = Vec::with_capacity(args.batch);
            let send = |events: Vec<Event>| {
                counters
                    .sent
                    .fetch_add(events.len() as u64, Ordering::Relaxed);
                for event in &events {
                    expect_push(&run.expect, &shim, event);
                }
                tx.send(EventBatch {
                    shim: Some(shim.clone()),
                    events,
                    dropped_events: 0,
                    floor_seq: 0,
                    ..Default::default()
                })
            };
            for turn in 0..args.turns {
                for event in run.turn_events(index, turn, &mut seq, &mut attempts) {
                    pending.push(event);
                    if pending.len() >= args.batch {
                        send(std::mem::take(&mut pending))
                            .await
                            .map_err(|_| anyhow::anyhow!("stream closed"))?;
                    }
                }
                counters.turns.fetch_add(1, Ordering::Relaxed);
            }
            if !pending.is_empty() {
                send(pending)
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

/// Events an instance may hand to its sender before they are acknowledged:
/// a flow-control window (the queue never drops, the unacknowledged buffer
/// never evicts).
fn window(batch: usize) -> u64 {
    (batch as u64 * 32).max(16_384)
}

/// One instance through the shim's sender core; returns once every event is
/// acknowledged (or fails if some were lost).
async fn run_instance_resend(index: usize, run: Arc<Run>) -> anyhow::Result<()> {
    let args = &run.args;
    let counters = &run.counters;
    let shim = run.shim(index);
    let window = window(args.batch);
    let capacity = usize::try_from(window).unwrap_or(usize::MAX) + args.batch;
    let mut config = SenderConfig::new(args.endpoint.as_str(), shim.clone());
    config.max_batch_events = args.batch.max(1);
    // Room for the whole window, so nothing is evicted while the collector
    // is away or pushes back.
    config.max_unacked_batches = 1 << 20;
    config.max_unacked_bytes = 1 << 30;
    let Started { tx, shared, thread } =
        sender::start(PassThrough, config, capacity).context("start the sender thread")?;
    counters
        .senders
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(Arc::clone(&shared));
    let mut seq = 0u64;
    let mut attempts = AttemptTracker::default();
    let mut pushed = 0u64;
    for turn in 0..args.turns {
        for event in run.turn_events(index, turn, &mut seq, &mut attempts) {
            while pushed.saturating_sub(shared.settled_events()) >= window {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            expect_push(&run.expect, &shim, &event);
            if tx.push(event).is_err() {
                bail!("the sender's queue refused an event");
            }
            pushed += 1;
            counters.sent.fetch_add(1, Ordering::Relaxed);
        }
        counters.turns.fetch_add(1, Ordering::Relaxed);
    }
    while shared.settled_events() < pushed {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let stats = shared.stats();
    // The queue closes: the sender ends (everything is acknowledged).
    drop(tx);
    drop(thread);
    if stats.acked_events < pushed {
        bail!(
            "instance {index}: {} of {pushed} events lost (evicted {}, discarded {})",
            pushed - stats.acked_events,
            stats.evicted_events,
            stats.discarded_events
        );
    }
    Ok(())
}

/// The last seq instance `index` sends.
fn expected_last(args: &Args, templates: &[Template], index: usize) -> u64 {
    (0..args.turns)
        .map(|turn| templates[(index + turn) % templates.len()].events.len() as u64)
        .sum()
}

fn write_expected(path: &PathBuf, ids: &BTreeSet<String>) -> anyhow::Result<()> {
    let mut text = String::with_capacity(ids.len() * 50);
    for id in ids {
        text.push_str(id);
        text.push('\n');
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).with_context(|| format!("write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("rename to {}", path.display()))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let templates: Vec<Template> = args
        .fixture
        .iter()
        .map(|path| load_template(path))
        .collect::<anyhow::Result<_>>()?;
    let run = Arc::new(Run {
        expect: args
            .expect_spans
            .as_ref()
            .map(|_| Arc::new(Mutex::new(Expect::new()))),
        args: args.clone(),
        templates,
        nonce: run_nonce(),
        counters: Counters::default(),
    });
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for index in 0..args.instances {
        if args.raw {
            tasks.spawn(run_instance(index, Arc::clone(&run)));
        } else {
            tasks.spawn(run_instance_resend(index, Arc::clone(&run)));
        }
    }
    let mut failure = None;
    let deadline = tokio::time::sleep(Duration::from_secs(args.timeout_secs));
    tokio::pin!(deadline);
    let give_up =
        (!args.raw && args.give_up_secs > 0).then(|| Duration::from_secs(args.give_up_secs));
    let mut progress = tokio::time::interval(Duration::from_millis(250));
    let mut last_acked = 0u64;
    let mut last_progress = Instant::now();
    loop {
        tokio::select! {
            joined = tasks.join_next() => match joined {
                None => break,
                Some(Ok(Ok(()))) => {}
                Some(Ok(Err(e))) => { failure.get_or_insert(format!("{e:#}")); }
                Some(Err(e)) => { failure.get_or_insert(e.to_string()); }
            },
            () = &mut deadline => { failure.get_or_insert("timeout".to_owned()); break; }
            _ = progress.tick(), if give_up.is_some() => {
                let senders = run.counters.senders();
                let acked: u64 = senders.iter().map(|s| s.stats().acked_events).sum();
                let settled: u64 = senders.iter().map(|s| s.settled_events()).sum();
                let outstanding = run.counters.sent.load(Ordering::Relaxed).saturating_sub(settled);
                if acked != last_acked || outstanding == 0 {
                    last_acked = acked;
                    last_progress = Instant::now();
                } else if let Some(limit) = give_up
                    && last_progress.elapsed() >= limit
                {
                    failure.get_or_insert(format!(
                        "no event acknowledged for {} s ({outstanding} outstanding)",
                        limit.as_secs()
                    ));
                    break;
                }
            }
        }
    }
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    let secs = started.elapsed().as_secs_f64();
    let counters = &run.counters;
    let sent = counters.sent.load(Ordering::Relaxed);
    let senders = counters.senders();
    let sum =
        |f: fn(&sender::SenderStats) -> u64| -> u64 { senders.iter().map(|s| f(&s.stats())).sum() };
    let acked = if args.raw {
        counters.acked.load(Ordering::Relaxed)
    } else {
        sum(|s| s.acked_events)
    };
    let mut summary = serde_json::json!({
        "instances": args.instances,
        "turns": counters.turns.load(Ordering::Relaxed),
        "events_sent": sent,
        "events_acked": acked,
        "seconds": secs,
        "events_per_second": if secs > 0.0 { acked as f64 / secs } else { 0.0 },
        "error": failure,
    });
    if !args.raw {
        summary["batches_sent"] = sum(|s| s.sent_batches).into();
        summary["events_evicted"] = sum(|s| s.evicted_events).into();
    }
    if let (Some(path), Some(expect)) = (&args.expect_spans, &run.expect) {
        let ids = expect
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .finish();
        summary["expected_spans"] = ids.len().into();
        write_expected(path, &ids)?;
    }
    println!("{summary}");
    if let Some(e) = failure {
        bail!("load generation failed: {e}");
    }
    Ok(())
}
