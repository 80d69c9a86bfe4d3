//! The process-wide core: configuration, queue, sender thread, exit gate.
//!
//! Owns: [`CORE`], the one live [`Core`] of the process, and the Python
//! functions `configure`, `flush`, `stats`, `after_fork_in_child` (the exit
//! path, `shutdown` and the process-exit callback, is [`super::exit`]).
//!
//! Invariants:
//! - The hook path reaches the core through a lock-free `ArcSwapOption` load;
//!   it shares no lock with the sender.
//! - One sender thread per core, fed by the core's own queue, started by
//!   `configure` (when the plugin registers), so no hook call starts a
//!   thread; only a forked child's core starts its sender with its first
//!   event. A core replaced by `configure` with other settings closes its
//!   queue, and its sender delivers what it holds and ends.
//! - After `os.fork()` the child gets a new core (fresh instance id, seq from
//!   1, empty queue, no sender yet); the parent's core is leaked, not dropped,
//!   in the child, whose copy of it may be mid-operation.
//! - The sender holds the GIL for at most [`CONVERT_CHUNK`] conversions at a
//!   time, and never while waiting for the network.
//! - The sender attaches to the interpreter only between `GilGate::enter`
//!   and `leave`. `shutdown` (at interpreter exit) seals the gate and waits,
//!   with the GIL released, until the sender is outside, so the sender never
//!   attaches to a finalizing interpreter (CPython 3.11/3.12 would end the
//!   thread with `pthread_exit`). From the start of `shutdown` on, hooks
//!   convert their own event on their thread (GIL held) and queue it ready
//!   ([`HookItem::event`]), so what daemon threads capture while the
//!   interpreter exits needs no interpreter on the sender's side; the exit
//!   callback of [`super::exit`] delivers or spools it.
//! - `flush` and `shutdown` wait with the GIL released and never longer than
//!   their timeout.
//! - With a spool (`HERMES_COLLECTOR_SPOOL_DIR`): spool files of earlier
//!   processes are replayed even if this one captures nothing; `shutdown`
//!   asks the sender to spool what the exit flush could not deliver and
//!   waits a bounded time for it (with no stream open it spools at once
//!   instead of waiting for a collector that is down).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use hermes_proto::v1::{Event, ShimInfo};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use rand::TryRngCore;

use super::kwargs::PyKwargs;
use crate::clock;
use crate::config::{CaptureLevel, ShimConfig};
use crate::convert::{JsonKwargs, Stamp, to_event};
use crate::queue::{QueueRx, QueueTx, SeqSource, event_queue};
use crate::sender::fleet::FleetOptions;
use crate::sender::reach::Notice;
use crate::sender::spool::SpoolConfig;
use crate::sender::{self, Convert, SenderConfig, SenderShared};

/// The live core of this process, if `configure` ran (and not disabled).
pub(crate) static CORE: ArcSwapOption<Core> = ArcSwapOption::const_empty();

/// Items converted per GIL acquisition.
const CONVERT_CHUNK: usize = 64;

/// The logger the notices go to: Hermes' logging setup writes its INFO
/// records to `agent.log` and its WARNING records to `errors.log` too, and
/// (unless the user asked for verbose output) none to the terminal.
const LOGGER: &str = "hermes_collector";
/// `logging.WARNING`, `logging.INFO`.
const WARNING: u8 = 30;
const INFO: u8 = 20;

/// One captured hook call, as queued.
pub(crate) struct HookItem {
    pub seq: u64,
    pub time_unix_nano: u64,
    pub mono_nano: u64,
    pub hook: Arc<str>,
    pub thread: Arc<str>,
    /// The kwargs dict Hermes built for this call (fresh per call).
    pub kwargs: Option<Py<PyDict>>,
    /// Hook-time JSON snapshot of `args` (capture level `content` only).
    pub args_json: Option<String>,
    /// The event itself, converted on the hook's thread (the process is
    /// exiting: the sender may no longer attach to the interpreter).
    pub event: Option<Box<Event>>,
}

/// Guards the sender's access to the interpreter against finalization.
#[derive(Debug, Default)]
pub(super) struct GilGate {
    sealed: AtomicBool,
    inside: AtomicBool,
}

