//! The correlator: a pure state machine that turns Hermes hook events into
//! the nested spans of `docs/TRACE_MODEL.md`.
//!
//! It owns the open turns, API attempts, tool calls, subagents and approvals,
//! keyed by Hermes' correlation ids. It does no I/O and reads no clock: the
//! driver passes every event with its shim's identity to [`Correlator::ingest`],
//! calls [`Correlator::expire`] on a timer with the current wall-clock time,
//! and [`Correlator::flush_all`] at shutdown. Each call appends the spans it
//! finished to `out`.
//!
//! Invariants:
//! * Every emitted span has a parent that is, or will be, emitted too: an
//!   event for an unknown turn opens (synthesizes) that turn, and a turn is
//!   always closed eventually (its end event, `on_session_finalize`/`reset`,
//!   its TTL, the open-turn limit, or `flush_all`).
//! * Ids are deterministic functions of the event ids ([`ids`]), so a
//!   redelivered event yields the same span ids.
//! * State is bounded: `max_open_turns` open turns; everything else hangs off
//!   a turn or expires with `state_ttl`. Evictions are counted in [`Stats`]
//!   and flushed as spans with `hermes.incomplete=true`, never dropped.
//! * State belongs to the shim instance that opened it ([`fair`]): another
//!   instance's events never touch it, and each instance's turns, sessions
//!   and bytes are budgeted, so one agent only ever evicts its own state
//!   (or, over a global budget, the heaviest agent's).
//! * A turn is exported once: later events of a turn already closed are
//!   dropped and counted ([`Stats::late_events_dropped`]).

mod approval;
mod attrs;
mod content;
pub mod correlation;
mod exit;
mod fair;
pub mod ids;
pub mod sequencer;

pub use correlation::Correlation;

use std::collections::HashMap;
use std::sync::Arc;

use hermes_proto::hooks;
use hermes_proto::v1::{self, event::Body};
use hermes_span::Str;
use hermes_span::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use hermes_span::resource::v1::Resource;
use hermes_span::trace::v1::{ResourceSpans, ScopeSpans, Span, Status, span, status};

pub use attrs::Attrs;
use attrs::Interner;
pub use exit::PROCESS_EXIT_REASON;
use fair::{Closed, Ledger, RECORD_BYTES, TURN_BYTES, key};
use ids::{SpanId, SpanKey, TraceId, scoped_trace_id, span_id, trace_id};

/// The correlator's and the sequencer's maps, keyed by ids from the agents:
/// foldhash's quality hasher, randomly seeded per map, is faster than std's
/// SipHash on the ids' 40-80 bytes (criterion `correlator_turn` -5 to -8 %);
/// the maps are bounded by the limits.
pub(crate) type Map<K, V> = HashMap<K, V, foldhash::quality::RandomState>;

const NANOS_PER_MILLI: u64 = 1_000_000;
const NANOS_PER_SEC: u64 = 1_000_000_000;
/// Name of the instrumentation scope of every span.
pub const SCOPE_NAME: &str = "hermes-collector";

/// Limits and timers of the correlator.
#[derive(Debug, Clone)]
pub struct Config {
    /// Most turns open at once; opening one more closes the oldest as incomplete.
    pub max_open_turns: usize,
    /// Most turns open at once for one agent process (shim instance);
    /// opening one more closes that agent's oldest as incomplete, so one
    /// agent cannot evict the others' turns.
    pub max_open_turns_per_agent: usize,
    /// Most session records (session starts waiting for their first turn,
    /// subagent links) for one agent process; past it, that agent's oldest
    /// is forgotten.
    pub max_sessions_per_agent: usize,
    /// Most session records in all; past it, the oldest of the agent holding
    /// the most is forgotten.
    pub max_sessions: usize,
    /// Approximate bytes of open state (ids, held content, span events) one
    /// agent process may hold; past it, that agent's oldest turn is closed
    /// as incomplete.
    pub max_bytes_per_agent: usize,
    /// Approximate bytes of open state in all; past it, the oldest turn of
    /// the agent holding the most is closed as incomplete.
    pub max_bytes: usize,
    /// How many closed turns are remembered, so that a later event of one
    /// is dropped rather than exporting the turn a second time.
    pub remembered_closed_turns: usize,
    /// A turn, subagent or pending record with no event for this long is
    /// closed as incomplete (turns) or forgotten (links, pending records).
    pub state_ttl_nanos: u64,
    /// After `post_llm_call`, how long to wait for the turn's
    /// `on_session_end` (which carries `completed`/`interrupted`) before
    /// closing the turn without it.
    pub turn_end_grace_nanos: u64,
    /// Version reported as `telemetry.sdk.version`.
    pub sdk_version: String,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            max_open_turns: 10_000,
            max_open_turns_per_agent: 1_000,
            max_sessions_per_agent: 1_000,
            max_sessions: 10_000,
            max_bytes_per_agent: 64 << 20,
            max_bytes: 256 << 20,
            remembered_closed_turns: 16_384,
            state_ttl_nanos: 3600 * NANOS_PER_SEC,
            turn_end_grace_nanos: 2 * NANOS_PER_SEC,
            sdk_version: env!("CARGO_PKG_VERSION").to_owned(),
        }
    }
}

/// A finished span with the resource (agent process) it belongs to.
#[derive(Debug, Clone, PartialEq)]
pub struct FinishedSpan {
    pub resource: Arc<Resource>,
    pub span: Span,
}

/// Counters of what the correlator did; all monotonic.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Stats {
    pub events: u64,
    pub spans: u64,
    /// Turns closed as incomplete by a limit: open turns, bytes held, or
    /// the persistent queue's room.
    pub turns_evicted: u64,
    /// Of `turns_evicted`, those closed by `max_bytes_per_agent` or
    /// `max_bytes`.
    pub turns_evicted_for_bytes: u64,
    /// Session records forgotten by `max_sessions_per_agent` or
    /// `max_sessions`.
    pub sessions_evicted: u64,
    /// Events of a turn already closed (ended, expired or evicted): dropped,
    /// so that no turn is exported twice.
    pub late_events_dropped: u64,
    /// Turns opened with a turn id another shim instance holds: they get a
    /// trace id scoped by their instance.
    pub cross_instance_turns: u64,
    /// Turns, subagents or pending records closed by `state_ttl_nanos`.
    pub expired: u64,
    /// Events of hooks this version does not model (kept as turn events when
    /// their turn is known).
    pub unknown_hooks: u64,
    /// Turns still running when their agent process exited (its shim's
    /// `process_exit` marker): closed as cut off.
    pub cut_off_at_exit: u64,
}

/// How much state the correlator holds now.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Gauges {
    pub open_turns: u64,
    /// Session starts waiting for a turn and subagent links.
    pub sessions: u64,
    /// Approximate bytes of open state.
    pub held_bytes: u64,
    /// Shim instances holding any state.
    pub agents: u64,
}

/// Identity of one agent process, as the spans' resource.
struct ResourceEntry {
    resource: Arc<Resource>,
}

struct OpenAttempt {
    start: u64,
    model: String,
    provider: String,
    base_url: String,
    api_call_count: u64,
    max_tokens: Option<u64>,
    /// `gen_ai.input.messages` and `gen_ai.system_instructions` (content).
    input: (Option<String>, Option<String>),
}

struct OpenTool {
    start: u64,
    name: String,
    /// `gen_ai.tool.call.arguments` (content).
    arguments: Option<String>,
}

// Approximate bytes each open record holds (`fair::Usage::bytes`).
impl OpenAttempt {
    fn bytes(&self) -> usize {
        RECORD_BYTES
            + self.model.len()
            + self.provider.len()
            + self.base_url.len()
            + self.input.0.as_ref().map_or(0, String::len)
            + self.input.1.as_ref().map_or(0, String::len)
    }
}

impl OpenTool {
    fn bytes(&self) -> usize {
        RECORD_BYTES + self.name.len() + self.arguments.as_ref().map_or(0, String::len)
    }
}

