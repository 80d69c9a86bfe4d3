//! The sender thread's supervision: a converter made to panic (test code
//! only: nothing in the product can make the sender panic on purpose).

use std::sync::atomic::AtomicUsize;
use std::time::Instant as StdInstant;

use super::tests::config;
use super::*;
use crate::fake_collector::FakeCollector;

/// Panics on its first `panics` conversions, then passes events through;
/// records the notices it is handed.
#[derive(Clone)]
struct Faulty {
    panics: usize,
    calls: Arc<AtomicUsize>,
    notices: Arc<Mutex<Vec<Notice>>>,
}

impl Faulty {
    fn new(panics: usize) -> Self {
        Faulty {
            panics,
            calls: Arc::default(),
            notices: Arc::default(),
        }
    }

    fn notices(&self) -> Vec<Notice> {
        self.notices.lock().unwrap().clone()
    }
}

impl Convert for Faulty {
    type Item = Event;

    fn convert(&mut self, items: Vec<Event>) -> Vec<Event> {
        if self.calls.fetch_add(1, Ordering::SeqCst) < self.panics {
            panic!("injected sender fault");
        }
        items
    }

    fn notice(&mut self, notice: &Notice) {
        self.notices.lock().unwrap().push(notice.clone());
    }
}

fn event(hook: &str) -> Event {
    Event {
        hook: hook.into(),
        ..Default::default()
    }
}

/// Waits (bounded) until `done` holds.
fn wait_until(mut done: impl FnMut() -> bool) -> bool {
    let deadline = StdInstant::now() + Duration::from_secs(10);
    while !done() {
        if StdInstant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
}

#[test]
fn a_panicking_sender_is_restarted_and_delivers_what_comes_next() {
    let collector = FakeCollector::start(0);
    let mut config = config(collector.endpoint());
    config.restart.delay = Duration::from_millis(300);
    let converter = Faulty::new(1);
    let Started { tx, shared, thread } = start(converter.clone(), config, 8).unwrap();

    // The first batch (one event) makes the sender panic.
    assert!(
        tx.push_and_wake(Event {
            seq: 1,
            ..event("pre_tool_call")
        })
        .is_ok()
    );
    assert!(wait_until(|| shared.stats().sender_deaths == 1));

    // While it is down, hooks return at once: the queue takes 8, the rest
    // is dropped and counted.
    let started = StdInstant::now();
    let pushed = (2..=21)
        .filter(|&seq| {
            tx.push(Event {
                seq,
                ..event("post_tool_call")
            })
            .is_ok()
        })
        .count();
    assert!(started.elapsed() < Duration::from_millis(100));
    assert_eq!(pushed, 8);
    assert_eq!(tx.counters().dropped(), 12);

    // The restarted sender delivers them, and tells the collector what was
    // lost before them.
    assert!(shared.wait_settled(tx.counters().enqueued(), Duration::from_secs(10)));
    let stats = shared.stats();
    assert_eq!(stats.sender_deaths, 1);
    assert_eq!(stats.sender_restarts, 1);
    assert!(!stats.sender_stopped);
    assert_eq!(stats.lost_events, 1, "the batch in hand when it panicked");
    assert_eq!(stats.acked_events, 8);
    assert!(
        stats.last_error.contains("injected sender fault"),
        "{stats:?}"
    );
    assert_eq!(collector.seqs(), (1..=8).collect::<Vec<_>>());
    let last = collector.batches().last().cloned();
    assert_eq!(last.unwrap().dropped_events, 12 + 1);

    // Said once, with its cause and where it happened.
    let notices = converter.notices();
    assert_eq!(notices.len(), 1, "{notices:?}");
    let Notice::SenderDied {
        cause,
        deaths,
        restarting,
        lost,
    } = &notices[0]
    else {
        panic!("{notices:?}");
    };
    assert!(cause.contains("injected sender fault"), "{cause}");
    assert!(cause.contains("tests_supervise.rs"), "{cause}");
    assert_eq!((*deaths, *restarting, *lost), (1, true, 1));
    assert!(notices[0].is_warning());
    assert!(notices[0].to_string().contains("started again"));

    drop(tx);
    thread.join().unwrap();
}

#[test]
fn a_sender_that_keeps_dying_is_stopped_and_never_holds_the_agent() {
    let collector = FakeCollector::start(0);
    let mut config = config(collector.endpoint());
    config.restart = RestartPolicy {
        max_restarts: 2,
        window: Duration::from_secs(60),
        delay: Duration::from_millis(10),
    };
    let converter = Faulty::new(usize::MAX);
    let Started { tx, shared, thread } = start(converter.clone(), config, 1_000).unwrap();

    // Every batch kills it: three deaths, two restarts, then it stops.
    let mut seq = 0;
    assert!(wait_until(|| {
        seq += 1;
        let _ = tx.push_and_wake(Event {
            seq,
            ..event("pre_tool_call")
        });
        shared.is_stopped()
    }));
    thread.join().unwrap();
    let stats = shared.stats();
    assert_eq!(stats.sender_deaths, 3);
    assert_eq!(stats.sender_restarts, 2);
    assert!(stats.sender_stopped);

    // Hooks still return at once: the closed queue drops and counts.
    let dropped = tx.counters().dropped();
    let started = StdInstant::now();
    for _ in 0..1_000 {
        assert!(tx.push_and_wake(event("post_tool_call")).is_err());
    }
    assert!(started.elapsed() < Duration::from_millis(200));
    assert_eq!(tx.counters().dropped(), dropped + 1_000);

    // Every accepted event is accounted for, and no wait blocks the agent.
    assert_eq!(stats.lost_events, tx.counters().enqueued());
    let started = StdInstant::now();
    assert!(shared.wait_settled(tx.counters().enqueued(), Duration::from_secs(5)));
    assert!(!shared.spool_and_wait(Duration::from_secs(5)));
    assert!(!shared.report_exit_and_wait(seq, Duration::from_secs(5)));
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(collector.seqs().is_empty());

    let notices = converter.notices();
    let restarting: Vec<bool> = notices
        .iter()
        .map(|n| match n {
            Notice::SenderDied { restarting, .. } => *restarting,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(restarting, [true, true, false]);
    assert!(notices[2].to_string().contains("not started again"));
}
