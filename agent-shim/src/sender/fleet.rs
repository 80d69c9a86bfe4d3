//! Fleet mode (`dns:///NAME:PORT` endpoints): which replica of a
//! replicated collector this shim instance talks to.
//!
//! Owns: parsing the fleet endpoint, resolving its name to every address
//! (a hosts(5)-format file named by `HERMES_COLLECTOR_HOSTS_FILE` first,
//! then the system resolver), ranking the addresses by rendezvous hashing
//! of the instance id, and which addresses are skipped for a while (down,
//! or leaving the fleet).
//!
//! Invariants:
//! - Everything here runs on the sender's thread (resolution included),
//!   never on a hook call.
//! - The rank of an address for an instance depends only on the two: the
//!   score is XXH3-64 of `instance_id`, `"\0"`, `ip:port`, highest first.
//!   Adding an address moves only the instances whose new top it is;
//!   removing one moves only the instances whose top it was.
//! - A resolution that fails or finds nothing keeps the addresses known
//!   before (the fleet does not vanish with a resolver hiccup).

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::Instant;

/// Scheme prefix of a fleet endpoint.
pub const FLEET_PREFIX: &str = "dns:///";

/// Default interval between resolutions (`HERMES_COLLECTOR_RESOLVE_SECS`).
pub const DEFAULT_RESOLVE_EVERY: Duration = Duration::from_secs(30);

/// How long an address whose collector said `leave` is skipped: long
/// enough for it to drop out of the name's addresses.
pub const LEAVE_SKIP: Duration = Duration::from_secs(60);

/// The name and port of a `dns:///NAME:PORT` endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetName {
    /// The host name (also the TLS server name and the request authority).
    pub host: String,
    /// The ingest port of every replica.
    pub port: u16,
}

impl FleetName {
    /// Parses `dns:///NAME:PORT`; None if `url` is not a fleet endpoint,
    /// an error text if it is one but malformed.
    pub fn parse(url: &str) -> Option<Result<FleetName, &'static str>> {
        let rest = url.trim().strip_prefix(FLEET_PREFIX)?;
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        let Some((host, port)) = rest.rsplit_once(':') else {
            return Some(Err("dns:/// needs a port (dns:///NAME:PORT)"));
        };
        let Ok(port) = port.parse::<u16>() else {
            return Some(Err("dns:///NAME:PORT needs a port in 1..=65535"));
        };
        let valid = !host.is_empty()
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
        if !valid || port == 0 {
            return Some(Err("dns:///NAME:PORT needs a host name and a port"));
        }
        Some(Ok(FleetName {
            host: host.to_ascii_lowercase(),
            port,
        }))
    }
}

/// Fleet settings of a sender.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetOptions {
    /// A hosts(5)-format file consulted before the system resolver.
    pub hosts_file: Option<PathBuf>,
    /// Interval between resolutions.
    pub resolve_every: Duration,
}

impl Default for FleetOptions {
    fn default() -> Self {
        FleetOptions {
            hosts_file: None,
            resolve_every: DEFAULT_RESOLVE_EVERY,
        }
    }
}

/// The addresses a hosts(5)-format `text` gives `name` (case-insensitive,
/// a trailing dot ignored), in file order without repeats. Comments
/// (`#`), blank lines and lines whose first field is not an IP address are
/// skipped.
pub fn hosts_addresses(text: &str, name: &str) -> Vec<IpAddr> {
    let name = name.trim_end_matches('.');
    let mut found = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or_default();
        let mut fields = line.split_whitespace();
        let Some(Ok(ip)) = fields.next().map(str::parse::<IpAddr>) else {
            continue;
        };
        if fields.any(|n| n.trim_end_matches('.').eq_ignore_ascii_case(name))
            && !found.contains(&ip)
        {
            found.push(ip);
        }
    }
    found
}

/// Every address of `name`: from `hosts_file` if it lists the name, else
/// from the system resolver. Sorted, without repeats.
pub fn resolve(name: &FleetName, hosts_file: Option<&Path>) -> Result<Vec<SocketAddr>, String> {
    let mut addrs: Vec<SocketAddr> = Vec::new();
    if let Some(path) = hosts_file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("hosts file {}: {e}", path.display()))?;
        addrs = hosts_addresses(&text, &name.host)
            .into_iter()
            .map(|ip| SocketAddr::new(ip, name.port))
            .collect();
    }
    if addrs.is_empty() {
        addrs = (name.host.as_str(), name.port)
            .to_socket_addrs()
            .map_err(|e| format!("resolve {}: {e}", name.host))?
            .collect();
    }
    addrs.sort();
    addrs.dedup();
    if addrs.is_empty() {
        return Err(format!("resolve {}: no address", name.host));
    }
    Ok(addrs)
}

