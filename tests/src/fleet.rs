//! Support of the fleet test (`tests/tests/fleet.rs`): collector replicas
//! of one replicated fleet, each on its own loopback address (127.0.0.2,
//! .3, …) under one port and one name listed in a test hosts file (the
//! shim's `HERMES_COLLECTOR_HOSTS_FILE`), each with its own persistent
//! queue, all exporting to one receiver ([`Fleet`]); and the checks on
//! what such a fleet exported ([`assert_whole_traces`]).
//!
//! Replicas log every fleet batch they take and every settled seq they
//! publish (`hermes_pipeline` at debug); with `HERMES_FLEET_LOG_DIR` set,
//! each replica's log is written there when it stops or the fleet is
//! dropped (`replica-<octet>-<n>.log`), to follow an agent's batches
//! across replicas after a failure.
//!
//! Everything listens on loopback addresses and every wait is bounded.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use tempfile::TempDir;

use crate::collector::Collector;
use crate::fault::span_key;
use crate::{AttrsExt, OtlpReceiver};

/// The name the replicas are listed under.
pub const NAME: &str = "collectors.fleet.test";

/// The replicas' log filter: every fleet batch and settled seq.
const LOG: [(&str, &str); 1] = [("RUST_LOG", "info,hermes_pipeline=debug")];

/// Ports tried for the fleet (one port on every replica's address).
const PORTS: std::ops::Range<u16> = 33_000..34_000;

/// One replica: its process and what restarts it.
struct Replica {
    collector: Option<Collector>,
    listen: String,
    yaml: String,
    work: TempDir,
}

/// Replicas of one fleet and its hosts file; every replica is killed on
/// drop.
pub struct Fleet {
    port: u16,
    dir: TempDir,
    replicas: BTreeMap<u8, Replica>,
    otlp_endpoint: String,
    /// Extra configuration lines of every replica (YAML sections).
    extra: String,
    /// The logs of the replicas killed or stopped so far.
    stopped_logs: Vec<(u8, String)>,
}

/// The address of replica `octet` (127.0.0.`octet`).
fn address(octet: u8) -> String {
    format!("127.0.0.{octet}")
}

/// Writes the hosts file `path` (the shim's `HERMES_COLLECTOR_HOSTS_FILE`)
/// to list exactly 127.0.0.`octets` under `name`, replacing it at once: a
/// shim resolving meanwhile reads the old list or the new one.
pub fn write_hosts(path: &Path, name: &str, octets: &[u8]) {
    let text: String = octets
        .iter()
        .map(|&o| format!("{} {name}\n", address(o)))
        .collect();
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap_or_else(|e| panic!("write hosts: {e}"));
    std::fs::rename(&tmp, path).unwrap_or_else(|e| panic!("rename hosts: {e}"));
}

/// Whether nothing accepts connections on `port` of any of `octets`.
fn port_free(port: u16, octets: &[u8]) -> bool {
    octets.iter().all(|&o| {
        let addr = std::net::SocketAddr::from(([127, 0, 0, o], port));
        std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(50)).is_err()
    })
}