/// An open turn: the root of a trace, or a subagent's turn inside its
/// parent's trace.
struct Turn {
    trace_id: TraceId,
    span_id: SpanId,
    parent: Option<SpanId>,
    resource: Arc<Resource>,
    /// The shim instance that opened it: only its events touch the turn.
    instance: Str,
    /// Whether it holds its turn id's plain trace id (else its trace id is
    /// scoped by the instance, or it is a subagent's turn).
    plain: bool,
    /// Approximate bytes it holds, and how many of them its instance's
    /// usage has been charged.
    held: usize,
    charged: usize,
    // Shared: every span of the turn carries them (`Turn::common`).
    turn_id: Str,
    task_id: Str,
    session_id: Str,
    /// The top-level session (differs from `session_id` for subagents).
    root_session_id: Str,
    platform: Str,
    agent_name: Str,
    model: Str,
    start: u64,
    /// `pre_llm_call` seen (else the turn was synthesized from a later event).
    started: bool,
    /// Capture time of `post_llm_call`.
    end: Option<u64>,
    /// When the end was seen: the later of its capture time and the
    /// collector's clock at the time (the last [`Correlator::expire`]); the
    /// end grace runs from here, so a backlog in front of the correlator
    /// never closes a turn whose `on_session_end` is still queued.
    end_seen: u64,
    /// Latest end of any child span: the turn never ends before it.
    max_child_end: u64,
    last_seen: u64,
    /// When the turn last had an event: the later of its capture time and
    /// the collector's clock at the time. The TTL runs from here, so a turn
    /// whose events carry old capture times (a replayed spool, a backlog)
    /// is not expired while its events still arrive.
    active_seen: u64,
    clock_adjusted: bool,
    completed: Option<bool>,
    interrupted: Option<bool>,
    end_reason: String,
    api_attempts: u64,
    tool_calls: u64,
    input_tokens: u64,
    output_tokens: u64,
    events: Vec<span::Event>,
    /// `error.type` of the latest API attempt when it failed (cleared by a
    /// success): a turn that ends without completing reports it.
    last_attempt_error: Option<String>,
    /// `hermes.turn.user_message` / `.final_answer` (content).
    user_message: Option<String>,
    final_answer: Option<String>,
    attempts: Map<(String, u32), OpenAttempt>,
    /// End of the latest closed attempt per api_request_id (start of the next
    /// attempt when its `pre_api_request` is missing).
    last_attempt_end: Map<String, u64>,
    tools: Map<String, OpenTool>,
    approvals: Map<approval::ApprovalKey, approval::OpenApproval>,
    /// Lowest persistent-queue position of the events that touched it.
    min_lsn: u64,
}

/// What a subagent's turns hang from.
#[derive(Clone)]
struct SubagentLink {
    instance: Str,
    /// Charged to the instance (the link and its open subagent).
    bytes: usize,
    trace_id: TraceId,
    span_id: SpanId,
    root_session_id: Str,
    role: Str,
    last_seen: u64,
}

struct OpenSubagent {
    parent: SpanId,
    resource: Arc<Resource>,
    common: Attrs,
    start: u64,
    child_session_id: String,
    child_subagent_id: String,
    goal: String,
    /// Latest end of a closed turn of the child session.
    child_seen: u64,
    min_lsn: u64,
}

struct PendingSessionStart {
    instance: Str,
    bytes: usize,
    at: u64,
    model: String,
    platform: String,
    min_lsn: u64,
}

/// What [`Correlator::expire`] waits for (see [`Correlator::expiry`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expiry {
    /// Open turns or subagents, or resources to drop once their spans are
    /// exported: timers that need every tick.
    EveryTick,
    /// Only state that the TTL alone closes (subagent links that outlived
    /// their subagent, session starts without a turn yet): the wall-clock
    /// time (Unix nanoseconds) when the first of it can go.
    At(u64),
    /// Nothing: until the next event, `expire` changes nothing but the clock.
    Never,
}

/// The correlation state machine. See the module docs.
pub struct Correlator {
    config: Config,
    resources: Map<String, ResourceEntry>,
    /// Open turns, by [`fair::key`] (instance, turn id); likewise the
    /// links, subagents (instance, child session id) and pending starts
    /// (instance, session id).
    turns: Map<String, Turn>,
    /// What each instance holds.
    ledger: Ledger,
    /// Turns closed recently, and the owners of plain trace ids.
    closed: Closed,
    links: Map<String, SubagentLink>,
    subagents: Map<String, OpenSubagent>,
    pending_starts: Map<String, PendingSessionStart>,
    /// Texts of few distinct values that the spans of every turn repeat.
    values: Interner,
    stats: Stats,
    /// Persistent-queue position of the events being ingested.
    lsn: u64,
    /// Wall clock of the last [`Correlator::expire`].
    clock: u64,
}

