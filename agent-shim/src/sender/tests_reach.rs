//! The sender's reachability notices, against an in-process collector that
//! is down first and started later.

use std::sync::Mutex;

use super::tests::{config, free_endpoint};
use super::*;
use crate::fake_collector::FakeCollector;

/// Passes events through and records the notices it is handed.
#[derive(Clone, Default)]
pub(super) struct Recorder {
    notices: Arc<Mutex<Vec<Notice>>>,
}

impl Recorder {
    pub(super) fn texts(&self) -> Vec<String> {
        self.notices
            .lock()
            .unwrap()
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    /// Waits (bounded) until `n` notices were handed; asserts that exactly
    /// `n` were, the last starting with `prefix`.
    fn wait_for_notice(&self, n: usize, prefix: &str) -> Vec<String> {
        let texts = self.wait_for(n);
        assert_eq!(texts.len(), n, "{texts:?}");
        assert!(texts[n - 1].starts_with(prefix), "{texts:?}");
        texts
    }

    /// Waits (bounded) until `n` notices were handed.
    pub(super) fn wait_for(&self, n: usize) -> Vec<String> {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while self.notices.lock().unwrap().len() < n && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.texts()
    }
}

impl Convert for Recorder {
    type Item = Event;

    fn convert(&mut self, items: Vec<Event>) -> Vec<Event> {
        items
    }

    fn notice(&mut self, notice: &Notice) {
        self.notices.lock().unwrap().push(notice.clone());
    }
}

fn event(seq: u64) -> Event {
    Event {
        seq,
        hook: "pre_tool_call".into(),
        ..Default::default()
    }
}

#[test]
fn an_outage_is_said_once_and_its_end_once() {
    let (port, endpoint) = free_endpoint();
    let mut config = config(endpoint.clone());
    config.report_unreachable_after = Duration::from_millis(300);
    let recorder = Recorder::default();
    let Started { tx, shared, thread } = start(recorder.clone(), config, 1_000).unwrap();
    for seq in 1..=5 {
        assert!(tx.push(event(seq)).is_ok());
    }
    let texts = recorder.wait_for_notice(
        1,
        &format!("hermes_collector: cannot reach the collector at {endpoint} for 0."),
    );
    assert!(texts[0].contains("Connection refused"), "{texts:?}");
    assert!(texts[0].contains("kept in memory"), "{texts:?}");
    // Reconnect attempts go on (backoff up to 200 ms here) and say nothing more.
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(recorder.texts().len(), 1, "{:?}", recorder.texts());

    let collector = FakeCollector::start(port);
    recorder.wait_for_notice(
        2,
        &format!("hermes_collector: the collector at {endpoint} is reachable again after "),
    );
    assert!(shared.wait_settled(5, Duration::from_secs(10)));
    // Everything delivered: the exit says nothing.
    assert!(shared.report_exit_and_wait(5, Duration::from_secs(5)));
    assert_eq!(recorder.texts().len(), 2, "{:?}", recorder.texts());
    drop(tx);
    thread.join().unwrap();
    drop(collector);
}

#[test]
fn an_exit_before_the_delay_says_the_outage_and_what_is_lost() {
    let (_, endpoint) = free_endpoint();
    let mut config = config(endpoint);
    config.report_unreachable_after = Duration::from_secs(60);
    let recorder = Recorder::default();
    let Started { tx, shared, thread } = start(recorder.clone(), config, 1_000).unwrap();
    for seq in 1..=3 {
        assert!(tx.push(event(seq)).is_ok());
    }
    assert!(!shared.wait_settled(3, Duration::from_millis(300)));
    assert!(recorder.texts().is_empty());
    assert!(shared.report_exit_and_wait(3, Duration::from_secs(5)));
    let texts = recorder.texts();
    assert_eq!(texts.len(), 2, "{texts:?}");
    assert!(texts[0].contains("cannot reach the collector at http://127.0.0.1:"));
    assert!(
        texts[1].starts_with(
            "hermes_collector: 3 events not delivered to the collector at exit: 3 lost"
        ),
        "{texts:?}"
    );
    drop(tx);
    thread.join().unwrap();
}
