//! Criterion micro-benchmarks of the collector's stages on the recorded
//! Hermes fixtures, with the collector's allocator (mimalloc, as in
//! `hermes-collector`); the shim's conversion is in `benches/shim.rs`.
//!
//! Groups (ids as in `target/criterion/`):
//! * `correlator_turn/{fixture}`: a fresh correlator ingests one whole
//!   fixture (metadata events) and flushes; throughput in events.
//! * `sequencer_correlator/{in_order,shuffled}/{fixture}`: the same through
//!   the sequencer first, events in capture order or shuffled (fixed seed).
//! * `processor/{metadata,content}`: `SpanProcessor::process` (default
//!   config: gen_ai, redaction, 4 KiB truncation) on a batch of 512 spans;
//!   `processor_all_sets/*` with OpenInference and Langfuse sets too;
//!   `processor_key_rules_only/*` without the default value patterns and
//!   `processor_no_redaction/*` without any redaction rule (what each part of
//!   the redaction costs).
//! * `processor_truncate/many_small_arrays`: `SpanProcessor::process_span`
//!   on one span whose attribute is a JSON object of 5000 small arrays
//!   (359 KB), cut to the default 4 KiB; throughput in input bytes.
//! * `otlp_encode/{metadata,content}`: the exporters' encoding
//!   (`hermes_exporter::encode`, each length measured once) of the
//!   `ExportTraceServiceRequest` of that batch; `otlp_encode_prost/*` is
//!   prost's `encode_to_vec` of the same request, for comparison.
//! * `ingest_decode/metadata`: one wire `EventBatch` of 512 events as the
//!   collector reads it: the receiver's decoding of each event as a view
//!   of the bytes (`WireBatch::from_wire`), then the correlation stage's
//!   reading of those views (`WireBatch::views`);
//!   `ingest_decode/metadata_receiver` is the
//!   receiver's part alone, `ingest_decode/metadata_through_buf` prost decoding the
//!   same bytes through the length-limited `Buf` as tonic's prost codec does.
//! * `stages_per_event/metadata`: decode + sequencer + correlator +
//!   grouping + processor + OTLP encode of all four fixtures, per event: the
//!   in-process CPU cost of one event without the gRPC transports.
//! * `stages_per_event/driver`: the same events through the collector's
//!   correlation stage itself (`hermes_pipeline`'s driver task on a
//!   current-thread runtime, its channels, the derived metrics), encoding
//!   what it exports as it does when every sink sends protobuf: what the
//!   stage adds to the loop above.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use criterion::measurement::WallTime;
use criterion::{
    BatchSize, BenchmarkGroup, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main,
};
use hermes_benches::{FIXTURES, convert, load_fixture, shim_info, span_batch, span_count};
use hermes_collector_shim::config::CaptureLevel;
use hermes_correlator::sequencer::{Sequencer, SequencerConfig};
use hermes_correlator::{Config, Correlation, Correlator, to_resource_spans};
use hermes_exporter::encode::encode_request;
use hermes_processor::{AttributeSet, ProcessorConfig, SpanProcessor};
use hermes_proto::v1::{Event, EventBatch};
use hermes_proto::wire::WireBatch;
use hermes_span::collector::trace::v1::ExportTraceServiceRequest;
use hermes_span::common::v1::{AnyValue, KeyValue, any_value::Value};
use hermes_span::trace::v1::Span;
use opentelemetry_proto::tonic::collector::trace::v1 as otlp;
use prost::Message as _;
use prost::bytes::{Buf as _, Bytes, BytesMut};
use rand::SeedableRng as _;
use rand::seq::SliceRandom as _;

const BATCH_SPANS: usize = 512;

fn fixture_events(level: CaptureLevel) -> Vec<(&'static str, Vec<Event>)> {
    FIXTURES
        .iter()
        .map(|name| {
            let calls = load_fixture(name).unwrap();
            (name.trim_end_matches(".jsonl"), convert(&calls, level))
        })
        .collect()
}