impl Correlator {
    pub fn new(config: Config) -> Self {
        Self {
            config,
            resources: Map::default(),
            turns: Map::default(),
            ledger: Ledger::default(),
            closed: Closed::default(),
            links: Map::default(),
            subagents: Map::default(),
            pending_starts: Map::default(),
            values: Interner::default(),
            stats: Stats::default(),
            lsn: 0,
            clock: 0,
        }
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Number of turns currently open.
    pub fn open_turns(&self) -> usize {
        self.turns.len()
    }

    /// How much state is held now, for the metrics.
    pub fn gauges(&self) -> Gauges {
        Gauges {
            open_turns: self.turns.len() as u64,
            sessions: self.ledger.sessions as u64,
            held_bytes: self.ledger.bytes as u64,
            agents: self.ledger.agents.len() as u64,
        }
    }

    /// Open turns, session records and bytes `instance_id` holds now.
    pub fn agent_usage(&self, instance_id: &str) -> (usize, usize, usize) {
        let u = self.ledger.of(instance_id);
        (u.turns, u.sessions, u.bytes)
    }

    /// Closed turns remembered (at most `remembered_closed_turns`).
    pub fn remembered_closed_turns(&self) -> usize {
        self.closed.len()
    }

    /// When [`Correlator::expire`] next has something to do, as of its last
    /// clock: the pipeline ticks, sleeps until then, or stops its timer.
    pub fn expiry(&self) -> Expiry {
        if !(self.turns.is_empty() && self.subagents.is_empty() && self.resources.is_empty()) {
            return Expiry::EveryTick;
        }
        // Only the TTL closes what is left: the earliest time it can, by
        // `expire`'s rule (a distance of `ttl` either way from the clock).
        let ttl = self.config.state_ttl_nanos;
        let clock = self.clock;
        let due = |t: u64| {
            if t.saturating_sub(clock) >= ttl {
                clock
            } else {
                t.saturating_add(ttl)
            }
        };
        let links = self.links.values().map(|l| due(l.last_seen));
        let starts = self.pending_starts.values().map(|p| due(p.at));
        links.chain(starts).min().map_or(Expiry::Never, Expiry::At)
    }

    /// Feeds one event of the shim `shim`; finished spans are appended to `out`.
    /// Sets the persistent-queue position of the events ingested next: a
    /// lower bound of the lsns of the records they came from (see
    /// [`sequencer::Sequencer::take_released_lsn`]). Open state remembers
    /// the lowest position that touched it ([`Correlator::min_lsn`]).
    pub fn set_lsn(&mut self, lsn: u64) {
        self.lsn = lsn;
    }

    /// The lowest position any open state depends on: the persistent queue
    /// keeps every record from there on, so that a restart can rebuild the
    /// state by replaying them. Subagent links that outlive their subagent
    /// are not counted (a child event after a crash and a TTL-long gap
    /// starts its own trace).
    pub fn min_lsn(&self) -> Option<u64> {
        let turns = self.turns.values().map(|t| t.min_lsn);
        let subagents = self.subagents.values().map(|s| s.min_lsn);
        let starts = self.pending_starts.values().map(|p| p.min_lsn);
        turns.chain(subagents).chain(starts).min()
    }

    pub fn ingest(&mut self, shim: &v1::ShimInfo, event: &v1::Event, out: &mut Vec<FinishedSpan>) {
        self.stats.events += 1;
        let before = out.len();
        let resource = self.resource(shim, &event.schema_version);
        let instance = shim.instance_id.as_str();
        let no_ids;
        let ids = match &event.ids {
            Some(ids) => ids,
            None => {
                no_ids = v1::Ids::default();
                &no_ids
            }
        };
        let t = event.time_unix_nano;
        let platform = match event.body.as_ref() {
            Some(Body::Session(b)) => b.platform.as_str(),
            Some(Body::Turn(b)) => b.platform.as_str(),
            Some(Body::Api(b)) => b.platform.as_str(),
            _ => "",
        };
        match (event.hook.as_str(), event.body.as_ref()) {
            (hooks::ON_SESSION_START, body) => {
                let (model, platform) = match body {
                    Some(Body::Session(s)) => (s.model.clone(), s.platform.clone()),
                    _ => Default::default(),
                };
                self.session_start(instance, &ids.session_id, t, model, platform);
            }
            (hooks::PRE_LLM_CALL, body) => {
                self.close_superseded(ids, instance, out);
                let turn = self.turn_with(instance, ids, &resource, t, platform, out);
                if let Some(turn) = turn {
                    if !turn.started {
                        // pre_llm_call is the turn's real start, whatever
                        // events arrived before it.
                        turn.started = true;
                        turn.start = t;
                    }
                    if let Some(Body::Turn(b)) = body
                        && !b.model.is_empty()
                    {
                        turn.model = b.model.as_str().into();
                    }
                    if let Some(text) = event.content.get(content::USER_MESSAGE) {
                        let text = content::text(text);
                        turn.held += text.len();
                        if let Some(old) = turn.user_message.replace(text) {
                            turn.held = turn.held.saturating_sub(old.len());
                        }
                    }
                }
                self.attach_session_start(instance, &ids.session_id);
            }
            (hooks::POST_LLM_CALL, _) => {
                let clock = self.clock;
                if let Some(turn) = self.turn_with(instance, ids, &resource, t, platform, out) {
                    turn.end = Some(turn.end.map_or(t, |e| e.max(t)));
                    turn.end_seen = t.max(clock);
                    if let Some(text) = event.content.get(content::ASSISTANT_RESPONSE) {
                        let text = content::text(text);
                        turn.held += text.len();
                        if let Some(old) = turn.final_answer.replace(text) {
                            turn.held = turn.held.saturating_sub(old.len());
                        }
                    }
                }
            }
            (hooks::ON_SESSION_END, body) => {
                if ids.turn_id.is_empty() {
                    // Shutdown variant: no turn id; closes the session.
                    self.close_session(&ids.session_id, instance, t, out);
                } else if let Some(turn) =
                    self.turn_with(instance, ids, &resource, t, platform, out)
                {
                    if let Some(Body::Turn(b)) = body {
                        turn.completed = b.completed;
                        turn.interrupted = b.interrupted;
                        turn.end_reason = b.reason.clone();
                    }
                    let end = turn.end.unwrap_or(t);
                    if let Some(turn) = self.take_turn(&key(instance, &ids.turn_id)) {
                        self.emit_turn(turn, end, false, out);
                    }
                }
            }
            (hooks::ON_SESSION_FINALIZE | hooks::ON_SESSION_RESET, _) => {
                self.close_session(&ids.session_id, instance, t, out);
            }
            (hooks::PRE_API_REQUEST, Some(Body::Api(api))) => {
                if let Some(turn) = self.turn_with(instance, ids, &resource, t, platform, out) {
                    let start = if api.attempt <= 1 && api.started_at_unix_nano > 0 {
                        api.started_at_unix_nano
                    } else {
                        t
                    };
                    let attempt = OpenAttempt {
                        start,
                        model: api.model.clone(),
                        provider: api.provider.clone(),
                        base_url: api.base_url.clone(),
                        api_call_count: api.api_call_count,
                        max_tokens: api.max_tokens,
                        input: event
                            .content
                            .get(content::REQUEST)
                            .map_or((None, None), |r| content::chat_input(r)),
                    };
                    turn.held += attempt.bytes() + ids.api_request_id.len();
                    let old = turn
                        .attempts
                        .insert((ids.api_request_id.clone(), api.attempt.max(1)), attempt);
                    if let Some(old) = old {
                        turn.held = turn
                            .held
                            .saturating_sub(old.bytes() + ids.api_request_id.len());
                    }
                }
            }
            (hooks::POST_API_REQUEST | hooks::API_REQUEST_ERROR, Some(Body::Api(api))) => {
                let failed = event.hook == hooks::API_REQUEST_ERROR;
                if let Some((turn, values)) =
                    self.turn_and_values(instance, ids, &resource, t, platform, out)
                {
                    let span = close_attempt(
                        turn,
                        values,
                        &ids.api_request_id,
                        api,
                        failed,
                        t,
                        &event.content,
                    );
                    out.push(span);
                }
            }
            (hooks::PRE_TOOL_CALL, body) => {
                if let Some(turn) = self.turn_with(instance, ids, &resource, t, platform, out) {
                    let name = match body {
                        Some(Body::Tool(b)) => b.tool_name.clone(),
                        _ => String::new(),
                    };
                    let arguments = event.content.get(content::ARGS).cloned();
                    let tool = OpenTool {
                        start: t,
                        name,
                        arguments,
                    };
                    turn.held += tool.bytes() + ids.tool_call_id.len();
                    if let Some(old) = turn.tools.insert(ids.tool_call_id.clone(), tool) {
                        turn.held = turn
                            .held
                            .saturating_sub(old.bytes() + ids.tool_call_id.len());
                    }
                }
            }
            (hooks::POST_TOOL_CALL, body) => {
                let no_tool;
                let tool = match body {
                    Some(Body::Tool(b)) => b,
                    _ => {
                        no_tool = v1::ToolCall::default();
                        &no_tool
                    }
                };
                if let Some((turn, values)) =
                    self.turn_and_values(instance, ids, &resource, t, platform, out)
                {
                    // Requests of this tool still waiting are unanswered:
                    // closed with it, under it.
                    approval::close_for_tool(turn, &ids.tool_call_id, t, out);
                    let open = turn.tools.remove(&ids.tool_call_id);
                    if let Some(o) = &open {
                        turn.held = turn.held.saturating_sub(o.bytes() + ids.tool_call_id.len());
                    }
                    let mut span = close_tool(turn, values, &ids.tool_call_id, open, tool, t);
                    if let Some(result) = event.content.get(content::RESULT) {
                        span.span.attributes.push(attrs::kv(
                            "gen_ai.tool.call.result",
                            any_value::Value::StringValue(content::text(result).into()),
                        ));
                    }
                    out.push(span);
                }
            }
            (hooks::SUBAGENT_START, body) => {
                let no_sub;
                let sub = match body {
                    Some(Body::Subagent(s)) => s,
                    _ => {
                        no_sub = v1::Subagent::default();
                        &no_sub
                    }
                };
                self.subagent_start(instance, ids, sub, &resource, t, out);
            }
            (hooks::SUBAGENT_STOP, body) => {
                let no_sub;
                let sub = match body {
                    Some(Body::Subagent(s)) => s,
                    _ => {
                        no_sub = v1::Subagent::default();
                        &no_sub
                    }
                };
                self.subagent_stop(instance, ids, sub, &resource, t, out);
            }
            (hooks::PRE_APPROVAL_REQUEST, body) => {
                let no_appr;
                let appr = match body {
                    Some(Body::Approval(a)) => a,
                    _ => {
                        no_appr = v1::Approval::default();
                        &no_appr
                    }
                };
                if let Some(turn) = self.turn_with(instance, ids, &resource, t, platform, out) {
                    approval::request(turn, ids, appr, t);
                }
            }
            (hooks::POST_APPROVAL_RESPONSE, body) => {
                let no_appr;
                let appr = match body {
                    Some(Body::Approval(a)) => a,
                    _ => {
                        no_appr = v1::Approval::default();
                        &no_appr
                    }
                };
                if let Some(turn) = self.turn_with(instance, ids, &resource, t, platform, out) {
                    let span = approval::respond(turn, ids, appr, t);
                    out.push(span);
                }
            }
            (hooks::PROCESS_EXIT, _) => self.process_exit(instance, t, out),
            (hook, body) => {
                self.stats.unknown_hooks += 1;
                let turn_key = key(instance, &ids.turn_id);
                if self.closed.contains(&turn_key) {
                    self.stats.late_events_dropped += 1;
                }
                if let Some(turn) = self.turns.get_mut(&turn_key) {
                    let mut attrs = Attrs::default();
                    if let Some(Body::Other(other)) = body {
                        let mut keys: Vec<_> = other.fields.keys().collect();
                        keys.sort();
                        for k in keys {
                            if let Some(v) = other.fields.get(k).and_then(|s| s.value.clone()) {
                                attrs.0.push(scalar_kv(k, v));
                            }
                        }
                    }
                    turn.last_seen = turn.last_seen.max(t);
                    turn.active_seen = turn.active_seen.max(t).max(self.clock);
                    turn.min_lsn = turn.min_lsn.min(self.lsn);
                    turn.held += RECORD_BYTES
                        + hook.len()
                        + attrs.0.iter().map(attrs::approx_bytes).sum::<usize>();
                    turn.events.push(span::Event {
                        time_unix_nano: t,
                        name: format!("hermes.hook.{hook}").into(),
                        attributes: attrs.0,
                        dropped_attributes_count: 0,
                    });
                }
            }
        }
        // Charge what the event added, then hold every budget.
        if !ids.turn_id.is_empty() {
            self.charge_turn(&key(instance, &ids.turn_id));
        }
        if !ids.parent_turn_id.is_empty() {
            self.charge_turn(&key(instance, &ids.parent_turn_id));
        }
        self.enforce_budgets(instance, out);
        self.stats.spans += (out.len() - before) as u64;
    }

    /// Closes what has outlived its timers at wall-clock time `now`. The
    /// TTL counts both ways: state stamped further than the TTL in the
    /// future (a hostile or broken clock) is closed too, never kept forever.
    pub fn expire(&mut self, now: u64, out: &mut Vec<FinishedSpan>) {
        self.clock = self.clock.max(now);
        let before = out.len();
        let ttl = self.config.state_ttl_nanos;
        let grace = self.config.turn_end_grace_nanos;
        let mut ended: Vec<(String, bool)> = self
            .turns
            .iter()
            .filter_map(|(id, turn)| match turn.end {
                Some(_) if now.saturating_sub(turn.end_seen) >= grace => Some((id.clone(), false)),
                _ if now.abs_diff(turn.active_seen) >= ttl => Some((id.clone(), true)),
                _ => None,
            })
            .collect();
        ended.sort();
        for (id, incomplete) in ended {
            if let Some(turn) = self.take_turn(&id) {
                if incomplete {
                    self.stats.expired += 1;
                }
                let end = turn.end.unwrap_or(turn.last_seen);
                self.emit_turn(turn, end, incomplete, out);
            }
        }
        let mut stale: Vec<String> = self
            .subagents
            .iter()
            .filter(|(_, s)| now.abs_diff(s.start) >= ttl)
            .map(|(k, _)| k.clone())
            .collect();
        stale.sort();
        for child in stale {
            self.stats.expired += 1;
            let end = self.subagent_end(&child);
            self.subagent_stop_at(&child, &v1::Subagent::default(), end, true, out);
        }
        // A link lives as long as its subagent is open (its span needs it).
        let open = &self.subagents;
        let mut stale: Vec<String> = self
            .links
            .iter()
            .filter(|(child, l)| !open.contains_key(*child) && now.abs_diff(l.last_seen) >= ttl)
            .map(|(k, _)| k.clone())
            .collect();
        stale.sort();
        for k in stale {
            self.remove_link(&k);
        }
        self.drop_pending_starts(|p| now.abs_diff(p.at) >= ttl);
        self.resources
            .retain(|_, r| Arc::strong_count(&r.resource) > 1);
        self.stats.spans += (out.len() - before) as u64;
    }

    /// Closes, as incomplete, every open state that depends on a position
    /// below `lsn` (the persistent queue is full and must let those records
    /// go); counted as evictions.
    pub fn evict_below_lsn(&mut self, lsn: u64, out: &mut Vec<FinishedSpan>) {
        let before = out.len();
        let mut ids: Vec<String> = self
            .turns
            .iter()
            .filter(|(_, t)| t.min_lsn < lsn)
            .map(|(id, _)| id.clone())
            .collect();
        ids.sort();
        for id in ids {
            if let Some(turn) = self.take_turn(&id) {
                self.stats.turns_evicted += 1;
                let end = turn.end.unwrap_or(turn.last_seen);
                self.emit_turn(turn, end, true, out);
            }
        }
        let mut subs: Vec<String> = self
            .subagents
            .iter()
            .filter(|(_, s)| s.min_lsn < lsn)
            .map(|(k, _)| k.clone())
            .collect();
        subs.sort();
        for child in subs {
            let end = self.subagent_end(&child);
            self.subagent_stop_at(&child, &v1::Subagent::default(), end, true, out);
        }
        self.drop_pending_starts(|p| p.min_lsn < lsn);
        self.stats.spans += (out.len() - before) as u64;
    }

    /// Closes everything still open (shutdown), as incomplete.
    pub fn flush_all(&mut self, out: &mut Vec<FinishedSpan>) {
        let before = out.len();
        let mut ids: Vec<String> = self.turns.keys().cloned().collect();
        ids.sort();
        for id in ids {
            if let Some(turn) = self.take_turn(&id) {
                let end = turn.end.unwrap_or(turn.last_seen);
                let incomplete = turn.end.is_none();
                self.emit_turn(turn, end, incomplete, out);
            }
        }
        let mut subs: Vec<String> = self.subagents.keys().cloned().collect();
        subs.sort();
        for child in subs {
            let end = self.subagent_end(&child);
            self.subagent_stop_at(&child, &v1::Subagent::default(), end, true, out);
        }
        self.stats.spans += (out.len() - before) as u64;
    }

    fn resource(&mut self, shim: &v1::ShimInfo, schema_version: &str) -> Arc<Resource> {
        if let Some(entry) = self.resources.get(&shim.instance_id) {
            return entry.resource.clone();
        }
        let mut a = Attrs::with_capacity(9);
        a.str(
            "service.name",
            if shim.service_name.is_empty() {
                "hermes-agent"
            } else {
                &shim.service_name
            },
        )
        .str("service.instance.id", &shim.instance_id)
        .str("host.name", &shim.host_name)
        .int("process.pid", i64::from(shim.pid))
        .str("telemetry.sdk.name", SCOPE_NAME)
        .fixed("telemetry.sdk.language", "rust")
        .str("telemetry.sdk.version", &self.config.sdk_version)
        .str("hermes.telemetry_schema_version", schema_version)
        .str("hermes.shim.version", &shim.shim_version)
        .str("hermes.capture", &shim.capture);
        let resource = Arc::new(Resource {
            attributes: a.0,
            dropped_attributes_count: 0,
        });
        self.resources.insert(
            shim.instance_id.clone(),
            ResourceEntry {
                resource: resource.clone(),
            },
        );
        resource
    }

    /// The open turn of `ids.turn_id` of `instance`, opened (synthesized)
    /// if unknown. `None` when the event carries no turn id, or when that
    /// turn was closed already (the event is counted as late).
    fn turn(
        &mut self,
        instance: &str,
        ids: &v1::Ids,
        resource: &Arc<Resource>,
        t: u64,
        out: &mut Vec<FinishedSpan>,
    ) -> Option<&mut Turn> {
        self.turn_with(instance, ids, resource, t, "", out)
    }

    /// As [`Self::turn`], also recording the platform the event names.
    fn turn_with(
        &mut self,
        instance: &str,
        ids: &v1::Ids,
        resource: &Arc<Resource>,
        t: u64,
        platform: &str,
        out: &mut Vec<FinishedSpan>,
    ) -> Option<&mut Turn> {
        self.turn_and_values(instance, ids, resource, t, platform, out)
            .map(|(turn, _)| turn)
    }

    /// As [`Self::turn_with`], with the correlator's shared values for the
    /// span that the event closes.
    fn turn_and_values(
        &mut self,
        instance: &str,
        ids: &v1::Ids,
        resource: &Arc<Resource>,
        t: u64,
        platform: &str,
        out: &mut Vec<FinishedSpan>,
    ) -> Option<(&mut Turn, &mut Interner)> {
        if ids.turn_id.is_empty() {
            return None;
        }
        let k = key(instance, &ids.turn_id);
        if !self.turns.contains_key(&k) {
            if self.closed.contains(&k) {
                self.stats.late_events_dropped += 1;
                return None;
            }
            self.make_room_for_turn(instance, out);
            let turn = self.new_turn(instance, ids, resource, t);
            self.ledger.add(instance, 1, 0, turn.charged);
            self.turns.insert(k.clone(), turn);
        }
        let lsn = self.lsn;
        let clock = self.clock;
        let turn = self.turns.get_mut(&k)?;
        turn.last_seen = turn.last_seen.max(t);
        turn.active_seen = turn.active_seen.max(t).max(clock);
        turn.min_lsn = turn.min_lsn.min(lsn);
        if turn.platform.is_empty() && !platform.is_empty() {
            turn.platform = platform.into();
            turn.held += platform.len();
        }
        if turn.task_id.is_empty() && !ids.task_id.is_empty() {
            turn.task_id = ids.task_id.as_str().into();
            turn.held += ids.task_id.len();
        }
        if t < turn.start && !turn.started {
            turn.start = t;
        }
        Some((turn, &mut self.values))
    }

    fn new_turn(
        &mut self,
        instance: &str,
        ids: &v1::Ids,
        resource: &Arc<Resource>,
        t: u64,
    ) -> Turn {
        let link = self
            .links
            .get_mut(&key(instance, &ids.session_id))
            .map(|l| {
                l.last_seen = l.last_seen.max(t);
                l.clone()
            });
        let instance: Str = instance.into();
        let mut plain = false;
        let (trace, parent, root_session, agent_name) = match &link {
            Some(l) => (
                l.trace_id,
                Some(l.span_id),
                l.root_session_id.clone(),
                l.role.clone(),
            ),
            None => {
                // The first instance to open a turn id gets its plain trace
                // id; another one, a trace id of its own.
                plain = self.closed.claim(&ids.turn_id, &instance);
                let trace = if plain {
                    trace_id(&ids.turn_id)
                } else {
                    self.stats.cross_instance_turns += 1;
                    scoped_trace_id(&instance, &ids.turn_id)
                };
                (
                    trace,
                    None,
                    ids.session_id.as_str().into(),
                    Str::from_static("hermes"),
                )
            }
        };
        let held = TURN_BYTES + 2 * ids.turn_id.len() + ids.session_id.len() + ids.task_id.len();
        Turn {
            trace_id: trace,
            span_id: span_id(SpanKey::Turn {
                turn_id: &ids.turn_id,
            }),
            parent,
            resource: resource.clone(),
            instance,
            plain,
            held,
            charged: held,
            turn_id: ids.turn_id.as_str().into(),
            task_id: ids.task_id.as_str().into(),
            session_id: ids.session_id.as_str().into(),
            root_session_id: root_session,
            platform: Str::default(),
            agent_name,
            model: Str::default(),
            start: t,
            started: false,
            end: None,
            end_seen: 0,
            max_child_end: 0,
            last_seen: t,
            active_seen: t.max(self.clock),
            clock_adjusted: false,
            completed: None,
            interrupted: None,
            end_reason: String::new(),
            api_attempts: 0,
            tool_calls: 0,
            input_tokens: 0,
            output_tokens: 0,
            events: Vec::new(),
            last_attempt_error: None,
            user_message: None,
            final_answer: None,
            attempts: Map::default(),
            last_attempt_end: Map::default(),
            tools: Map::default(),
            approvals: Map::default(),
            min_lsn: self.lsn,
        }
    }

    /// Removes an open turn by its key: its instance is refunded, and the
    /// turn is remembered as closed.
    fn take_turn(&mut self, k: &str) -> Option<Turn> {
        let turn = self.turns.remove(k)?;
        self.ledger.sub(&turn.instance, 1, 0, turn.charged);
        let plain = turn
            .plain
            .then(|| (turn.turn_id.as_str().to_owned(), turn.instance.clone()));
        self.closed
            .push(k.to_owned(), plain, self.config.remembered_closed_turns);
        Some(turn)
    }

    fn session_start(
        &mut self,
        instance: &str,
        session_id: &str,
        t: u64,
        model: String,
        platform: String,
    ) {
        if session_id.is_empty() {
            return;
        }
        let k = key(instance, session_id);
        self.drop_pending_start(&k);
        let bytes = RECORD_BYTES + k.len() + model.len() + platform.len();
        self.ledger.add(instance, 0, 1, bytes);
        self.pending_starts.insert(
            k,
            PendingSessionStart {
                instance: instance.into(),
                bytes,
                at: t,
                model,
                platform,
                min_lsn: self.lsn,
            },
        );
        self.attach_session_start(instance, session_id);
    }

    /// Forgets the pending session starts `stale` picks.
    fn drop_pending_starts(&mut self, stale: impl Fn(&PendingSessionStart) -> bool) {
        let mut keys: Vec<String> = self
            .pending_starts
            .iter()
            .filter(|(_, p)| stale(p))
            .map(|(k, _)| k.clone())
            .collect();
        keys.sort();
        for k in keys {
            self.drop_pending_start(&k);
        }
    }

    /// Attaches a pending `on_session_start` as an event on the session's
    /// earliest open turn of the same instance.
    fn attach_session_start(&mut self, instance: &str, session_id: &str) {
        let k = key(instance, session_id);
        if !self.pending_starts.contains_key(&k) {
            return;
        }
        let first = self
            .turns
            .iter()
            .filter(|(_, t)| t.session_id == session_id && t.instance == instance)
            .min_by(|a, b| (a.1.start, a.0).cmp(&(b.1.start, b.0)))
            .map(|(k, _)| k.clone());
        let Some(turn_key) = first else {
            return;
        };
        let Some(p) = self.pending_starts.remove(&k) else {
            return;
        };
        self.ledger.sub(instance, 0, 1, p.bytes);
        if let Some(turn) = self.turns.get_mut(&turn_key) {
            let mut a = Attrs::default();
            a.str("gen_ai.request.model", &p.model)
                .str("hermes.platform", &p.platform);
            turn.held += RECORD_BYTES + p.model.len() + p.platform.len();
            turn.events.push(span::Event {
                time_unix_nano: p.at,
                name: Str::from_static("hermes.session.start"),
                attributes: a.0,
                dropped_attributes_count: 0,
            });
            turn.start = turn.start.min(p.at);
        }
        self.charge_turn(&turn_key);
    }

    /// A new turn of a session starts: an agent runs its turns one after the
    /// other, so a turn of the same session and agent process still open
    /// ended without `on_session_end` (Hermes' failure paths fire none).
    fn close_superseded(&mut self, ids: &v1::Ids, instance_id: &str, out: &mut Vec<FinishedSpan>) {
        let k = key(instance_id, &ids.turn_id);
        if ids.session_id.is_empty() || self.turns.contains_key(&k) || self.closed.contains(&k) {
            return;
        }
        let mut ended: Vec<String> = self
            .turns
            .iter()
            .filter(|(_, turn)| turn.session_id == ids.session_id && turn.instance == instance_id)
            .map(|(id, _)| id.clone())
            .collect();
        ended.sort();
        for id in ended {
            if let Some(turn) = self.take_turn(&id) {
                let incomplete = turn.end.is_none();
                let end = turn.end.unwrap_or(turn.last_seen);
                self.emit_turn(turn, end, incomplete, out);
            }
        }
    }

    /// `on_session_finalize`/`reset` (or the shutdown `on_session_end`): closes
    /// every open turn of the session of the shim instance (every turn of
    /// the instance when the session id is absent).
    fn close_session(
        &mut self,
        session_id: &str,
        instance_id: &str,
        t: u64,
        out: &mut Vec<FinishedSpan>,
    ) {
        let mut ids: Vec<String> = self
            .turns
            .iter()
            .filter(|(_, turn)| {
                turn.instance == instance_id
                    && (session_id.is_empty() || turn.session_id == session_id)
            })
            .map(|(id, _)| id.clone())
            .collect();
        ids.sort();
        for id in ids {
            if let Some(turn) = self.take_turn(&id) {
                let incomplete = turn.end.is_none();
                let end = turn.end.unwrap_or(t);
                self.emit_turn(turn, end, incomplete, out);
            }
        }
    }

    fn subagent_start(
        &mut self,
        instance: &str,
        ids: &v1::Ids,
        sub: &v1::Subagent,
        resource: &Arc<Resource>,
        t: u64,
        out: &mut Vec<FinishedSpan>,
    ) {
        // Without a child session nothing can hang from the subagent, and a
        // session cannot be its own subagent (hostile or broken ids). A
        // second start for a child whose subagent is still open is ignored
        // too: the child's turns already hang from the first one, in its
        // trace, and moving the link would orphan them.
        let child_key = key(instance, &ids.child_session_id);
        if ids.child_session_id.is_empty()
            || ids.child_session_id == ids.parent_session_id
            || self.subagents.contains_key(&child_key)
        {
            self.stats.unknown_hooks += 1;
            return;
        }
        let parent_ids = v1::Ids {
            session_id: ids.parent_session_id.clone(),
            turn_id: ids.parent_turn_id.clone(),
            ..Default::default()
        };
        let Some(parent_turn) = self.turn(instance, &parent_ids, resource, t, out) else {
            return;
        };
        let delegates: Vec<&String> = parent_turn
            .tools
            .iter()
            .filter(|(_, tool)| tool.name == "delegate_task")
            .map(|(id, _)| id)
            .collect();
        let parent = match delegates.as_slice() {
            [only] => span_id(SpanKey::Tool {
                turn_id: &ids.parent_turn_id,
                tool_call_id: only,
            }),
            _ => parent_turn.span_id,
        };
        let trace = parent_turn.trace_id;
        let root_session = parent_turn.root_session_id.clone();
        let task_id = parent_turn.task_id.clone();
        let platform = parent_turn.platform.clone();
        let role = if sub.child_role.is_empty() {
            Str::from_static("subagent")
        } else {
            sub.child_role.as_str().into()
        };
        let mut common = Attrs::with_capacity(6);
        common
            .str("session.id", &root_session)
            .str("gen_ai.conversation.id", &root_session)
            .str("hermes.turn_id", &ids.parent_turn_id)
            .str("hermes.task_id", &task_id)
            .str("gen_ai.agent.name", &role)
            .str("hermes.platform", &platform)
            .str("hermes.session_id", &ids.parent_session_id);
        let span = span_id(SpanKey::Subagent {
            child_session_id: &ids.child_session_id,
        });
        self.remove_link(&child_key);
        let bytes = 2 * RECORD_BYTES
            + 3 * ids.child_session_id.len()
            + ids.parent_turn_id.len()
            + ids.parent_session_id.len()
            + ids.child_subagent_id.len()
            + sub.child_goal.len()
            + role.len();
        self.ledger.add(instance, 0, 1, bytes);
        self.links.insert(
            child_key.clone(),
            SubagentLink {
                instance: instance.into(),
                bytes,
                trace_id: trace,
                span_id: span,
                root_session_id: root_session,
                role,
                last_seen: t,
            },
        );
        self.subagents.insert(
            child_key,
            OpenSubagent {
                parent,
                resource: resource.clone(),
                common,
                start: t,
                child_session_id: ids.child_session_id.clone(),
                child_subagent_id: ids.child_subagent_id.clone(),
                goal: sub.child_goal.clone(),
                child_seen: 0,
                min_lsn: self.lsn,
            },
        );
    }

    fn subagent_stop(
        &mut self,
        instance: &str,
        ids: &v1::Ids,
        sub: &v1::Subagent,
        resource: &Arc<Resource>,
        t: u64,
        out: &mut Vec<FinishedSpan>,
    ) {
        let child_key = key(instance, &ids.child_session_id);
        if !self.subagents.contains_key(&child_key) {
            // Missing start: build the span from the stop event and its duration.
            let start =
                t.saturating_sub(sub.duration_ms.unwrap_or(0).saturating_mul(NANOS_PER_MILLI));
            let mut start_ids = ids.clone();
            start_ids.child_subagent_id.clear();
            self.subagent_start(instance, &start_ids, sub, resource, start, out);
        }
        self.subagent_stop_at(&child_key, sub, t, false, out);
    }
    fn subagent_stop_at(
        &mut self,
        child: &str,
        sub: &v1::Subagent,
        t: u64,
        incomplete: bool,
        out: &mut Vec<FinishedSpan>,
    ) {
        let Some(open) = self.subagents.remove(child) else {
            return;
        };
        let Some(link) = self.links.get(child).cloned() else {
            return;
        };
        let mut a = open.common.clone();
        a.fixed("gen_ai.operation.name", "invoke_agent")
            .str("gen_ai.agent.id", &open.child_subagent_id)
            .str("hermes.child_session_id", &open.child_session_id)
            .str("hermes.subagent.status", &sub.child_status)
            .str(
                "hermes.subagent.goal",
                if open.goal.is_empty() {
                    &sub.child_goal
                } else {
                    &open.goal
                },
            )
            .str("hermes.subagent.summary", &sub.child_summary)
            .opt_uint("hermes.subagent.duration_ms", sub.duration_ms);
        if incomplete {
            a.bool("hermes.incomplete", true);
        }
        let failed = matches!(sub.child_status.as_str(), "error" | "failed");
        out.push(FinishedSpan {
            resource: open.resource,
            span: Span {
                trace_id: link.trace_id.to_vec(),
                span_id: link.span_id.to_vec(),
                parent_span_id: open.parent.to_vec(),
                name: format!("invoke_agent {}", link.role).into(),
                kind: span::SpanKind::Internal as i32,
                start_time_unix_nano: open.start,
                end_time_unix_nano: t.max(open.start),
                attributes: a.0,
                status: failed.then(|| error_status(&sub.child_status)),
                ..Default::default()
            },
        });
    }

    fn emit_turn(
        &mut self,
        mut turn: Turn,
        end: u64,
        incomplete: bool,
        out: &mut Vec<FinishedSpan>,
    ) {
        let mut end = end.max(turn.start);
        // Close children that never got their end event.
        let mut attempts: Vec<(String, u32)> = turn.attempts.keys().cloned().collect();
        attempts.sort();
        let nothing = HashMap::new();
        for (api_request_id, attempt) in attempts {
            let api = v1::ApiCall {
                attempt,
                ..Default::default()
            };
            let mut span = close_attempt(
                &mut turn,
                &mut self.values,
                &api_request_id,
                &api,
                false,
                end,
                &nothing,
            );
            mark_incomplete(&mut span.span);
            out.push(span);
        }
        // Requests still waiting are unanswered; closed before their tools
        // so that they nest under them.
        approval::close_all(&mut turn, end, incomplete, out);
        let mut tools: Vec<_> = turn.tools.drain().collect();
        tools.sort_by(|a, b| a.0.cmp(&b.0));
        for (tool_call_id, open) in tools {
            let mut span = close_tool(
                &mut turn,
                &mut self.values,
                &tool_call_id,
                Some(open),
                &v1::ToolCall::default(),
                end,
            );
            mark_incomplete(&mut span.span);
            out.push(span);
        }
        if turn.max_child_end > end {
            end = turn.max_child_end;
            turn.clock_adjusted = true;
        }
        let mut a = turn.common(14);
        a.fixed("gen_ai.operation.name", "invoke_agent")
            .shared("gen_ai.request.model", &turn.model)
            .opt_bool("hermes.turn.completed", turn.completed)
            .opt_bool("hermes.turn.interrupted", turn.interrupted)
            .str("hermes.turn.end_reason", &turn.end_reason)
            .uint("hermes.turn.api_attempts", turn.api_attempts)
            .uint("hermes.turn.tool_calls", turn.tool_calls)
            .uint("hermes.turn.usage.input_tokens", turn.input_tokens)
            .uint("hermes.turn.usage.output_tokens", turn.output_tokens);
        if let Some(text) = &turn.user_message {
            a.str("hermes.turn.user_message", text);
        }
        if let Some(text) = &turn.final_answer {
            a.str("hermes.turn.final_answer", text);
        }
        if incomplete || !turn.started {
            a.bool("hermes.incomplete", true);
        }
        if turn.clock_adjusted {
            a.bool("hermes.clock_adjusted", true);
        }
        let status = if turn.interrupted == Some(true) || turn.completed == Some(true) {
            None
        } else if let Some(error_type) = &turn.last_attempt_error {
            // Hermes gave up on the model: the turn failed with its error.
            a.str("error.type", error_type);
            Some(error_status(&format!(
                "the last API attempt failed: {error_type}"
            )))
        } else if turn.completed == Some(false) {
            Some(error_status("turn did not complete"))
        } else {
            None
        };
        if turn.parent.is_some() {
            self.note_child_end(&turn.instance, &turn.session_id, end);
        }
        turn.events
            .sort_by(|x, y| (x.time_unix_nano, &x.name).cmp(&(y.time_unix_nano, &y.name)));
        out.push(FinishedSpan {
            resource: turn.resource,
            span: Span {
                trace_id: turn.trace_id.to_vec(),
                span_id: turn.span_id.to_vec(),
                parent_span_id: turn.parent.map(|p| p.to_vec()).unwrap_or_default(),
                name: self.values.joined("invoke_agent ", &turn.agent_name),
                kind: span::SpanKind::Internal as i32,
                start_time_unix_nano: turn.start,
                end_time_unix_nano: end,
                attributes: a.0,
                events: turn.events,
                status,
                ..Default::default()
            },
        });
    }
}

/// The most attributes [`Turn::common`] adds.
const COMMON_ATTRIBUTES: usize = 7;

impl Turn {
    /// Attributes every span of this turn carries, with room for `extra`
    /// more (the most the span adds: its list is never regrown).
    fn common(&self, extra: usize) -> Attrs {
        let mut a = Attrs::with_capacity(COMMON_ATTRIBUTES + extra);
        a.shared("session.id", &self.root_session_id)
            .shared("gen_ai.conversation.id", &self.root_session_id)
            .shared("hermes.turn_id", &self.turn_id)
            .shared("hermes.task_id", &self.task_id)
            .shared("hermes.platform", &self.platform)
            .shared("gen_ai.agent.name", &self.agent_name);
        if self.session_id != self.root_session_id {
            a.shared("hermes.session_id", &self.session_id);
        }
        a
    }
}

/// Completes `span` (ids, times, attributes set by the caller) as a child
/// of `turn`: fills the trace id and resource, and clamps it into the turn's
/// start (a synthesized turn grows to contain it instead).
fn child_span(turn: &mut Turn, mut span: Span) -> FinishedSpan {
    span.end_time_unix_nano = span.end_time_unix_nano.max(span.start_time_unix_nano);
    if span.start_time_unix_nano < turn.start && !turn.started {
        turn.start = span.start_time_unix_nano;
    } else if span.start_time_unix_nano < turn.start {
        span.start_time_unix_nano = turn.start;
        span.end_time_unix_nano = span.end_time_unix_nano.max(turn.start);
        span.attributes.push(attrs::kv(
            "hermes.clock_adjusted",
            any_value::Value::BoolValue(true),
        ));
    }
    turn.max_child_end = turn.max_child_end.max(span.end_time_unix_nano);
    span.trace_id = turn.trace_id.to_vec();
    span.parent_span_id = if span.parent_span_id.is_empty() {
        turn.span_id.to_vec()
    } else {
        span.parent_span_id
    };
    FinishedSpan {
        resource: turn.resource.clone(),
        span,
    }
}

fn close_attempt(
    turn: &mut Turn,
    values: &mut Interner,
    api_request_id: &str,
    api: &v1::ApiCall,
    failed: bool,
    t: u64,
    captured: &HashMap<String, String>,
) -> FinishedSpan {
    let attempt = api.attempt.max(1);
    let open = turn.attempts.remove(&(api_request_id.to_owned(), attempt));
    if let Some(o) = &open {
        turn.held = turn.held.saturating_sub(o.bytes() + api_request_id.len());
    }
    let end = if api.ended_at_unix_nano > 0 {
        api.ended_at_unix_nano
    } else {
        t
    };
    let start = match &open {
        Some(o) => o.start,
        None if attempt <= 1 && api.started_at_unix_nano > 0 => api.started_at_unix_nano,
        None => turn
            .last_attempt_end
            .get(api_request_id)
            .copied()
            .unwrap_or(if api.started_at_unix_nano > 0 {
                api.started_at_unix_nano
            } else {
                end
            }),
    };
    if turn
        .last_attempt_end
        .insert(api_request_id.to_owned(), end)
        .is_none()
    {
        turn.held += RECORD_BYTES / 2 + api_request_id.len();
    }
    turn.api_attempts += 1;
    // The post (or error) event's value, else the pre event's: borrowed,
    // the attributes copy them once.
    fn pick<'a>(post: &'a str, pre: Option<&'a str>) -> &'a str {
        if post.is_empty() {
            pre.unwrap_or_default()
        } else {
            post
        }
    }
    let model = pick(&api.model, open.as_ref().map(|o| o.model.as_str()));
    let provider = pick(&api.provider, open.as_ref().map(|o| o.provider.as_str()));
    let base_url = pick(&api.base_url, open.as_ref().map(|o| o.base_url.as_str()));
    let max_tokens = api.max_tokens.or(open.as_ref().and_then(|o| o.max_tokens));
    let api_call_count = if api.api_call_count > 0 {
        api.api_call_count
    } else {
        open.as_ref().map_or(0, |o| o.api_call_count)
    };
    if turn.model.is_empty() {
        turn.model = model.into();
    }
    let mut a = turn.common(21);
    let turn_model = turn.model.clone();
    a.fixed("gen_ai.operation.name", "chat")
        .common_str("gen_ai.provider.name", provider, values)
        .shared_or_str("gen_ai.request.model", &turn_model, model)
        .opt_uint("gen_ai.request.max_tokens", max_tokens)
        .str("hermes.api_request_id", api_request_id)
        .uint("hermes.api_call_count", api_call_count)
        .uint("hermes.attempt", u64::from(attempt));
    if let Some((host, port)) = server_address(base_url) {
        a.common_str("server.address", host, values);
        if let Some(port) = port {
            a.int("server.port", i64::from(port));
        }
    }
    // Content: the request of the pre event, else of the error event.
    let input = match open.as_ref().map(|o| &o.input) {
        Some((None, None)) | None => captured
            .get(content::REQUEST)
            .map_or((None, None), |r| content::chat_input(r)),
        Some(input) => input.clone(),
    };
    if let Some(messages) = &input.0 {
        a.str("gen_ai.input.messages", messages);
    }
    if let Some(system) = &input.1 {
        a.str("gen_ai.system_instructions", system);
    }
    if let Some(output) = captured
        .get(content::RESPONSE)
        .and_then(|r| content::chat_output(r))
    {
        a.str("gen_ai.output.messages", &output);
    }
    let mut status = None;
    let mut events = Vec::new();
    if failed {
        let error_type = if api.reason.is_empty() {
            api.error_type.as_str()
        } else {
            api.reason.as_str()
        };
        a.str(
            "error.type",
            if error_type.is_empty() {
                "_OTHER"
            } else {
                error_type
            },
        );
        if let Some(code) = api.status_code {
            a.int("http.response.status_code", i64::from(code));
        }
        a.opt_bool("hermes.retryable", api.retryable)
            .uint("hermes.retry_count", u64::from(api.retry_count));
        let mut ev = Attrs::default();
        ev.str("exception.type", &api.error_type)
            .str("exception.message", &api.error_message);
        events.push(span::Event {
            time_unix_nano: end,
            name: Str::from_static("exception"),
            attributes: ev.0,
            dropped_attributes_count: 0,
        });
        status = Some(error_status(&api.error_message));
        turn.last_attempt_error = Some(if error_type.is_empty() {
            "_OTHER".to_owned()
        } else {
            error_type.to_owned()
        });
    } else {
        if api.ended_at_unix_nano > 0 || api.usage.is_some() {
            // A real response (not an attempt closed for lack of one).
            turn.last_attempt_error = None;
        }
        a.common_str("gen_ai.response.model", &api.response_model, values);
        if !api.finish_reason.is_empty() {
            a.common_str_array(
                "gen_ai.response.finish_reasons",
                &[api.finish_reason.as_str()],
                values,
            );
        }
        if let Some(u) = &api.usage {
            a.uint("gen_ai.usage.input_tokens", u.prompt_tokens)
                .uint("gen_ai.usage.output_tokens", u.output_tokens)
                .uint("gen_ai.usage.cache_read.input_tokens", u.cache_read_tokens)
                .uint(
                    "gen_ai.usage.cache_creation.input_tokens",
                    u.cache_write_tokens,
                )
                .uint("gen_ai.usage.reasoning.output_tokens", u.reasoning_tokens);
            turn.input_tokens = turn.input_tokens.saturating_add(u.prompt_tokens);
            turn.output_tokens = turn.output_tokens.saturating_add(u.output_tokens);
        }
    }
    let span_id = span_id(SpanKey::Chat {
        api_request_id,
        attempt,
    });
    child_span(
        turn,
        Span {
            span_id: span_id.to_vec(),
            name: values.joined("chat ", model),
            kind: span::SpanKind::Client as i32,
            start_time_unix_nano: start,
            end_time_unix_nano: end,
            attributes: a.0,
            events,
            status,
            ..Default::default()
        },
    )
}

fn close_tool(
    turn: &mut Turn,
    values: &mut Interner,
    tool_call_id: &str,
    open: Option<OpenTool>,
    tool: &v1::ToolCall,
    t: u64,
) -> FinishedSpan {
    let name = match &open {
        Some(o) if tool.tool_name.is_empty() => o.name.as_str(),
        _ => tool.tool_name.as_str(),
    };
    let start = match &open {
        Some(o) => o.start,
        None => t.saturating_sub(
            tool.duration_ms
                .unwrap_or(0)
                .saturating_mul(NANOS_PER_MILLI),
        ),
    };
    turn.tool_calls += 1;
    let mut a = turn.common(10);
    a.fixed("gen_ai.operation.name", "execute_tool")
        .common_str("gen_ai.tool.name", name, values)
        .str("gen_ai.tool.call.id", tool_call_id)
        .fixed("gen_ai.tool.type", "function")
        .common_str("hermes.tool.status", &tool.status, values)
        .opt_uint("hermes.tool.duration_ms", tool.duration_ms);
    if let Some(arguments) = open.as_ref().and_then(|o| o.arguments.as_deref()) {
        a.str("gen_ai.tool.call.arguments", arguments);
    }
    let status = if tool.status == "error" {
        a.str(
            "error.type",
            if tool.error_type.is_empty() {
                "_OTHER"
            } else {
                &tool.error_type
            },
        );
        Some(error_status(&tool.error_message))
    } else {
        None
    };
    let span_id = span_id(SpanKey::Tool {
        turn_id: &turn.turn_id,
        tool_call_id,
    });
    child_span(
        turn,
        Span {
            span_id: span_id.to_vec(),
            name: values.joined("execute_tool ", name),
            kind: span::SpanKind::Internal as i32,
            start_time_unix_nano: start,
            end_time_unix_nano: t,
            attributes: a.0,
            status,
            ..Default::default()
        },
    )
}

fn mark_incomplete(span: &mut Span) {
    span.attributes.push(attrs::kv(
        "hermes.incomplete",
        any_value::Value::BoolValue(true),
    ));
}

fn error_status(message: &str) -> Status {
    Status {
        message: message.to_owned(),
        code: status::StatusCode::Error as i32,
    }
}

fn scalar_kv(key: &str, v: v1::scalar::Value) -> KeyValue {
    use v1::scalar::Value as S;
    let value = match v {
        S::StringValue(s) => any_value::Value::StringValue(s.into()),
        S::BoolValue(b) => any_value::Value::BoolValue(b),
        S::IntValue(i) => any_value::Value::IntValue(i),
        S::DoubleValue(d) => any_value::Value::DoubleValue(d),
    };
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(value) }),
    }
}

