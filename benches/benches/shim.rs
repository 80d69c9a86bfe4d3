//! Criterion micro-benchmark of the shim's conversion, on the recorded
//! Hermes fixtures, with the system allocator (the shim runs inside the
//! agent's Python process, whose allocator is the C library's).
//!
//! Group (ids as in `target/criterion/`):
//! * `convert_json/{metadata,content}/{hook}`: the shim's kwargs → event
//!   conversion (`to_event` over `JsonKwargs`) of the largest recorded call
//!   of each hook kind.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use hermes_benches::{Call, FIXTURES, load_fixture};
use hermes_collector_shim::config::CaptureLevel;
use hermes_collector_shim::convert::{JsonKwargs, to_event};

/// The largest recorded call (by JSON size) of every registered hook kind.
fn calls_per_hook() -> Vec<Call> {
    let mut best: Vec<(usize, Call)> = Vec::new();
    for name in FIXTURES {
        for call in load_fixture(name).unwrap() {
            if !CaptureLevel::Metadata.hooks().contains(&call.hook.as_str()) {
                continue;
            }
            let size = serde_json::Value::Object(call.kwargs.clone())
                .to_string()
                .len();
            match best.iter_mut().find(|(_, c)| c.hook == call.hook) {
                Some(entry) if entry.0 < size => *entry = (size, call),
                Some(_) => {}
                None => best.push((size, call)),
            }
        }
    }
    best.into_iter().map(|(_, c)| c).collect()
}

fn convert_json(c: &mut Criterion) {
    let mut group = c.benchmark_group("convert_json");
    group.throughput(Throughput::Elements(1));
    for call in calls_per_hook() {
        for level in [CaptureLevel::Metadata, CaptureLevel::Content] {
            group.bench_function(BenchmarkId::new(level.as_str(), &call.hook), |b| {
                let stamp = call.stamp(1);
                let kwargs = JsonKwargs(&call.kwargs);
                b.iter(|| to_event(&stamp, &kwargs, level));
            });
        }
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = common::config();
    targets = convert_json
}
criterion_main!(benches);
