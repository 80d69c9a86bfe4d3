//! Whether the collector can be reached, told where the agent's operator
//! reads: the notices the sender hands to [`Convert::notice`](super::Convert::notice)
//! (the Python extension logs them through the `hermes_collector` logger,
//! into Hermes' `agent.log`).
//!
//! Owns: one sender's outage (since when no stream has been open, and why)
//! and the texts of its three notices: the collector is unreachable (the
//! endpoint, for how long, what happens to the events), it is reachable
//! again, and what was not delivered at exit.
//!
//! Invariants: pure (the caller passes the time); one outage is reported at
//! most once, [`Reach::report_at`] after it began (so a collector that
//! restarts within that delay is not reported), or at exit if it is still on
//! then; its end is reported only if the outage was; no text carries the
//! endpoint's credentials (token, URL user information).

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use tokio::time::Instant;

/// Default delay between the start of an outage and its notice.
pub const DEFAULT_REPORT_AFTER: Duration = Duration::from_secs(2);

/// What happens to the events while the collector cannot be reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holding {
    /// Most unacknowledged batches kept in memory.
    pub max_batches: usize,
    /// Most unacknowledged bytes kept in memory.
    pub max_bytes: usize,
    /// Where what is held at exit goes (none: it is lost).
    pub spool_dir: Option<PathBuf>,
}

/// A notice for the agent's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// No stream could be opened for `down_for`.
    Unreachable {
        /// The endpoint, without credentials.
        endpoint: String,
        /// How long the outage has lasted.
        down_for: Duration,
        /// The last error, with its causes.
        error: String,
        /// What happens to the events.
        holding: Holding,
    },
    /// A stream is open again after a reported outage.
    Reachable {
        /// The endpoint, without credentials.
        endpoint: String,
        /// How long the outage lasted.
        down_for: Duration,
        /// Events the full buffer dropped during the outage.
        dropped: u64,
    },
    /// At exit, events were not delivered.
    Undelivered {
        /// Events written to the spool.
        spooled: u64,
        /// Events lost: not delivered when the process exits, or with no
        /// room in the spool.
        lost: u64,
        /// The spool's directory, if any.
        spool_dir: Option<PathBuf>,
    },
    /// Fleet mode, and the collector does not settle (a release before
    /// fleet support): acknowledged events are let go at the ack.
    NoSettlement {
        /// The endpoint, without credentials.
        endpoint: String,
    },
    /// The sender thread died ([`super::supervise`]).
    SenderDied {
        /// Why: the panic's message and location, or how it ended.
        cause: String,
        /// Deaths so far, this one included.
        deaths: u64,
        /// Whether it is started again; otherwise events are dropped from
        /// now on.
        restarting: bool,
        /// Events lost with it.
        lost: u64,
    },
}

impl Notice {
    /// Whether the notice is a warning (otherwise information): telemetry
    /// is not leaving, or was lost.
    pub fn is_warning(&self) -> bool {
        !matches!(self, Notice::Reachable { .. })
    }
}

fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

