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
//!
//! | module | owns |
//! |---|---|
//! | this file | [`Config`], [`Stats`], the open-state records, [`Correlator`] and its accessors |
//! | [`ingest`](Correlator::ingest) (`ingest.rs`) | each hook event to the state it opens, updates or closes |
//! | `turns.rs`, `sessions.rs`, `subagents.rs`, `approval.rs`, `exit.rs` | the state of turns, sessions, subagents, approvals, and work cut off by an agent's exit |
//! | `fleet.rs` | open state's queue positions per instance, forgetting an instance's state (a fleet's handoff) |
//! | `timers.rs` | TTLs, end graces, closing by queue position and at shutdown |
//! | `emit.rs` | closed state to spans; [`to_resource_spans`] |
//! | [`correlation`], [`sequencer`], [`ids`], `fair.rs`, `attrs.rs`, `content.rs` | the sequencer in front, deterministic ids, per-agent budgets, attribute building, content capture |

mod approval;
mod attempts;
mod attrs;
mod closed;
mod content;
pub mod correlation;
mod emit;
mod exit;
mod fair;
mod fleet;
pub use fleet::{Closure, Departure};
pub mod ids;
mod ingest;
mod ledger;
mod oldest;
pub mod sequencer;
mod sessions;
mod subagents;
mod timers;
mod turns;

pub use correlation::Correlation;
pub use emit::to_resource_spans;
use emit::{child_span, close_attempt, close_tool, error_status, scalar_kv};

use std::collections::HashMap;
use std::sync::Arc;

use hermes_proto::hooks;
use hermes_proto::v1;
use hermes_proto::view::{self, Body, Source};
use hermes_span::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use hermes_span::resource::v1::Resource;
use hermes_span::trace::v1::{ResourceSpans, ScopeSpans, Span, Status, span, status};
use hermes_span::{Id, SharedAttributes, Str};

pub use attrs::Attrs;
use attrs::Interner;
use closed::Closed;
pub use exit::PROCESS_EXIT_REASON;
use fair::{Kind, RECORD_BYTES, TURN_BYTES, key};
use ids::{SpanId, SpanKey, TraceId, scoped_trace_id, span_id, trace_id};
use ledger::Ledger;
use turns::At;

/// The correlator's and the sequencer's maps, keyed by ids from the agents:
/// foldhash's quality hasher, randomly seeded per map, is faster than std's
/// SipHash on the ids' 40-80 bytes (criterion bench `correlator_turn`); the
/// maps are bounded by the limits. hashbrown's map (the one std wraps) for
/// its raw entries: the open turns are looked up with a hash computed once
/// per event ([`Correlator::turn_and_values`]).
pub(crate) type Map<K, V> = hashbrown::HashMap<K, V, foldhash::quality::RandomState>;

/// The keys of `map`'s entries that `pick` picks, sorted: state closed in
/// key order gives the same spans in the same order on every run, whatever
/// the maps' random seeds.
pub(crate) fn sorted_keys<K: Ord + Clone, V>(
    map: &Map<K, V>,
    mut pick: impl FnMut(&K, &V) -> bool,
) -> Vec<K> {
    let mut keys: Vec<K> = map
        .iter()
        .filter(|(k, v)| pick(k, v))
        .map(|(k, _)| k.clone())
        .collect();
    keys.sort();
    keys
}

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
    /// Events that did not decode (a batch the receiver accepted whose
    /// events the stage could not read: a bug of the receiver's check).
    pub undecodable_events: u64,
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
    /// Turns forgotten without export because their shim instance moved
    /// to another collector of its fleet (a handoff, or a replicated
    /// collector's drain): the other collector exports them.
    pub turns_handed_off: u64,
    /// Open turns replayed after a restart whose shim instance did not come
    /// back to this collector of a replicated fleet within the state TTL:
    /// forgotten without export (the agent replayed them elsewhere).
    pub turns_orphaned: u64,
    /// Open turns forgotten when their fleet shim opened a new stream: it
    /// sends their events again, and they are rebuilt from that resend.
    pub turns_resent: u64,
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
    // Shared through the correlator's table of short texts: the post event
    // usually names them again, and they repeat across attempts.
    model: Str,
    provider: Str,
    base_url: Str,
    api_call_count: u64,
    max_tokens: Option<u64>,
    /// `gen_ai.input.messages` and `gen_ai.system_instructions` (content).
    input: (Option<String>, Option<String>),
}

struct OpenTool {
    start: u64,
    /// Shared through the correlator's table of short texts.
    name: Str,
    /// `gen_ai.tool.call.arguments` (content).
    arguments: Option<String>,
}