impl Fleet {
    /// A fleet exporting to `otlp`, no replica started yet; its replicas
    /// run with `extra` (YAML sections) besides the receiver, admin,
    /// queue, exporter, batch and `fleet.replicated: true`. The port is
    /// one that is free on every address in `octets`.
    pub fn new(otlp: &OtlpReceiver, octets: &[u8], extra: &str) -> Fleet {
        let start = PORTS.start + (std::process::id() % 500) as u16;
        let port = (start..PORTS.end)
            .chain(PORTS.start..start)
            .find(|&p| port_free(p, octets))
            .unwrap_or_else(|| panic!("no port in {PORTS:?} free on 127.0.0.{octets:?}"));
        let fleet = Fleet {
            port,
            dir: tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}")),
            replicas: BTreeMap::new(),
            otlp_endpoint: otlp.endpoint(),
            extra: extra.to_owned(),
            stopped_logs: Vec::new(),
        };
        fleet.list(&[]);
        fleet
    }

    /// The fleet's endpoint for the shim: `dns:///NAME:PORT`.
    pub fn endpoint(&self) -> String {
        format!("dns:///{NAME}:{}", self.port)
    }

    /// The hosts file that lists the replicas.
    pub fn hosts_file(&self) -> PathBuf {
        self.dir.path().join("hosts")
    }

    /// Lists exactly `octets` under [`NAME`] (the file replaced at once).
    pub fn list(&self, octets: &[u8]) {
        write_hosts(&self.hosts_file(), NAME, octets);
    }

    /// Starts replica `octet` (ready when this returns); it is not listed
    /// by this.
    pub fn start(&mut self, octet: u8) {
        let work = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let listen = format!("{}:{}", address(octet), self.port);
        let yaml = format!(
            "receiver:\n  listen: {listen}\nadmin:\n  listen: 127.0.0.1:0\n\
             queue:\n  kind: disk\n  dir: {}\nexporters:\n  otlp:\n    endpoint: {}\n\
             batch:\n  timeout_ms: 50\nfleet:\n  replicated: true\n{}",
            work.path().join("queue").display(),
            self.otlp_endpoint,
            self.extra
        );
        let collector = Collector::start_with_config_env(work.path(), &listen, &yaml, &LOG);
        self.replicas.insert(
            octet,
            Replica {
                collector: Some(collector),
                listen,
                yaml,
                work,
            },
        );
    }

    /// Kills replica `octet` with SIGKILL; its queue stays for a restart.
    pub fn kill(&mut self, octet: u8) -> ExitStatus {
        let replica = self.replica(octet);
        let mut collector = replica
            .collector
            .take()
            .unwrap_or_else(|| panic!("replica {octet} is not running"));
        let status = collector.guard.kill();
        self.keep_log(octet, &collector);
        status
    }

    /// Starts replica `octet` again on its queue (after [`Fleet::kill`]).
    pub fn restart(&mut self, octet: u8) {
        let replica = self.replica(octet);
        let collector = Collector::start_with_config_env(
            replica.work.path(),
            &replica.listen,
            &replica.yaml,
            &LOG,
        );
        replica.collector = Some(collector);
    }

    /// Stops replica `octet` with SIGTERM (it drains: its shims move);
    /// its exit status, or None if it did not exit within `timeout`.
    pub fn terminate(&mut self, octet: u8, timeout: Duration) -> Option<ExitStatus> {
        let replica = self.replica(octet);
        let mut collector = replica
            .collector
            .take()
            .unwrap_or_else(|| panic!("replica {octet} is not running"));
        let status = collector.guard.sigterm(timeout).0;
        self.keep_log(octet, &collector);
        status
    }

    /// Replica `octet`'s collector, if running.
    pub fn collector(&self, octet: u8) -> Option<&Collector> {
        self.replicas.get(&octet).and_then(|r| r.collector.as_ref())
    }

    /// The sum of metric `name` over the running replicas.
    pub fn metric(&self, name: &str) -> f64 {
        self.replicas
            .values()
            .filter_map(|r| r.collector.as_ref())
            .map(|c| c.metric(name))
            .sum()
    }

    /// The logs of every replica, for a failure message.
    pub fn logs(&self) -> String {
        self.replicas
            .iter()
            .filter_map(|(o, r)| r.collector.as_ref().map(|c| (o, c)))
            .map(|(o, c)| format!("--- replica {o}:\n{}", c.guard.stderr_text()))
            .collect()
    }

    fn replica(&mut self, octet: u8) -> &mut Replica {
        self.replicas
            .get_mut(&octet)
            .unwrap_or_else(|| panic!("no replica {octet}"))
    }

    /// Keeps `collector`'s log (replica `octet`, stopping) for
    /// [`Fleet::trail`], and writes it to `HERMES_FLEET_LOG_DIR` if set.
    fn keep_log(&mut self, octet: u8, collector: &Collector) {
        let log = collector.guard.stderr_text();
        if let Some(dir) = std::env::var_os("HERMES_FLEET_LOG_DIR") {
            let n = self.stopped_logs.len() + 1;
            let path = Path::new(&dir).join(format!("replica-{octet}-{n}.log"));
            if let Err(e) = std::fs::write(&path, &log) {
                eprintln!("fleet: cannot keep {}: {e}", path.display());
            }
        }
        self.stopped_logs.push((octet, log));
    }

    /// The lines of every replica's log, stopped ones first, that name
    /// `instance` (an agent's batches, streams and handoffs across the
    /// fleet), for a failure message.
    pub fn trail(&self, instance: &str) -> String {
        let running = self
            .replicas
            .iter()
            .filter_map(|(o, r)| r.collector.as_ref().map(|c| (*o, c.guard.stderr_text())));
        let logs: Vec<(u8, String)> = self.stopped_logs.iter().cloned().chain(running).collect();
        logs.iter()
            .flat_map(|(octet, log)| {
                log.lines()
                    .filter(|line| line.contains(instance))
                    .map(move |line| format!("replica {octet}: {line}\n"))
            })
            .collect()
    }

    /// The fleet's directory (the hosts file's).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        let running: Vec<(u8, Collector)> = std::mem::take(&mut self.replicas)
            .into_iter()
            .filter_map(|(octet, r)| r.collector.map(|c| (octet, c)))
            .collect();
        for (octet, collector) in &running {
            self.keep_log(*octet, collector);
        }
    }
}