/// Host and port of an `http(s)://host[:port]/...` base URL.
///
/// Scans bytes rather than searching with `str` patterns: it runs on every
/// chat span, and `split_once("://")` (a substring searcher's set-up) and
/// two `rsplit_once` (`memrchr`) cost ≈ 1 000 instructions per span for a
/// URL of 30 bytes (`docs/BENCHMARKS.md`).
fn server_address(base_url: &str) -> Option<(&str, Option<u16>)> {
    let colon = base_url.as_bytes().windows(3).position(|w| w == b"://")?;
    let (scheme, rest) = (&base_url[..colon], &base_url[colon + 3..]);
    let end = rest
        .bytes()
        .position(|b| matches!(b, b'/' | b'?' | b'#'))
        .unwrap_or(rest.len());
    let authority = &rest[..end];
    let authority = match authority.bytes().rposition(|b| b == b'@') {
        Some(at) => &authority[at + 1..],
        None => authority,
    };
    let default_port = match scheme {
        "https" => Some(443),
        "http" => Some(80),
        _ => None,
    };
    if let Some(v6) = authority.strip_prefix('[') {
        let (host, rest) = v6.split_once(']')?;
        let port = rest
            .strip_prefix(':')
            .and_then(|p| p.parse().ok())
            .or(default_port);
        return Some((host, port));
    }
    match authority.bytes().rposition(|b| b == b':') {
        Some(at) => Some((
            &authority[..at],
            authority[at + 1..].parse().ok().or(default_port),
        )),
        None if authority.is_empty() => None,
        None => Some((authority, default_port)),
    }
}