fn correlator_turn(c: &mut Criterion) {
    let shim = shim_info(0, CaptureLevel::Metadata);
    let mut group = c.benchmark_group("correlator_turn");
    for (name, events) in fixture_events(CaptureLevel::Metadata) {
        group.throughput(Throughput::Elements(events.len() as u64));
        group.bench_function(name, |b| {
            b.iter(|| {
                let mut correlator = Correlator::new(Config::default());
                let mut out = Vec::with_capacity(16);
                for event in &events {
                    correlator.ingest(&shim, event, &mut out);
                }
                correlator.flush_all(&mut out);
                out
            });
        });
    }
    group.finish();
}

fn sequencer_correlator(c: &mut Criterion) {
    let shim = shim_info(0, CaptureLevel::Metadata);
    let mut group = c.benchmark_group("sequencer_correlator");
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x6865_726d_6573);
    for (name, events) in fixture_events(CaptureLevel::Metadata) {
        let mut shuffled = events.clone();
        shuffled.shuffle(&mut rng);
        group.throughput(Throughput::Elements(events.len() as u64));
        for (order, input) in [("in_order", &events), ("shuffled", &shuffled)] {
            group.bench_function(BenchmarkId::new(order, name), |b| {
                b.iter_batched(
                    || input.clone(),
                    |input| {
                        let mut correlation = Correlation::new(
                            Sequencer::new(SequencerConfig::default()),
                            Correlator::new(Config::default()),
                        );
                        let mut out = Vec::with_capacity(16);
                        for event in input {
                            correlation.push_batch(&shim, 0, [event], 0, 1, &mut out);
                        }
                        correlation.flush_all(&mut out);
                        out
                    },
                    BatchSize::SmallInput,
                );
            });
        }
    }
    group.finish();
}

/// Benches `id` in `group`: `routine` on a fresh clone of `input` each time,
/// so that the routine may change it in place.
fn on_clones<T: Clone, R>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    id: &str,
    input: &T,
    mut routine: impl FnMut(&mut T) -> R,
) {
    group.bench_function(id, |b| {
        b.iter_batched_ref(|| input.clone(), &mut routine, BatchSize::SmallInput)
    });
}

fn processor(c: &mut Criterion) {
    let mut default = SpanProcessor::new(&ProcessorConfig::default()).unwrap();
    let mut all_sets = SpanProcessor::new(&ProcessorConfig {
        attribute_sets: vec![
            AttributeSet::GenAi,
            AttributeSet::OpenInference,
            AttributeSet::Langfuse,
        ],
        ..ProcessorConfig::default()
    })
    .unwrap();
    // The default rules without their value patterns, and without any rule:
    // what each part of the redaction costs.
    let mut key_rules_only = ProcessorConfig::default();
    key_rules_only.redaction.value_patterns.clear();
    let mut key_rules_only = SpanProcessor::new(&key_rules_only).unwrap();
    let mut no_redaction = ProcessorConfig::default();
    no_redaction.redaction.value_patterns.clear();
    no_redaction.redaction.key_names.clear();
    let mut no_redaction = SpanProcessor::new(&no_redaction).unwrap();
    for (group_name, processor) in [
        ("processor", &mut default),
        ("processor_key_rules_only", &mut key_rules_only),
        ("processor_no_redaction", &mut no_redaction),
        ("processor_all_sets", &mut all_sets),
    ] {
        let mut group = c.benchmark_group(group_name);
        for level in [CaptureLevel::Metadata, CaptureLevel::Content] {
            let batch = span_batch(level, BATCH_SPANS).unwrap();
            group.throughput(Throughput::Elements(span_count(&batch) as u64));
            on_clones(&mut group, level.as_str(), &batch, |batch| {
                processor.process(batch)
            });
        }
        group.finish();
    }
}