impl GilGate {
    /// The sender wants to attach; false once sealed.
    fn enter(&self) -> bool {
        self.inside.store(true, Ordering::SeqCst);
        if self.sealed.load(Ordering::SeqCst) {
            self.inside.store(false, Ordering::SeqCst);
            return false;
        }
        true
    }

    fn is_sealed(&self) -> bool {
        self.sealed.load(Ordering::SeqCst)
    }

    fn leave(&self) {
        self.inside.store(false, Ordering::SeqCst);
    }

    /// Like [`GilGate::enter`]; the sender is outside again when the guard
    /// is dropped, also when a panic unwinds it (the supervisor restarts the
    /// sender, and `shutdown` must not wait for a sender that died inside).
    fn enter_guarded(&self) -> Option<Inside<'_>> {
        self.enter().then_some(Inside(self))
    }

    /// Seals the gate and waits until the sender is outside. Call without the GIL.
    pub(super) fn seal_and_wait(&self, timeout: Duration) -> bool {
        self.sealed.store(true, Ordering::SeqCst);
        let deadline = Instant::now() + timeout;
        while self.inside.load(Ordering::SeqCst) {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }
}

/// The sender is inside a [`GilGate`] while this lives.
struct Inside<'a>(&'a GilGate);

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        self.0.leave();
    }
}

/// Converts queued hook calls with the GIL held once per batch.
struct PyConverter {
    capture: CaptureLevel,
    gate: Arc<GilGate>,
}

pub(super) fn convert_item(py: Python<'_>, item: HookItem, capture: CaptureLevel) -> Event {
    let stamp = Stamp {
        seq: item.seq,
        hook: &item.hook,
        time_unix_nano: item.time_unix_nano,
        mono_nano: item.mono_nano,
        thread: &item.thread,
    };
    let empty = serde_json::Map::new();
    let event = match item.kwargs.as_ref() {
        Some(dict) => {
            let kwargs = PyKwargs {
                dict: dict.bind(py).clone(),
                args_json: item.args_json.as_deref(),
            };
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                to_event(&stamp, &kwargs, capture)
            }))
            .unwrap_or_else(|_| to_event(&stamp, &JsonKwargs(&empty), capture))
        }
        None => to_event(&stamp, &JsonKwargs(&empty), capture),
    };
    // `item` (and its reference to the kwargs dict) is dropped here, with the GIL held.
    event
}

impl Convert for PyConverter {
    type Item = HookItem;

    fn convert(&mut self, items: Vec<HookItem>) -> Vec<Event> {
        // Events converted on their hook's thread need no interpreter.
        let mut events = Vec::with_capacity(items.len());
        let items: Vec<HookItem> = items
            .into_iter()
            .filter_map(|mut item| match item.event.take() {
                Some(event) => {
                    events.push(*event);
                    None
                }
                None => Some(item),
            })
            .collect();
        if items.is_empty() {
            return events;
        }
        let Some(_inside) = self.gate.enter_guarded() else {
            // Interpreter exiting: the references are released by PyO3 later
            // (or never, at process exit).
            return events;
        };
        let capture = self.capture;
        let mut items = items.into_iter().peekable();
        // The GIL is taken once per chunk, not per batch, so a large batch
        // never keeps agent threads waiting for more than a chunk's work.
        while items.peek().is_some() && !self.gate.is_sealed() {
            let chunk: Vec<HookItem> = items.by_ref().take(CONVERT_CHUNK).collect();
            let converted = Python::try_attach(move |py| {
                chunk
                    .into_iter()
                    .map(|item| convert_item(py, item, capture))
                    .collect::<Vec<_>>()
            });
            match converted {
                Some(converted) => events.extend(converted),
                None => break,
            }
        }
        events
    }

    /// Logs `notice` through the `hermes_collector` logger, on the sender
    /// thread (the hook path never waits for it); not once the interpreter
    /// is exiting past `shutdown`.
    fn notice(&mut self, notice: &Notice) {
        let Some(_inside) = self.gate.enter_guarded() else {
            return;
        };
        let level = if notice.is_warning() { WARNING } else { INFO };
        let text = notice.to_string();
        Python::try_attach(|py| {
            let logged = py
                .import("logging")
                .and_then(|logging| logging.call_method1("getLogger", (LOGGER,)))
                .and_then(|logger| logger.call_method1("log", (level, text)));
            // A logging failure is not the agent's: never raised, never printed.
            let _ = logged;
        });
    }
}

