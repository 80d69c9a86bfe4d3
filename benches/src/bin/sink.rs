//! `hermes-bench-sink`: a minimal OTLP/gRPC trace receiver for the load
//! runs. It keeps no spans: per span it records only the delay from the
//! span's end time (`end_time_unix_nano`, the capture time of the event that
//! ended it) to the moment the export request arrived here.
//!
//! It prints one JSON line on exit (SIGTERM, SIGINT, `--idle-exit-ms` after
//! the last export, or `--max-secs`): spans and exports received, first and
//! last arrival (ns since the epoch), and delay percentiles in ms, for all
//! spans and for turn roots (spans without a parent).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use hermes_benches::now_unix_nanos;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use tokio::signal::unix::{SignalKind, signal};

/// Minimal OTLP/gRPC trace receiver that measures span delivery delay.
#[derive(Debug, Parser)]
#[command(name = "hermes-bench-sink")]
struct Args {
    /// Address to listen on (loopback only).
    #[arg(long, default_value = "127.0.0.1:4317")]
    listen: SocketAddr,
    /// Exit this long after the last export (0: never).
    #[arg(long, default_value_t = 0)]
    idle_exit_ms: u64,
    /// Exit after this many seconds in any case (0: never).
    #[arg(long, default_value_t = 0)]
    max_secs: u64,
}

#[derive(Default)]
struct Recorded {
    spans: u64,
    exports: u64,
    first_arrival: u64,
    last_arrival: u64,
    /// Delay of every span, µs (may be negative if a span ends in the future).
    delays_us: Vec<i64>,
    root_delays_us: Vec<i64>,
}

#[derive(Clone, Default)]
struct Sink {
    recorded: Arc<Mutex<Recorded>>,
}

#[tonic::async_trait]
impl TraceService for Sink {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let now = now_unix_nanos();
        let request = request.into_inner();
        let mut r = self.recorded.lock().unwrap_or_else(PoisonError::into_inner);
        r.exports += 1;
        if r.first_arrival == 0 {
            r.first_arrival = now;
        }
        r.last_arrival = now;
        for span in request
            .resource_spans
            .iter()
            .flat_map(|rs| &rs.scope_spans)
            .flat_map(|ss| &ss.spans)
        {
            r.spans += 1;
            let delay = (i128::from(now) - i128::from(span.end_time_unix_nano)) / 1000;
            let delay = i64::try_from(delay).unwrap_or(i64::MAX);
            r.delays_us.push(delay);
            if span.parent_span_id.is_empty() {
                r.root_delays_us.push(delay);
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

fn percentiles(delays: &mut [i64]) -> serde_json::Value {
    if delays.is_empty() {
        return serde_json::Value::Null;
    }
    delays.sort_unstable();
    let at = |q: f64| {
        let i = ((delays.len() as f64 - 1.0) * q).round() as usize;
        delays[i.min(delays.len() - 1)] as f64 / 1000.0
    };
    serde_json::json!({
        "n": delays.len(),
        "min_ms": at(0.0),
        "p50_ms": at(0.5),
        "p90_ms": at(0.9),
        "p99_ms": at(0.99),
        "p999_ms": at(0.999),
        "max_ms": at(1.0),
    })
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if !args.listen.ip().is_loopback() {
        anyhow::bail!("--listen must be a loopback address");
    }
    let sink = Sink::default();
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("bind {}", args.listen))?;
    eprintln!("hermes-bench-sink: listening on {}", listener.local_addr()?);
    // gzip too: a relay benchmarked against it (rotel) compresses whatever
    // it is told.
    let service = TraceServiceServer::new(sink.clone())
        .max_decoding_message_size(64 << 20)
        .accept_compressed(tonic::codec::CompressionEncoding::Gzip);
    // TCP_NODELAY, as real receivers set it (Go's net package by default,
    // gRPC's C core): with Nagle on, a response written behind a small
    // unacknowledged write waits for the peer's delayed ACK (40 ms).
    let incoming = tokio_stream::StreamExt::map(
        tokio_stream::wrappers::TcpListenerStream::new(listener),
        |stream| {
            stream.and_then(|stream| {
                stream.set_nodelay(true)?;
                Ok(stream)
            })
        },
    );
    let server =
        tokio::spawn(tonic::transport::Server::builder().serve_with_incoming(service, incoming));
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let started = now_unix_nanos();
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = tick.tick() => {
                let now = now_unix_nanos();
                let last = sink.recorded.lock().unwrap_or_else(PoisonError::into_inner).last_arrival;
                if args.idle_exit_ms > 0 && last > 0 && now.saturating_sub(last) >= args.idle_exit_ms * 1_000_000 {
                    break;
                }
                if args.max_secs > 0 && now.saturating_sub(started) >= args.max_secs * 1_000_000_000 {
                    break;
                }
            }
        }
    }
    server.abort();
    let mut r = std::mem::take(&mut *sink.recorded.lock().unwrap_or_else(PoisonError::into_inner));
    let summary = serde_json::json!({
        "spans": r.spans,
        "exports": r.exports,
        "first_arrival_unix_nano": r.first_arrival,
        "last_arrival_unix_nano": r.last_arrival,
        "delay": percentiles(&mut r.delays_us),
        "root_delay": percentiles(&mut r.root_delays_us),
    });
    println!("{summary}");
    Ok(())
}