/// The rendezvous score of `addr` for `instance_id`.
pub fn score(instance_id: &str, addr: &SocketAddr) -> u64 {
    let key = format!("{instance_id}\0{addr}");
    xxhash_rust::xxh3::xxh3_64(key.as_bytes())
}

/// `addrs` ranked for `instance_id`: highest score first.
pub fn ranked(instance_id: &str, mut addrs: Vec<SocketAddr>) -> Vec<SocketAddr> {
    addrs.sort_by_cached_key(|a| std::cmp::Reverse((score(instance_id, a), *a)));
    addrs
}

/// The replicas one instance may talk to, ranked, and the ones skipped.
#[derive(Debug)]
pub struct Fleet {
    name: FleetName,
    options: FleetOptions,
    instance_id: String,
    ranked: Vec<SocketAddr>,
    skipped: Vec<(SocketAddr, Instant)>,
    resolve_at: Instant,
}

impl Fleet {
    /// No address known yet: the first [`Fleet::pick`] resolves.
    pub fn new(name: FleetName, options: FleetOptions, instance_id: &str, now: Instant) -> Fleet {
        Fleet {
            name,
            options,
            instance_id: instance_id.to_owned(),
            ranked: Vec::new(),
            skipped: Vec::new(),
            resolve_at: now,
        }
    }

    /// The endpoint's name.
    pub fn name(&self) -> &FleetName {
        &self.name
    }

    /// When the name is to be resolved next.
    pub fn resolve_at(&self) -> Instant {
        self.resolve_at
    }

    /// Resolves the name now (the next time after `resolve_every`). On
    /// failure the addresses known stay.
    pub fn resolve(&mut self, now: Instant) -> Result<(), String> {
        self.resolve_at = now + self.options.resolve_every;
        let addrs = resolve(&self.name, self.options.hosts_file.as_deref())?;
        self.ranked = ranked(&self.instance_id, addrs);
        Ok(())
    }

    /// Resolve at the next [`Fleet::pick`] (after a failed connect).
    pub fn resolve_soon(&mut self, now: Instant) {
        self.resolve_at = self.resolve_at.min(now);
    }

    /// The best address not skipped at `now` (resolving first if due), or
    /// None when none is known or all are skipped.
    pub fn pick(&mut self, now: Instant) -> Option<SocketAddr> {
        if now >= self.resolve_at {
            let _ = self.resolve(now);
        }
        self.best(now)
    }

    /// The best address not skipped at `now`, without resolving.
    pub fn best(&self, now: Instant) -> Option<SocketAddr> {
        self.ranked
            .iter()
            .copied()
            .find(|a| !self.skipped.iter().any(|(s, until)| s == a && *until > now))
    }

    /// Skips `addr` until `until`.
    pub fn skip(&mut self, addr: SocketAddr, until: Instant) {
        self.skipped.retain(|(a, _)| *a != addr);
        self.skipped.push((addr, until));
    }

    /// When the first skipped address may be tried again (None: no
    /// address is skipped).
    pub fn next_unskip(&self, now: Instant) -> Option<Instant> {
        self.skipped
            .iter()
            .map(|(_, until)| *until)
            .filter(|until| *until > now)
            .min()
    }