impl fmt::Display for Notice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Notice::Unreachable {
                endpoint,
                down_for,
                error,
                holding,
            } => {
                write!(
                    f,
                    "hermes_collector: cannot reach the collector at {endpoint} for {} ({error}); \
                     events are kept in memory (up to {} batches, {} MiB; beyond that the oldest \
                     are dropped and counted) and sent once it is back; ",
                    secs(*down_for),
                    holding.max_batches,
                    holding.max_bytes >> 20,
                )?;
                match &holding.spool_dir {
                    Some(dir) => write!(
                        f,
                        "what is still held at exit is written to the spool {} and sent by a later start",
                        dir.display()
                    ),
                    None => f.write_str(
                        "what is still held at exit is lost and counted \
                         (HERMES_COLLECTOR_SPOOL_DIR keeps it for a later start)",
                    ),
                }
            }
            Notice::Reachable {
                endpoint,
                down_for,
                dropped,
            } => {
                write!(
                    f,
                    "hermes_collector: the collector at {endpoint} is reachable again after {}; \
                     the events held meanwhile are being sent",
                    secs(*down_for)
                )?;
                if *dropped > 0 {
                    write!(f, " ({dropped} were dropped, counted, while it was away)")?;
                }
                Ok(())
            }
            Notice::Undelivered {
                spooled,
                lost,
                spool_dir,
            } => {
                write!(
                    f,
                    "hermes_collector: {} events not delivered to the collector at exit: ",
                    spooled + lost
                )?;
                match spool_dir {
                    Some(dir) if *spooled > 0 => {
                        write!(
                            f,
                            "{spooled} written to the spool {} (sent by a later start)",
                            dir.display()
                        )?;
                        if *lost > 0 {
                            write!(f, ", {lost} lost")?;
                        }
                        Ok(())
                    }
                    Some(_) => write!(f, "{lost} lost (no room in the spool)"),
                    None => write!(
                        f,
                        "{lost} lost (HERMES_COLLECTOR_SPOOL_DIR keeps them for a later start)"
                    ),
                }
            }
            Notice::NoSettlement { endpoint } => write!(
                f,
                "hermes_collector: a replica of the fleet {endpoint} does not say when \
                 events are settled (a collector release before fleet support): \
                 events are let go once acknowledged, so a move to another replica \
                 may split a turn that is open then"
            ),
            Notice::SenderDied {
                cause,
                deaths,
                restarting,
                lost,
            } => {
                write!(
                    f,
                    "hermes_collector: the sender thread died ({cause}; death {deaths}); "
                )?;
                if *restarting {
                    f.write_str(
                        "it is started again and sends the events held meanwhile, \
                         the agent is not affected",
                    )?;
                } else {
                    f.write_str(
                        "it died too often and is not started again: from now on the \
                         events of this process are dropped and counted \
                         (stats(): sender_stopped, dropped), the agent is not affected",
                    )?;
                }
                if *lost > 0 {
                    write!(f, "; {lost} events it held are lost (counted)")?;
                }
                Ok(())
            }
        }
    }
}

/// The endpoint as a notice shows it: without URL user information.
pub fn shown_endpoint(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://{}", &rest[at + 1..]),
        None => url.to_owned(),
    }
}

/// An error and its causes, `outer: inner: root` (tonic's transport error
/// says only "transport error"; the cause says "Connection refused").
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.ends_with(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
}

#[derive(Debug)]
struct Outage {
    since: Instant,
    error: String,
    reported: bool,
    /// The sender's evicted-events counter when the outage began.
    evicted_before: u64,
}

/// The reachability of one sender's collector.
#[derive(Debug)]
pub struct Reach {
    endpoint: String,
    report_after: Duration,
    outage: Option<Outage>,
}

impl Reach {
    /// No outage yet; one is reported `report_after` after it began.
    pub fn new(url: &str, report_after: Duration) -> Reach {
        Reach {
            endpoint: shown_endpoint(url),
            report_after,
            outage: None,
        }
    }

    /// An attempt failed, or a stream ended: starts an outage (if none is
    /// on) and keeps the error.
    pub fn failed(&mut self, now: Instant, error: String, evicted: u64) {
        match &mut self.outage {
            Some(outage) => outage.error = error,
            None => {
                self.outage = Some(Outage {
                    since: now,
                    error,
                    reported: false,
                    evicted_before: evicted,
                })
            }
        }
    }

    /// A stream is open: ends the outage; its notice if it was reported.
    pub fn connected(&mut self, now: Instant, evicted: u64) -> Option<Notice> {
        let outage = self.outage.take()?;
        outage.reported.then(|| Notice::Reachable {
            endpoint: self.endpoint.clone(),
            down_for: now.saturating_duration_since(outage.since),
            dropped: evicted.saturating_sub(outage.evicted_before),
        })
    }