fn processor_truncate(c: &mut Criterion) {
    let members: Vec<String> = (0..5000)
        .map(|i| format!("\"k{i}\":[\"{}\",2,3,4,5,6,7,8,9,10]", "v".repeat(40)))
        .collect();
    let doc = format!("{{{}}}", members.join(","));
    let mut config = ProcessorConfig::default();
    config.redaction.value_patterns.clear();
    config.redaction.key_names.clear();
    let mut processor = SpanProcessor::new(&config).unwrap();
    let span = Span {
        name: "x".into(),
        attributes: vec![KeyValue {
            key: "v".into(),
            value: Some(AnyValue {
                value: Some(Value::StringValue(doc.as_str().into())),
            }),
        }],
        ..Span::default()
    };
    let mut group = c.benchmark_group("processor_truncate");
    group.throughput(Throughput::Bytes(doc.len() as u64));
    on_clones(&mut group, "many_small_arrays", &span, |span| {
        processor.process_span(span)
    });
    group.finish();
}

fn otlp_encode(c: &mut Criterion) {
    let mut processor = SpanProcessor::new(&ProcessorConfig::default()).unwrap();
    let requests = [CaptureLevel::Metadata, CaptureLevel::Content].map(|level| {
        let mut batch = span_batch(level, BATCH_SPANS).unwrap();
        processor.process(&mut batch);
        let ours = ExportTraceServiceRequest {
            resource_spans: batch,
        };
        // The same request in prost's messages, for prost's own encoding.
        let prost = otlp::ExportTraceServiceRequest::from(&ours);
        assert_eq!(encode_request(&ours), prost.encode_to_vec());
        (level, ours, prost)
    });
    let mut group = c.benchmark_group("otlp_encode");
    for (level, ours, prost) in &requests {
        group.throughput(Throughput::Bytes(prost.encoded_len() as u64));
        group.bench_function(level.as_str(), |b| b.iter(|| encode_request(ours)));
    }
    group.finish();
    let mut group = c.benchmark_group("otlp_encode_prost");
    for (level, _, prost) in &requests {
        group.throughput(Throughput::Bytes(prost.encoded_len() as u64));
        group.bench_function(level.as_str(), |b| b.iter(|| prost.encode_to_vec()));
    }
    group.finish();
}

/// Wire batches of all four fixtures for one shim, 512 events each, seqs
/// contiguous, as the shim sends them.
fn wire_batches(level: CaptureLevel, copies: usize) -> Vec<Vec<u8>> {
    let templates = fixture_events(level);
    let mut events = Vec::new();
    let mut seq = 0;
    for copy in 0..copies {
        for (_, template) in &templates {
            for event in template {
                let mut event = event.clone();
                seq += 1;
                event.seq = seq;
                if let Some(ids) = event.ids.as_mut() {
                    // Distinct turns per copy (same shapes).
                    for s in [
                        &mut ids.session_id,
                        &mut ids.turn_id,
                        &mut ids.api_request_id,
                    ] {
                        if !s.is_empty() {
                            s.push_str(&format!("#{copy}"));
                        }
                    }
                }
                events.push(event);
            }
        }
    }
    let shim = shim_info(0, level);
    events
        .chunks(512)
        .map(|chunk| {
            EventBatch {
                shim: Some(shim.clone()),
                events: chunk.to_vec(),
                dropped_events: 0,
                floor_seq: 0,
                handoff: false,
            }
            .encode_to_vec()
        })
        .collect()
}