/// The core of one shim instance (one process).
pub(crate) struct Core {
    pub config: ShimConfig,
    host_name: String,
    instance_id: String,
    pid: u32,
    seq: SeqSource,
    pub(super) tx: QueueTx<HookItem>,
    rx: Mutex<Option<QueueRx<HookItem>>>,
    pub(super) started: AtomicBool,
    pub(super) shared: Arc<SenderShared>,
    pub(super) gate: Arc<GilGate>,
    /// Set by `shutdown`: hooks convert their own events from then on.
    exiting: AtomicBool,
    /// When `shutdown` started: the exit callback's budget counts from here.
    pub(super) exit_started: Mutex<Option<Instant>>,
}

/// Random 128-bit id, hex. Uses the OS generator, so a forked child never
/// repeats its parent's id.
fn new_instance_id() -> String {
    let mut rng = rand::rngs::OsRng;
    match (rng.try_next_u64(), rng.try_next_u64()) {
        (Ok(a), Ok(b)) => format!("{a:016x}{b:016x}"),
        _ => format!(
            "{:016x}{:016x}",
            clock::wall_unix_nano(),
            clock::mono_nano() ^ u64::from(std::process::id())
        ),
    }
}

impl Core {
    fn new(config: ShimConfig, host_name: String) -> Core {
        let (tx, rx) = event_queue(config.queue_events);
        Core {
            config,
            host_name,
            instance_id: new_instance_id(),
            pid: std::process::id(),
            seq: SeqSource::new(),
            tx,
            rx: Mutex::new(Some(rx)),
            started: AtomicBool::new(false),
            shared: Arc::new(SenderShared::default()),
            gate: Arc::new(GilGate::default()),
            exiting: AtomicBool::new(false),
            exit_started: Mutex::new(None),
        }
    }

    /// Whether the interpreter is exiting (`shutdown` ran): the hook path
    /// then converts on its own thread ([`Core::enqueue_converted`]).
    #[inline]
    pub(crate) fn is_exiting(&self) -> bool {
        self.exiting.load(Ordering::Acquire)
    }

    /// Switches the hook path to converting on its own thread. Called with
    /// the GIL held: no hook is between its check of [`Core::is_exiting`]
    /// and its push (the hook path runs no Python code there).
    pub(super) fn begin_exit(&self) {
        if let Ok(mut started) = self.exit_started.lock() {
            started.get_or_insert_with(Instant::now);
        }
        self.exiting.store(true, Ordering::Release);
    }

    /// The exit path of the hook: converts `item` on the calling thread
    /// (GIL held), then stamps, numbers and queues the ready event and wakes
    /// the sender. The stamps come after the conversion, which may run
    /// Python code (and let another thread in): queue order stays seq order.
    pub(crate) fn enqueue_converted(&self, py: Python<'_>, item: HookItem) {
        let hook = Arc::clone(&item.hook);
        let thread = Arc::clone(&item.thread);
        let event = convert_item(py, item, self.config.capture);
        self.enqueue_event(event, hook, thread);
    }

    /// Stamps, numbers and queues a ready event, waking the sender. Runs
    /// no Python code (the exit callback calls it after finalization).
    pub(super) fn enqueue_event(&self, mut event: Event, hook: Arc<str>, thread: Arc<str>) {
        let time_unix_nano = clock::wall_unix_nano();
        let mono_nano = clock::mono_nano();
        let seq = self.seq.next_seq();
        event.seq = seq;
        event.time_unix_nano = time_unix_nano;
        event.mono_nano = mono_nano;
        let item = HookItem {
            seq,
            time_unix_nano,
            mono_nano,
            hook,
            thread,
            kwargs: None,
            args_json: None,
            event: Some(Box::new(event)),
        };
        if let Err(dropped) = self.tx.push_and_wake(item) {
            drop(dropped);
        }
        self.ensure_started();
    }