    /// When the current outage is to be reported (none: no outage, or
    /// reported already).
    pub fn report_at(&self) -> Option<Instant> {
        self.outage
            .as_ref()
            .filter(|o| !o.reported)
            .map(|o| o.since + self.report_after)
    }

    /// The notice of the current outage, if it is on and not reported yet
    /// (whatever its length: the exit reports a short one too); marks it
    /// reported.
    pub fn report(&mut self, now: Instant, holding: &Holding) -> Option<Notice> {
        let outage = self.outage.as_mut().filter(|o| !o.reported)?;
        outage.reported = true;
        Some(Notice::Unreachable {
            endpoint: self.endpoint.clone(),
            down_for: now.saturating_duration_since(outage.since),
            error: outage.error.clone(),
            holding: holding.clone(),
        })
    }

    /// Whether an outage is on.
    pub fn is_down(&self) -> bool {
        self.outage.is_some()
    }

    /// At exit: the outage if it is on and not reported yet, then what of
    /// the events captured is not delivered (if any).
    pub fn exit_notices(
        &mut self,
        now: Instant,
        holding: &Holding,
        count: &ExitCount,
    ) -> Vec<Notice> {
        let mut notices: Vec<Notice> = self.report(now, holding).into_iter().collect();
        let lost = count.captured.saturating_sub(count.settled) + count.spool_dropped;
        if count.spooled + lost > 0 {
            notices.push(Notice::Undelivered {
                spooled: count.spooled,
                lost,
                spool_dir: holding.spool_dir.clone(),
            });
        }
        notices
    }
}

/// The sender's counters at exit.
#[derive(Debug, Clone, Copy, Default)]
pub struct ExitCount {
    /// Events captured (queued) before the exit.
    pub captured: u64,
    /// Events acknowledged, evicted, discarded, spooled or dropped by the spool.
    pub settled: u64,
    /// Events written to the spool.
    pub spooled: u64,
    /// Events the spool had no room for.
    pub spool_dropped: u64,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn holding(spool: Option<&str>) -> Holding {
        Holding {
            max_batches: 1_024,
            max_bytes: 32 << 20,
            spool_dir: spool.map(PathBuf::from),
        }
    }

    #[test]
    fn an_outage_is_reported_once_after_the_delay_and_its_end_once() {
        let t0 = Instant::now();
        let mut reach = Reach::new("http://127.0.0.1:9", Duration::from_secs(2));
        assert_eq!(reach.report_at(), None);
        reach.failed(t0, "connect: refused".into(), 3);
        reach.failed(
            t0 + Duration::from_secs(1),
            "connect: still refused".into(),
            4,
        );
        assert_eq!(reach.report_at(), Some(t0 + Duration::from_secs(2)));
        let notice = reach
            .report(t0 + Duration::from_secs(2), &holding(None))
            .unwrap();
        let text = notice.to_string();
        assert!(notice.is_warning());
        assert!(
            text.contains(
                "cannot reach the collector at http://127.0.0.1:9 for 2.0s (connect: still refused)"
            ),
            "{text}"
        );
        assert!(text.contains("up to 1024 batches, 32 MiB"), "{text}");
        assert!(text.contains("at exit is lost and counted"), "{text}");
        assert_eq!(reach.report_at(), None);
        assert_eq!(
            reach.report(t0 + Duration::from_secs(9), &holding(None)),
            None
        );
        let back = reach.connected(t0 + Duration::from_secs(5), 7).unwrap();
        assert!(!back.is_warning());
        assert_eq!(
            back.to_string(),
            "hermes_collector: the collector at http://127.0.0.1:9 is reachable again after 5.0s; \
             the events held meanwhile are being sent (4 were dropped, counted, while it was away)"
        );
        assert_eq!(reach.connected(t0 + Duration::from_secs(6), 7), None);
        assert!(!reach.is_down());
    }