// Approximate bytes each open record holds (`ledger::Usage::bytes`).
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
    /// The attributes above as its spans' leading block, made by
    /// [`Turn::common`] and made again if one of them changes.
    shared: SharedAttributes,
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
    /// Open attempts and the latest end per `api_request_id` (the end is
    /// the start of a next attempt whose `pre_api_request` is missing).
    // Keyed by shared ids: the span the record closes into holds its id
    // (`hermes.api_request_id`, `gen_ai.tool.call.id`) without a copy.
    requests: Map<Str, attempts::ApiRequest>,
    tools: Map<Str, OpenTool>,
    approvals: Map<approval::ApprovalKey, approval::OpenApproval>,
    /// Lowest persistent-queue position of the events that touched it.
    min_lsn: u64,
    /// Highest position of a batch seen when an event touched it.
    max_lsn: u64,
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
    model: Str,
    platform: Str,
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
    /// The resource of the instance of the last event, found without
    /// hashing its id again while one agent's events follow each other
    /// (a batch); emptied before `resources` drops unused entries.
    last_resource: Option<(String, Arc<Resource>)>,
    /// Open turns, by [`fair::key`] (instance, turn id); likewise the
    /// links, subagents (instance, child session id) and pending starts
    /// (instance, session id).
    turns: Map<String, Turn>,
    /// The open turns' ids by instance and session.
    session_turns: sessions::SessionTurns,
    /// What each instance holds.
    ledger: Ledger,
    /// Turns closed recently, and the owners of plain trace ids.
    closed: Closed,
    links: Map<String, SubagentLink>,
    subagents: Map<String, OpenSubagent>,
    pending_starts: Map<String, PendingSessionStart>,
    /// Texts of few distinct values that the spans of every turn repeat.
    values: Interner,
    /// Where lookups build their key.
    keys: fair::KeyBuf,
    stats: Stats,
    /// Persistent-queue position of the events being ingested.
    lsn: u64,
    /// The highest position of a batch seen: no event ingested now came
    /// from a later one.
    max_lsn: u64,
    /// Closed units' positions, for a fleet replica's settlement
    /// ([`Correlator::record_closures`]); None: not recorded.
    closures: Option<Vec<(Str, Closure)>>,
    /// Fleet instances of a replicated collector, which may move to another
    /// replica at any time ([`Correlator::set_movable`]): their ended turns
    /// are not closed at the end grace.
    movable: Arc<std::collections::HashSet<String>>,
    /// Wall clock of the last [`Correlator::expire`].
    clock: u64,
    /// Sessions whose host said they ended (`on_session_finalize`), until
    /// [`Correlator::take_session_ends`]; at most [`MAX_SESSION_ENDS`].
    session_ends: std::collections::VecDeque<SessionEnded>,
}

/// The most session ends kept for a driver that does not take them (the
/// oldest goes first): a consumer that misses one falls back on its own
/// idle time.
pub const MAX_SESSION_ENDS: usize = 4096;

/// A session its host ended (`on_session_finalize`): what the trajectory
/// sink writes a session's file on. The session's spans were emitted
/// before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionEnded {
    /// The shim instance (`service.instance.id`).
    pub instance_id: String,
    /// The session; empty when the host did not say which (every session
    /// of the instance then).
    pub session_id: String,
}

impl Correlator {
    pub fn new(config: Config) -> Self {
        Self {
            config,
            resources: Map::default(),
            last_resource: None,
            turns: Map::default(),
            session_turns: sessions::SessionTurns::default(),
            ledger: Ledger::default(),
            closed: Closed::default(),
            links: Map::default(),
            subagents: Map::default(),
            pending_starts: Map::default(),
            values: Interner::default(),
            keys: fair::KeyBuf::default(),
            stats: Stats::default(),
            lsn: 0,
            max_lsn: 0,
            closures: None,
            movable: Arc::default(),
            clock: 0,
            session_ends: std::collections::VecDeque::new(),
        }
    }

    /// The sessions ended since the last call, in event order.
    pub fn take_session_ends(&mut self) -> Vec<SessionEnded> {
        self.session_ends.drain(..).collect()
    }

    fn session_ended(&mut self, instance_id: &str, session_id: &str) {
        if self.session_ends.len() >= MAX_SESSION_ENDS {
            self.session_ends.pop_front();
        }
        self.session_ends.push_back(SessionEnded {
            instance_id: instance_id.to_owned(),
            session_id: session_id.to_owned(),
        });
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
            sessions: self.ledger.total.sessions as u64,
            held_bytes: self.ledger.total.bytes as u64,
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

    /// A batch stored at `lsn` arrived: the events ingested from now on
    /// came from it or from earlier ones.
    pub fn saw_lsn(&mut self, lsn: u64) {
        self.max_lsn = self.max_lsn.max(lsn);
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
}