    /// Stamps, numbers and queues one hook call; never blocks. Called with
    /// the GIL held; runs no Python code. Wakes the sender only when `urgent`
    /// (otherwise it finds the event on its next look, and the hook path
    /// makes no system call).
    pub(crate) fn enqueue(&self, mut item: HookItem, urgent: bool) {
        item.time_unix_nano = clock::wall_unix_nano();
        item.mono_nano = clock::mono_nano();
        item.seq = self.seq.next_seq();
        let pushed = if urgent {
            self.tx.push_and_wake(item)
        } else {
            self.tx.push(item)
        };
        if let Err(dropped) = pushed {
            drop(dropped);
        }
        self.ensure_started();
    }

    fn ensure_started(&self) {
        if self.started.load(Ordering::Acquire) || self.started.swap(true, Ordering::AcqRel) {
            return;
        }
        let rx = self.rx.lock().ok().and_then(|mut slot| slot.take());
        let Some(rx) = rx else {
            return;
        };
        let shim = ShimInfo {
            instance_id: self.instance_id.clone(),
            service_name: self.config.service_name.clone(),
            host_name: self.host_name.clone(),
            pid: self.pid,
            shim_version: crate::SHIM_VERSION.to_owned(),
            capture: self.config.capture.as_str().to_owned(),
        };
        let converter = PyConverter {
            capture: self.config.capture,
            gate: Arc::clone(&self.gate),
        };
        let mut config = SenderConfig::new(self.config.endpoint.clone(), shim);
        config.spool = self.spool();
        config.fleet = FleetOptions {
            hosts_file: self.config.hosts_file.clone(),
            resolve_every: Duration::from_secs(self.config.resolve_secs),
        };
        // On failure the queue closes with `rx`: later events count as dropped.
        let _ = sender::spawn(
            rx,
            converter,
            config,
            Arc::clone(&self.shared),
            Arc::clone(self.tx.counters()),
        );
    }

    fn spool(&self) -> Option<SpoolConfig> {
        self.config.spool_dir.as_ref().map(|dir| SpoolConfig {
            dir: dir.clone(),
            max_bytes: self.config.spool_max_bytes,
        })
    }

    pub(super) fn flush(&self, py: Python<'_>, timeout: Duration) -> bool {
        let target = self.tx.counters().enqueued();
        let shared = Arc::clone(&self.shared);
        py.detach(move || shared.wait_settled(target, timeout))
    }
}

/// Reads the configuration from `env` (the `HERMES_COLLECTOR_*` variables)
/// and installs the core unless disabled. Returns the settings the Python
/// layer needs: `disabled`, `capture`, `hooks`, `exit_flush_ms`, `endpoint`,
/// `instance_id` and `warnings` (texts to log).
#[pyfunction]
#[pyo3(signature = (env, host_name = String::new()))]
pub(crate) fn configure<'py>(
    py: Python<'py>,
    env: HashMap<String, String>,
    host_name: String,
) -> PyResult<Bound<'py, PyDict>> {
    let (config, warnings) = ShimConfig::from_lookup(|k| env.get(k).cloned());
    let out = PyDict::new(py);
    out.set_item("disabled", config.disabled)?;
    out.set_item("capture", config.capture.as_str())?;
    out.set_item("exit_flush_ms", config.exit_flush_ms)?;
    out.set_item("endpoint", &config.endpoint)?;
    out.set_item(
        "spool_dir",
        config
            .spool_dir
            .as_ref()
            .map(|d| d.to_string_lossy().into_owned()),
    )?;
    let texts: Vec<String> = warnings.iter().map(ToString::to_string).collect();
    out.set_item("warnings", PyList::new(py, texts)?)?;
    if config.disabled {
        out.set_item("hooks", PyList::empty(py))?;
        out.set_item("instance_id", py.None())?;
        return Ok(out);
    }
    out.set_item("hooks", PyList::new(py, config.capture.hooks())?)?;
    let current = CORE.load_full();
    let core = match current {
        Some(core) if core.config == config && core.host_name == host_name => core,
        _ => {
            let core = Arc::new(Core::new(config, host_name));
            // The replaced core (if any) is dropped here, GIL held: its queue
            // closes and its sender ends after delivering what it holds.
            CORE.store(Some(Arc::clone(&core)));
            core
        }
    };
    out.set_item("instance_id", &core.instance_id)?;
    super::exit::register_process_exit();
    // Everything a hook would otherwise set up on its first call happens
    // here, when the plugin registers: the sender thread starts (and with a
    // spool replays what earlier processes left), and the registering
    // thread, where Hermes fires most hooks, has its name cached.
    core.ensure_started();
    super::hook::cache_thread_name(py);
    Ok(out)
}