    #[test]
    fn a_short_outage_is_not_reported_nor_its_end() {
        let t0 = Instant::now();
        let mut reach = Reach::new("unix:/run/c.sock", Duration::from_secs(2));
        reach.failed(t0, "stream closed by the collector".into(), 0);
        assert!(reach.is_down());
        assert_eq!(reach.connected(t0 + Duration::from_millis(300), 0), None);
        assert_eq!(reach.report_at(), None);
    }

    #[test]
    fn the_spool_and_the_exit_are_said() {
        let t0 = Instant::now();
        let mut reach = Reach::new("http://c:4319", Duration::from_secs(2));
        reach.failed(t0, "x".into(), 0);
        let text = reach
            .report(
                t0 + Duration::from_millis(400),
                &holding(Some("/var/spool/h")),
            )
            .unwrap()
            .to_string();
        assert!(text.contains("for 0.4s"), "{text}");
        assert!(
            text.ends_with("written to the spool /var/spool/h and sent by a later start"),
            "{text}"
        );
        let exit = Notice::Undelivered {
            spooled: 5,
            lost: 2,
            spool_dir: Some(PathBuf::from("/var/spool/h")),
        };
        assert_eq!(
            exit.to_string(),
            "hermes_collector: 7 events not delivered to the collector at exit: \
             5 written to the spool /var/spool/h (sent by a later start), 2 lost"
        );
        let lost = Notice::Undelivered {
            spooled: 0,
            lost: 3,
            spool_dir: None,
        };
        assert!(lost.is_warning());
        assert!(
            lost.to_string()
                .contains("3 lost (HERMES_COLLECTOR_SPOOL_DIR")
        );
    }

    #[test]
    fn the_exit_reports_an_outage_not_reported_yet_and_what_is_left() {
        let t0 = Instant::now();
        let mut reach = Reach::new("http://h:1", Duration::from_secs(2));
        let all_sent = ExitCount {
            captured: 9,
            settled: 9,
            ..ExitCount::default()
        };
        assert_eq!(reach.exit_notices(t0, &holding(None), &all_sent), []);
        reach.failed(t0, "refused".into(), 0);
        let count = ExitCount {
            captured: 12,
            settled: 2,
            spooled: 0,
            spool_dropped: 0,
        };
        let notices = reach.exit_notices(t0 + Duration::from_millis(700), &holding(None), &count);
        assert_eq!(notices.len(), 2, "{notices:?}");
        assert!(
            notices[0]
                .to_string()
                .contains("at http://h:1 for 0.7s (refused)")
        );
        assert_eq!(
            notices[1],
            Notice::Undelivered {
                spooled: 0,
                lost: 10,
                spool_dir: None
            }
        );
        // Reported once: a second exit report only counts.
        assert_eq!(reach.exit_notices(t0, &holding(None), &count).len(), 1);
    }

    #[test]
    fn credentials_in_the_url_are_never_shown() {
        assert_eq!(
            shown_endpoint("https://user:secret@collector:4319/x"),
            "https://collector:4319/x"
        );
        assert_eq!(
            shown_endpoint("http://127.0.0.1:4319"),
            "http://127.0.0.1:4319"
        );
        assert_eq!(shown_endpoint("http://h/a@b"), "http://h/a@b");
        assert_eq!(shown_endpoint("unix:/run/a@b.sock"), "unix:/run/a@b.sock");
        let reach = Reach::new("http://u:p@h:1", Duration::from_secs(1));
        assert_eq!(reach.endpoint, "http://h:1");
    }

    #[test]
    fn the_error_chain_names_the_cause() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
        #[derive(Debug, thiserror::Error)]
        #[error("transport error")]
        struct Transport(#[source] std::io::Error);
        #[derive(Debug, thiserror::Error)]
        #[error("connect: {0}")]
        struct Connect(#[source] Transport);
        let e = Connect(Transport(io));
        assert_eq!(
            error_chain(&e),
            "connect: transport error: Connection refused"
        );
    }
}