fn ingest_decode(c: &mut Criterion) {
    let batches = wire_batches(CaptureLevel::Metadata, 8);
    let first = &batches[0];
    let n = EventBatch::decode(first.as_slice()).unwrap().events.len();
    let received = || BytesMut::from(first.as_slice());
    let mut group = c.benchmark_group("ingest_decode");
    group.throughput(Throughput::Elements(n as u64));
    // The receiver's codec takes the message's bytes out of tonic's
    // receive buffer without a copy.
    let bytes = Bytes::copy_from_slice(first);
    group.bench_function("metadata", |b| {
        b.iter(|| {
            let batch = WireBatch::from_wire(bytes.clone()).unwrap();
            batch.views().iter().map(|e| e.hook.len()).sum::<usize>()
        })
    });
    group.bench_function("metadata_receiver", |b| {
        b.iter(|| WireBatch::from_wire(bytes.clone()).unwrap())
    });
    // prost reading through the length-limited `Buf` (tonic's prost codec).
    group.bench_function("metadata_through_buf", |b| {
        b.iter_batched_ref(
            received,
            |buf| {
                let len = buf.len();
                EventBatch::decode(&mut buf.take(len)).unwrap()
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

fn stages_per_event(c: &mut Criterion) {
    let mut processor = SpanProcessor::new(&ProcessorConfig::default()).unwrap();
    let batches = wire_batches(CaptureLevel::Metadata, 8);
    let events: usize = batches
        .iter()
        .map(|b| EventBatch::decode(b.as_slice()).unwrap().events.len())
        .sum();
    let mut group = c.benchmark_group("stages_per_event");
    group.throughput(Throughput::Elements(events as u64));
    group.bench_function("metadata", |b| {
        b.iter(|| {
            let mut correlation = Correlation::new(
                Sequencer::new(SequencerConfig::default()),
                Correlator::new(Config::default()),
            );
            let mut out = Vec::with_capacity(512);
            let mut bytes = 0;
            for wire in &batches {
                let mut batch = WireBatch::from_wire(Bytes::copy_from_slice(wire)).unwrap();
                let shim = batch.shim.take().unwrap_or_default();
                correlation.push_wire_batch(&shim, batch.floor_seq, &batch, 0, 1, &mut out);
                if !out.is_empty() {
                    let mut spans = to_resource_spans(std::mem::take(&mut out));
                    processor.process(&mut spans);
                    bytes += encode_request(&ExportTraceServiceRequest {
                        resource_spans: spans,
                    })
                    .len();
                }
            }
            bytes
        });
    });
    group.bench_function("driver", |b| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        b.iter(|| runtime.block_on(through_the_driver(&batches)));
    });
    group.finish();
}

/// Decodes `batches`, runs them through a fresh correlation stage, which
/// encodes what it exports as it does for OTLP sinks; the encoded bytes.
async fn through_the_driver(batches: &[Vec<u8>]) -> usize {
    use hermes_exporter::{ExporterSettings, ExporterStage, Outgoing};
    use hermes_pipeline::clock::WallClock;
    use hermes_pipeline::driver::Driver;
    let mut driver = Driver::in_memory(
        Correlation::new(
            Sequencer::new(SequencerConfig::default()),
            Correlator::new(Config::default()),
        ),
        SpanProcessor::new(&ProcessorConfig::default()).unwrap(),
        WallClock,
    );
    driver.encoder = ExporterStage::new(Vec::new(), ExporterSettings::default()).encoder();
    let (ingest, ingest_rx) = tokio::sync::mpsc::channel(64);
    let (export, mut exported) = tokio::sync::mpsc::channel(64);
    let stage = tokio::spawn(driver.run(ingest_rx, export, Default::default()));
    let feed = async move {
        for wire in batches {
            let batch = WireBatch::from_wire(Bytes::copy_from_slice(wire)).unwrap();
            ingest
                .send(hermes_receiver::Ingested::new(batch))
                .await
                .unwrap();
        }
    };
    let encode = async {
        let mut bytes = 0;
        while let Some(outgoing) = exported.recv().await {
            bytes += match outgoing {
                Outgoing::Encoded(requests) => requests.iter().map(|r| r.bytes().len()).sum(),
                Outgoing::Spans(spans) => encode_request(&ExportTraceServiceRequest {
                    resource_spans: spans,
                })
                .len(),
            };
        }
        bytes
    };
    let ((), bytes) = tokio::join!(feed, encode);
    stage.await.unwrap();
    bytes
}

criterion_group! {
    name = benches;
    config = common::config();
    targets = correlator_turn, sequencer_correlator, processor, processor_truncate, otlp_encode,
        ingest_decode, stages_per_event
}
criterion_main!(benches);
