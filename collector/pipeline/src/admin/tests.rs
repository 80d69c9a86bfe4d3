#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read as _, Write as _};
use std::net::SocketAddr;

use std::sync::atomic::Ordering;

use hermes_metrics::collector;
use hermes_receiver::ReceiverStats;
use tokio::sync::mpsc;

use super::*;
use crate::stats::PipelineStats;
use crate::writer::QueueStats;

struct Fixture {
    addr: SocketAddr,
    receiver: Arc<ReceiverStats>,
    pipeline: Arc<PipelineStats>,
    readiness: Arc<Readiness>,
    ingest_tx: mpsc::Sender<u32>,
    _ingest_rx: mpsc::Receiver<u32>,
    shutdown: CancellationToken,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

async fn start() -> Fixture {
    let receiver = Arc::new(ReceiverStats::default());
    let pipeline = Arc::new(PipelineStats::default());
    // Only the sink's name matters here; the stage never runs.
    let sinks = vec![hermes_exporter::Sink::new(
        "otlp_grpc",
        hermes_exporter::ConsoleExporter::stdout(hermes_exporter::ConsoleExporterConfig::default()),
    )];
    let stage =
        hermes_exporter::ExporterStage::new(sinks, hermes_exporter::ExporterSettings::default());
    let exporter = stage.stats();
    let readiness = Arc::new(Readiness::default());
    let (ingest_tx, ingest_rx) = mpsc::channel::<u32>(8);
    let (export_tx, _export_rx) = mpsc::channel::<u32>(4);
    let queues = Queues(vec![
        QueueProbe::from_sender("ingest", &ingest_tx),
        QueueProbe::from_sender("export", &export_tx),
    ]);
    let state = AdminState::new(
        readiness.clone(),
        &DerivedMetrics::default(),
        [
            collector(receiver.clone()),
            collector(pipeline.clone()),
            collector(exporter),
            collector(Arc::new(queues)),
        ],
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(serve(listener, state, shutdown.clone()));
    Fixture {
        addr,
        receiver,
        pipeline,
        readiness,
        ingest_tx,
        _ingest_rx: ingest_rx,
        shutdown,
        server,
    }
}

/// One request over a fresh raw connection; returns (status, head, body).
/// Asserts that each of `lines` is a whole line of `body`.
fn assert_lines(body: &str, lines: &[&str]) {
    for line in lines {
        assert!(
            body.lines().any(|l| l == *line),
            "missing `{line}` in\n{body}"
        );
    }
}

async fn get(addr: SocketAddr, method: &str, path: &str, extra: &str) -> (u16, String, String) {
    let request =
        format!("{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n{extra}\r\n");
    tokio::task::spawn_blocking(move || {
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut raw = String::new();
        stream.read_to_string(&mut raw).unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        (status, head.to_owned(), body.to_owned())
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn metrics_read_the_atomics_at_scrape_time() {
    let f = start().await;
    let (status, head, body) = get(f.addr, "GET", "/metrics", "").await;
    assert_eq!(status, 200, "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    assert_lines(
        &body,
        &[
            "hermes_collector_receiver_accepted_events_total 0",
            "hermes_collector_receiver_refused_batches_total 0",
            "hermes_collector_receiver_oversized_events_total 0",
            "hermes_collector_receiver_throttled_batches_total 0",
            "hermes_collector_receiver_streams_opened_total 0",
            "hermes_collector_receiver_unreadable_wire_calls_total 0",
            "hermes_collector_shim_dropped_events_total 0",
            "hermes_collector_correlator_events_total 0",
            "hermes_collector_correlator_duplicate_events_total 0",
            "hermes_collector_correlator_skipped_seqs_total 0",
            "hermes_collector_correlator_held_events 0",
            "hermes_collector_correlator_open_turns 0",
            "hermes_collector_correlator_evicted_turns_total 0",
            "hermes_collector_correlator_expired_total 0",
            "hermes_collector_correlator_evicted_turns_for_bytes_total 0",
            "hermes_collector_correlator_evicted_sessions_total 0",
            "hermes_collector_correlator_late_events_dropped_total 0",
            "hermes_collector_correlator_cross_instance_turns_total 0",
            "hermes_collector_correlator_turns_cut_off_at_exit_total 0",
            "hermes_collector_correlator_turns_handed_off_total 0",
            "hermes_collector_correlator_turns_orphaned_total 0",
            "hermes_collector_correlator_sessions 0",
            "hermes_collector_correlator_held_bytes 0",
            "hermes_collector_correlator_agents 0",
            "hermes_collector_spans_total 0",
            "hermes_collector_exporter_sent_spans_total{exporter=\"otlp_grpc\"} 0",
            "hermes_collector_exporter_send_failed_spans_total{exporter=\"otlp_grpc\"} 0",
            "hermes_collector_exporter_retries_total{exporter=\"otlp_grpc\"} 0",
            "hermes_collector_queue_size{queue=\"ingest\"} 0",
            "hermes_collector_queue_capacity{queue=\"ingest\"} 8",
            "hermes_collector_queue_size{queue=\"export\"} 0",
            "hermes_collector_queue_capacity{queue=\"export\"} 4",
            "# TYPE hermes_collector_spans_total counter",
            "# TYPE hermes_collector_correlator_open_turns gauge",
        ],
    );
    let version = format!(
        "hermes_collector_build_info{{version=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION")
    );
    assert_lines(&body, &[&version]);

    f.receiver.events_accepted.fetch_add(42, Ordering::Relaxed);
    f.receiver.unknown_shim_versions.count("9.9.9");
    f.pipeline.open_turns.store(3, Ordering::Relaxed);
    f.pipeline.spans.fetch_add(7, Ordering::Relaxed);
    f.ingest_tx.send(1).await.unwrap();
    f.ingest_tx.send(2).await.unwrap();
    let (_, _, body) = get(f.addr, "GET", "/metrics", "").await;
    assert_lines(
        &body,
        &[
            "hermes_collector_receiver_accepted_events_total 42",
            "hermes_collector_receiver_unknown_shim_version_streams_total{shim_version=\"9.9.9\"} 1",
            "hermes_collector_correlator_open_turns 3",
            "hermes_collector_spans_total 7",
            "hermes_collector_queue_size{queue=\"ingest\"} 2",
        ],
    );
    f.shutdown.cancel();
    f.server.await.unwrap().unwrap();
}

#[test]
fn the_persistent_queue_reports_its_counters_and_its_fill_level() {
    let stats = Arc::new(QueueStats::default());
    let state = AdminState::new(
        Arc::new(Readiness::default()),
        &DerivedMetrics::default(),
        [
            collector(stats.clone()),
            collector(Arc::new(Queues(vec![QueueStats::fill_probe(&stats)]))),
        ],
    );
    stats.records.store(3, Ordering::Relaxed);
    stats.bytes.store(1_000, Ordering::Relaxed);
    stats.capacity_bytes.store(4_096, Ordering::Relaxed);
    stats.replayed_batches.store(2, Ordering::Relaxed);
    let body = state.render_prometheus().unwrap();
    assert_lines(
        &body,
        &[
            "hermes_collector_persistent_queue_records 3",
            "hermes_collector_persistent_queue_replayed_batches_total 2",
            "hermes_collector_queue_size{queue=\"persistent_bytes\"} 1000",
            "hermes_collector_queue_capacity{queue=\"persistent_bytes\"} 4096",
        ],
    );
}

#[tokio::test]
async fn openmetrics_on_request() {
    let f = start().await;
    let (status, head, body) = get(
        f.addr,
        "GET",
        "/metrics",
        "Accept: application/openmetrics-text;version=1.0.0\r\n",
    )
    .await;
    assert_eq!(status, 200);
    assert!(head.contains("application/openmetrics-text"), "{head}");
    assert!(body.ends_with("# EOF\n"), "{body}");
    f.shutdown.cancel();
    f.server.await.unwrap().unwrap();
}

#[tokio::test]
async fn health_endpoints_follow_readiness() {
    let f = start().await;
    assert_eq!(get(f.addr, "GET", "/livez", "").await.0, 200);
    assert_eq!(get(f.addr, "GET", "/readyz", "").await.0, 503);
    f.readiness.set_receiver_bound(true);
    assert_eq!(
        get(f.addr, "GET", "/readyz", "").await.0,
        503,
        "exporter not running yet"
    );
    f.readiness.set_exporter_running(true);
    let (status, _, body) = get(f.addr, "GET", "/readyz", "").await;
    assert_eq!((status, body.as_str()), (200, "ready\n"));
    f.readiness.set_draining();
    assert_eq!(get(f.addr, "GET", "/readyz", "").await.0, 503);
    assert_eq!(get(f.addr, "GET", "/livez", "").await.0, 200);

    let (status, _, body) = get(f.addr, "HEAD", "/livez", "").await;
    assert_eq!((status, body.as_str()), (200, ""));
    assert_eq!(get(f.addr, "GET", "/", "").await.0, 404);
    assert_eq!(get(f.addr, "GET", "/metrics/x", "").await.0, 404);
    let (status, head, _) = get(f.addr, "POST", "/readyz", "Content-Length: 5\r\n\r\nhello").await;
    assert_eq!(status, 405, "{head}");
    f.shutdown.cancel();
    f.server.await.unwrap().unwrap();
}

#[tokio::test]
async fn readyz_needs_a_serving_ingest_and_an_open_exporter_queue() {
    let f = start().await;
    f.readiness.set_receiver_bound(true);
    f.readiness.set_exporter_running(true);
    let (tx, rx) = mpsc::channel::<u32>(1);
    f.readiness
        .require("the exporter queue is closed", Readiness::channel_open(&tx));
    assert_eq!(get(f.addr, "GET", "/readyz", "").await.0, 200);
    drop(rx);
    let (status, _, body) = get(f.addr, "GET", "/readyz", "").await;
    assert_eq!(
        (status, body.as_str()),
        (503, "not ready: the exporter queue is closed\n")
    );
    f.readiness.set_receiver_bound(false);
    let (status, _, body) = get(f.addr, "GET", "/readyz", "").await;
    assert_eq!(
        (status, body.as_str()),
        (503, "not ready: the ingest listener is not serving\n")
    );
    f.readiness.set_draining();
    let (_, _, body) = get(f.addr, "GET", "/readyz", "").await;
    assert_eq!(body, "not ready: draining\n");
    assert_eq!(get(f.addr, "GET", "/livez", "").await.0, 200);
    f.shutdown.cancel();
    f.server.await.unwrap().unwrap();
}

#[test]
fn the_queue_check_does_not_keep_a_channel_open() {
    let (tx, mut rx) = mpsc::channel::<u32>(1);
    let open = Readiness::channel_open(&tx);
    assert!(open());
    drop(tx);
    assert!(!open(), "no sender left");
    assert!(rx.try_recv().is_err());
}

#[tokio::test]
async fn probes_do_not_keep_a_channel_open() {
    let (tx, mut rx) = mpsc::channel::<u32>(2);
    let probe = QueueProbe::from_sender("ingest", &tx);
    tx.send(1).await.unwrap();
    assert_eq!(
        probe.read(),
        QueueLevel {
            size: 1,
            capacity: 2
        }
    );
    drop(tx);
    assert_eq!(rx.recv().await, Some(1));
    assert_eq!(rx.recv().await, None, "the probe kept the channel open");
    assert_eq!(probe.read().size, 0);
}

#[tokio::test]
async fn shutdown_stops_the_server() {
    let f = start().await;
    // An idle keep-alive connection does not hold the shutdown up.
    let idle = tokio::net::TcpStream::connect(f.addr).await.unwrap();
    f.shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), f.server)
        .await
        .expect("server did not stop")
        .unwrap()
        .unwrap();
    drop(idle);
    assert!(std::net::TcpStream::connect(f.addr).is_err());
}
