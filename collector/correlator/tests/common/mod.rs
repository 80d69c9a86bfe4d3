//! A feed shared by the correlator's tests: events of one agent, built with
//! `hermes_e2e::events`, ingested in order by one correlator, and the spans
//! they closed; [`turn`]: the ids and calls of the rule tests' turn.

// Each test binary uses its own part of these.
#![allow(dead_code)]

pub mod turn;

use hermes_correlator::{Config, Correlator, FinishedSpan};
use hermes_e2e::events::{event, shim};
use hermes_proto::v1::{self, event::Body};
use hermes_span::trace::v1::Span;

/// Events of one agent fed to one correlator in order, with increasing
/// sequence numbers, and the spans they closed.
pub struct Feed {
    pub c: Correlator,
    pub shim: v1::ShimInfo,
    pub out: Vec<FinishedSpan>,
    seq: u64,
}

impl Feed {
    pub fn new() -> Self {
        Self::with(Config::default())
    }

    pub fn with(config: Config) -> Self {
        Self {
            c: Correlator::new(config),
            shim: shim("inst-1"),
            out: Vec::new(),
            seq: 0,
        }
    }

    pub fn ev(&mut self, hook: &str, t_ms: u64, ids: v1::Ids, body: Option<Body>) {
        let shim = self.shim.clone();
        self.ev_from(&shim, hook, t_ms, ids, body);
    }

    /// As [`Self::ev`], sent by another agent.
    pub fn ev_from(
        &mut self,
        shim: &v1::ShimInfo,
        hook: &str,
        t_ms: u64,
        ids: v1::Ids,
        body: Option<Body>,
    ) {
        self.seq += 1;
        let e = v1::Event {
            seq: self.seq,
            ..event(hook, t_ms, ids, body)
        };
        self.c.ingest(shim, &e, &mut self.out);
    }

    pub fn spans(&self, name: &str) -> Vec<&Span> {
        self.spans_where(|s| s.name == name)
    }

    /// The spans whose name starts with `prefix`, in the order they closed.
    pub fn spans_starting(&self, prefix: &str) -> Vec<&Span> {
        self.spans_where(|s| s.name.starts_with(prefix))
    }

    fn spans_where(&self, keep: impl Fn(&Span) -> bool) -> Vec<&Span> {
        self.out
            .iter()
            .map(|s| &s.span)
            .filter(|s| keep(s))
            .collect()
    }

    /// The one span named `name`.
    pub fn one(&self, name: &str) -> &Span {
        let found = self.spans(name);
        assert_eq!(found.len(), 1, "one {name} in {:?}", self.names());
        found[0]
    }

    pub fn names(&self) -> Vec<String> {
        self.out.iter().map(|s| s.span.name.to_string()).collect()
    }
}