/// Groups finished spans into OTLP `ResourceSpans`, one per resource, in
/// first-seen order, under the collector's instrumentation scope.
pub fn to_resource_spans(spans: Vec<FinishedSpan>) -> Vec<ResourceSpans> {
    let mut groups: Vec<(Arc<Resource>, Vec<Span>)> = Vec::new();
    for FinishedSpan { resource, span } in spans {
        match groups
            .iter_mut()
            .find(|(r, _)| Arc::ptr_eq(r, &resource) || **r == *resource)
        {
            Some((_, list)) => list.push(span),
            None => groups.push((resource, vec![span])),
        }
    }
    groups
        .into_iter()
        .map(|(resource, spans)| ResourceSpans {
            resource: Some(Arc::unwrap_or_clone(resource)),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: Str::from_static(SCOPE_NAME),
                    version: Str::from_static(env!("CARGO_PKG_VERSION")),
                    ..Default::default()
                }),
                spans,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_address_parses_common_urls() {
        assert_eq!(
            server_address("http://127.0.0.1:45501/v1"),
            Some(("127.0.0.1", Some(45501)))
        );
        assert_eq!(
            server_address("https://api.openai.com/v1"),
            Some(("api.openai.com", Some(443)))
        );
        assert_eq!(
            server_address("http://[::1]:8080"),
            Some(("::1", Some(8080)))
        );
        assert_eq!(server_address("nonsense"), None);
        assert_eq!(
            server_address("https://user:pw@proxy.local:8443?x=1"),
            Some(("proxy.local", Some(8443)))
        );
        assert_eq!(server_address("http://host#frag"), Some(("host", Some(80))));
        assert_eq!(
            server_address("grpc://h:bad/x"),
            Some(("h", None)),
            "an unknown scheme has no default port"
        );
        assert_eq!(
            server_address("a:b://c:9"),
            Some(("c", Some(9))),
            "the first `://` ends the scheme"
        );
        assert_eq!(server_address("https:///v1"), None);
    }
}