/// What a fleet exported, checked: every span key (`trace/span` hex) that
/// arrived more than once arrived as the same bytes; every trace has
/// exactly one root span. Returns the keys received and how many repeats
/// there were. A failure says what `trail` gives for the agent (its
/// instance id): [`Fleet::trail`].
pub fn assert_whole_traces(
    spans: &[(Resource, Span)],
    trail: impl Fn(&str) -> String,
) -> (BTreeSet<String>, usize) {
    let mut first: HashMap<String, (Vec<u8>, &Span)> = HashMap::new();
    let mut repeats = 0;
    let mut roots: BTreeMap<Vec<u8>, BTreeSet<Vec<u8>>> = BTreeMap::new();
    for (res, span) in spans {
        let key = span_key(span);
        let bytes = span.encode_to_vec();
        match first.get(&key) {
            Some((earlier, earlier_span)) => {
                repeats += 1;
                let agent = res.str_attr("service.instance.id").unwrap_or("?");
                assert!(
                    *earlier == bytes,
                    "span {key} ({}) of agent {agent} arrived twice with different content:\n{}\n\
                     the agent in the replicas' logs:\n{}",
                    span.name,
                    difference(earlier_span, span),
                    trail(agent)
                );
            }
            None => {
                first.insert(key, (bytes, span));
            }
        }
        let trace_roots = roots.entry(span.trace_id.clone()).or_default();
        if span.parent_span_id.is_empty() {
            trace_roots.insert(span.span_id.clone());
        }
    }
    for (trace, root_ids) in &roots {
        assert_eq!(
            root_ids.len(),
            1,
            "trace {} has {} root spans",
            crate::span_tree::hex(trace),
            root_ids.len()
        );
    }
    (first.into_keys().collect(), repeats)
}

/// What differs between two deliveries of one span, for a failure message.
fn difference(a: &Span, b: &Span) -> String {
    let mut out = Vec::new();
    if (a.start_time_unix_nano, a.end_time_unix_nano)
        != (b.start_time_unix_nano, b.end_time_unix_nano)
    {
        out.push(format!(
            "times {}..{} vs {}..{}",
            a.start_time_unix_nano,
            a.end_time_unix_nano,
            b.start_time_unix_nano,
            b.end_time_unix_nano
        ));
    }
    if a.status != b.status {
        out.push(format!("status {:?} vs {:?}", a.status, b.status));
    }
    for kv in &a.attributes {
        if !b.attributes.contains(kv) {
            let other = b.attributes.iter().find(|o| o.key == kv.key);
            out.push(format!("attribute {:?} vs {:?}", kv, other));
        }
    }
    for kv in &b.attributes {
        if !a.attributes.iter().any(|o| o.key == kv.key) {
            out.push(format!("attribute only in the second: {kv:?}"));
        }
    }
    if a.events != b.events || a.links != b.links {
        out.push(format!(
            "events {} vs {}, links {} vs {}",
            a.events.len(),
            b.events.len(),
            a.links.len(),
            b.links.len()
        ));
    }
    out.join("\n")
}