/// Waits (GIL released) up to `timeout_ms` until every event queued so far
/// is acknowledged by the collector (or accounted as lost). Returns whether
/// it was.
#[pyfunction]
pub(crate) fn flush(py: Python<'_>, timeout_ms: u64) -> bool {
    match CORE.load_full() {
        Some(core) => core.flush(py, Duration::from_millis(timeout_ms)),
        None => true,
    }
}

/// The shim's release (`version`, as `hermes_collector.__version__`) and
/// the counters of the live core: `enqueued`, `dropped`, `sent_batches`,
/// `acked_events`, `unacked_batches`, `connected`, `asleep`, plus `evicted_events`,
/// fleet mode's `evicted_unsettled_events` and `replica_moves`,
/// `discarded_events`, the spool's `spooled_events`, `spool_dropped_events`,
/// `replayed_events`, `replayed_files`, `replay_lost_events`, the sender
/// thread's supervision (`sender_deaths`, `sender_restarts`,
/// `sender_stopped`, `lost_events`), and `instance_id`, `capture`,
/// `last_error`.
#[pyfunction]
pub(crate) fn stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let out = PyDict::new(py);
    out.set_item("version", crate::SHIM_VERSION)?;
    let core = CORE.load_full();
    let (enqueued, dropped, sender) = match core.as_ref() {
        Some(core) => (
            core.tx.counters().enqueued(),
            core.tx.counters().dropped(),
            core.shared.stats(),
        ),
        None => (0, 0, sender::SenderStats::default()),
    };
    out.set_item("enqueued", enqueued)?;
    out.set_item("dropped", dropped)?;
    out.set_item("sent_batches", sender.sent_batches)?;
    out.set_item("acked_events", sender.acked_events)?;
    out.set_item("unacked_batches", sender.unacked_batches)?;
    out.set_item("connected", sender.connected)?;
    out.set_item("asleep", sender.asleep)?;
    out.set_item("evicted_events", sender.evicted_events)?;
    out.set_item("evicted_unsettled_events", sender.evicted_unsettled_events)?;
    out.set_item("replica_moves", sender.replica_moves)?;
    out.set_item("discarded_events", sender.discarded_events)?;
    out.set_item("spooled_events", sender.spooled_events)?;
    out.set_item("spool_dropped_events", sender.spool_dropped_events)?;
    out.set_item("replayed_events", sender.replayed_events)?;
    out.set_item("replayed_files", sender.replayed_files)?;
    out.set_item("replay_lost_events", sender.replay_lost_events)?;
    out.set_item("sender_deaths", sender.sender_deaths)?;
    out.set_item("sender_restarts", sender.sender_restarts)?;
    out.set_item("sender_stopped", sender.sender_stopped)?;
    out.set_item("lost_events", sender.lost_events)?;
    out.set_item("last_error", sender.last_error)?;
    match core.as_ref() {
        Some(core) => {
            out.set_item("instance_id", &core.instance_id)?;
            out.set_item("capture", core.config.capture.as_str())?;
        }
        None => {
            out.set_item("instance_id", py.None())?;
            out.set_item("capture", py.None())?;
        }
    }
    Ok(out)
}

/// `os.register_at_fork(after_in_child=...)`: a fresh core for the child.
#[pyfunction]
pub(crate) fn after_fork_in_child() {
    let Some(old) = CORE.load_full() else {
        return;
    };
    let core = Arc::new(Core::new(old.config.clone(), old.host_name.clone()));
    let previous = CORE.swap(Some(core));
    // The parent's core may have been mid-operation when the process forked
    // (its sender thread does not exist here): never run its destructors.
    std::mem::forget(previous);
    std::mem::forget(old);
}
