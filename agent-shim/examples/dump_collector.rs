//! A minimal collector for trying the shim by hand: accepts
//! `EventIngest/Stream`, acknowledges every batch and prints one line per
//! event to stdout (the shim's `fake_collector`, which also keeps every
//! batch in memory: for short sessions).
//!
//! `cargo run -p hermes-collector-shim --features test-support --example dump_collector -- 127.0.0.1:4319`

use hermes_collector_shim::fake_collector::{Delivery, FakeCollector};
use hermes_proto::v1::EventBatch;

fn print(batch: &EventBatch) {
    let shim = batch.shim.clone().unwrap_or_default();
    println!(
        "batch instance={} pid={} capture={} events={} dropped={}",
        shim.instance_id,
        shim.pid,
        shim.capture,
        batch.events.len(),
        batch.dropped_events
    );
    for e in &batch.events {
        let mut content: Vec<_> = e.content.keys().cloned().collect();
        content.sort();
        println!(
            "  seq={} hook={} thread={} ids={:?} body={:?} content={:?}",
            e.seq, e.hook, e.thread, e.ids, e.body, content
        );
    }
}

fn main() {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:4319".to_owned());
    let collector = FakeCollector::scripted(addr, |delivery: &Delivery<'_>| {
        print(delivery.batch);
        None
    });
    println!("listening on {}", collector.addr());
    loop {
        std::thread::park();
    }
}