    /// The addresses known, ranked.
    pub fn addresses(&self) -> &[SocketAddr] {
        &self.ranked
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    #[test]
    fn fleet_endpoints_parse() {
        assert_eq!(FleetName::parse("http://h:1"), None);
        assert_eq!(
            FleetName::parse("dns:///Collector.ns.svc:4319"),
            Some(Ok(FleetName {
                host: "collector.ns.svc".into(),
                port: 4319
            }))
        );
        for bad in [
            "dns:///",
            "dns:///h",
            "dns:///h:x",
            "dns:///h:0",
            "dns:///:9",
            "dns:///a b:9",
        ] {
            assert!(matches!(FleetName::parse(bad), Some(Err(_))), "{bad}");
        }
    }

    #[test]
    fn hosts_files_parse_like_hosts5() {
        let text = "\
# the fleet
127.0.0.2   collectors  other
127.0.0.3\tCOLLECTORS.   # trailing dot and case
not-an-ip collectors
127.0.0.2 collectors
::1 collectors
127.0.0.9 collectorsx
";
        let ips: Vec<String> = hosts_addresses(text, "collectors")
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(ips, ["127.0.0.2", "127.0.0.3", "::1"]);
        assert!(hosts_addresses(text, "absent").is_empty());
    }

    #[test]
    fn resolution_reads_the_hosts_file_then_the_system() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("hosts");
        std::fs::write(&file, "127.0.0.4 fleet\n127.0.0.2 fleet\n").unwrap();
        let name = FleetName::parse("dns:///fleet:4319").unwrap().unwrap();
        assert_eq!(
            resolve(&name, Some(&file)).unwrap(),
            [addr("127.0.0.2:4319"), addr("127.0.0.4:4319")]
        );
        let local = FleetName::parse("dns:///localhost:9").unwrap().unwrap();
        let found = resolve(&local, Some(&file)).unwrap();
        assert!(found.iter().all(|a| a.ip().is_loopback()), "{found:?}");
        let error = resolve(&name, Some(&dir.path().join("missing"))).unwrap_err();
        assert!(error.starts_with("hosts file "), "{error}");
    }

    fn fleet_of(n: u8) -> Vec<SocketAddr> {
        (0..n)
            .map(|i| SocketAddr::new(IpAddr::from([127, 0, 0, 2 + i]), 4319))
            .collect()
    }

    fn tops(instances: &[String], addrs: &[SocketAddr]) -> Vec<SocketAddr> {
        instances
            .iter()
            .map(|id| ranked(id, addrs.to_vec())[0])
            .collect()
    }

    #[test]
    fn rendezvous_moves_only_what_scaling_must() {
        let instances: Vec<String> = (0..1000).map(|i| format!("{i:032x}")).collect();
        let three = tops(&instances, &fleet_of(3));
        let four = tops(&instances, &fleet_of(4));
        let added = fleet_of(4)[3];
        let moved: Vec<usize> = (0..1000).filter(|&i| three[i] != four[i]).collect();
        // Every move goes to the new address, and about a quarter move.
        assert!(moved.iter().all(|&i| four[i] == added));
        assert!((180..=320).contains(&moved.len()), "{} moved", moved.len());
        // Removing an address moves only the instances it served.
        let mut two = fleet_of(3);
        let removed = two.remove(1);
        let after = tops(&instances, &two);
        for i in 0..1000 {
            if three[i] == removed {
                assert_ne!(after[i], removed);
            } else {
                assert_eq!(after[i], three[i], "instance {i} moved");
            }
        }
        // Spread: each of three addresses serves about a third.
        for a in fleet_of(3) {
            let n = three.iter().filter(|t| **t == a).count();
            assert!((250..=420).contains(&n), "{a}: {n}");
        }
    }

    #[test]
    fn the_ranking_ignores_the_order_of_resolution() {
        let mut addrs = fleet_of(4);
        let first = ranked("abc", addrs.clone());
        addrs.reverse();
        assert_eq!(ranked("abc", addrs), first);
    }

    #[test]
    fn skipped_addresses_are_passed_over_until_their_time() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("hosts");
        std::fs::write(&file, "127.0.0.2 f\n127.0.0.3 f\n").unwrap();
        let options = FleetOptions {
            hosts_file: Some(file.clone()),
            resolve_every: Duration::from_secs(30),
        };
        let name = FleetName::parse("dns:///f:7").unwrap().unwrap();
        let t0 = Instant::now();
        let mut fleet = Fleet::new(name, options, "instance", t0);
        let top = fleet.pick(t0).unwrap();
        assert_eq!(fleet.addresses().len(), 2);
        let other = fleet.addresses()[1];
        fleet.skip(top, t0 + Duration::from_secs(1));
        assert_eq!(fleet.pick(t0), Some(other));
        assert_eq!(fleet.next_unskip(t0), Some(t0 + Duration::from_secs(1)));
        fleet.skip(other, t0 + Duration::from_secs(2));
        assert_eq!(fleet.pick(t0), None);
        assert_eq!(fleet.pick(t0 + Duration::from_secs(1)), Some(top));
        // A re-resolution that fails keeps the addresses known.
        std::fs::remove_file(&file).unwrap();
        assert!(fleet.resolve(t0).is_err());
        assert_eq!(fleet.addresses().len(), 2);
        assert_eq!(fleet.resolve_at(), t0 + Duration::from_secs(30));
    }
}
