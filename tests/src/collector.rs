//! The `hermes-collector` binary as a test process: started on a free (or a
//! chosen) port, or with a configuration file, with piped output and the
//! admin server on an ephemeral port (so tests run in parallel); up once it
//! logs that it receives events.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::{ChildGuard, cargo_bin, free_port};

/// How long the collector may take to start.
const START: Duration = Duration::from_secs(30);

/// A running collector; killed (with its process group) on drop.
pub struct Collector {
    pub guard: ChildGuard,
    /// Its ingest, `http://127.0.0.1:PORT`, for `HERMES_COLLECTOR_ENDPOINT`.
    pub endpoint: String,
}

impl Collector {
    /// Starts the collector in `cwd` with `args` (after `--listen` on a free
    /// port and `--admin-listen 127.0.0.1:0`).
    pub fn start(cwd: &Path, args: &[&str]) -> Collector {
        let listen = format!("127.0.0.1:{}", free_port());
        Self::start_on(cwd, &listen, args)
    }

    /// Starts `hermes-collector --listen LISTEN --admin-listen 127.0.0.1:0
    /// ARGS…` in `cwd`.
    pub fn start_on(cwd: &Path, listen: &str, args: &[&str]) -> Collector {
        Self::start_with_env(cwd, listen, args, &[])
    }

    /// As [`Collector::start_on`], with `env` added to the process'
    /// environment.
    pub fn start_with_env(
        cwd: &Path,
        listen: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Collector {
        let mut cmd = Command::new(cargo_bin("hermes-collector", "hermes-collector"));
        cmd.current_dir(cwd)
            .args(["--listen", listen, "--admin-listen", "127.0.0.1:0"])
            .args(args)
            .envs(env.iter().copied());
        Self::spawn(cmd, format!("http://{listen}"))
    }

    /// As [`Collector::start`] with another build of the collector: the
    /// `binary` a release unpacked, say.
    pub fn start_binary(binary: &Path, cwd: &Path, args: &[&str]) -> Collector {
        let listen = format!("127.0.0.1:{}", free_port());
        let mut cmd = Command::new(binary);
        cmd.current_dir(cwd)
            .args(["--listen", &listen, "--admin-listen", "127.0.0.1:0"])
            .args(args);
        Self::spawn(cmd, format!("http://{listen}"))
    }

    /// Starts `hermes-collector --config FILE` in `cwd`, the file holding
    /// `yaml` (which must set `receiver.listen` to `listen` and
    /// `admin.listen` to `127.0.0.1:0`).
    pub fn start_with_config(cwd: &Path, listen: &str, yaml: &str) -> Collector {
        Self::start_with_config_env(cwd, listen, yaml, &[])
    }

    /// As [`Collector::start_with_config`], with `env` added to the
    /// process' environment.
    pub fn start_with_config_env(
        cwd: &Path,
        listen: &str,
        yaml: &str,
        env: &[(&str, &str)],
    ) -> Collector {
        let config = cwd.join("collector.yaml");
        std::fs::write(&config, yaml).unwrap_or_else(|e| panic!("write {}: {e}", config.display()));
        let mut cmd = Command::new(cargo_bin("hermes-collector", "hermes-collector"));
        cmd.current_dir(cwd)
            .arg("--config")
            .arg(&config)
            .envs(env.iter().copied());
        Self::spawn(cmd, format!("http://{listen}"))
    }

    /// Spawns `cmd` with piped output and waits until it logs that it
    /// receives events.
    fn spawn(mut cmd: Command, endpoint: String) -> Collector {
        cmd.env("RUST_LOG", "info")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut guard = ChildGuard::spawn_named("hermes-collector", &mut cmd)
            .unwrap_or_else(|e| panic!("spawn collector: {e}"));
        let up = guard.wait_for_stderr(START, |e| e.contains("receiving Hermes events"));
        assert!(up, "collector did not start:\n{}", guard.stderr_text());
        Collector { guard, endpoint }
    }

    /// Whether the process still runs.
    pub fn is_running(&mut self) -> bool {
        self.guard.try_wait().is_none()
    }

    /// `GET path` on the admin server (address from the collector's log);
    /// the whole HTTP response.
    pub fn admin_get(&self, path: &str) -> String {
        admin_get(&self.guard, path)
    }

    /// The sum of every sample of metric `name` (all label sets) on
    /// `/metrics`; 0 if absent.
    pub fn metric(&self, name: &str) -> f64 {
        crate::fault::metric_sum(&self.admin_get("/metrics"), name)
    }
}

/// `GET path` on the admin server of a collector process (address from its
/// log line `serving /livez ... listen=`).
pub fn admin_get(collector: &ChildGuard, path: &str) -> String {
    admin_request(collector, path, &[])
}

/// `GET path` with the extra request `headers` on the admin server of a
/// collector process; the whole HTTP response.
pub fn admin_request(collector: &ChildGuard, path: &str, headers: &[(&str, &str)]) -> String {
    use std::io::{Read, Write};
    let log = collector.stderr_text();
    let addr = log
        .lines()
        .find(|l| l.contains("serving /livez"))
        .and_then(|l| l.split("listen=").nth(1))
        .map(|a| a.trim().to_string())
        .unwrap_or_else(|| panic!("no admin address in the log:\n{log}"));
    let mut stream =
        std::net::TcpStream::connect(&addr).unwrap_or_else(|e| panic!("connect admin: {e}"));
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let extra: String = headers
        .iter()
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .collect();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{extra}Connection: close\r\n\r\n"
    )
    .unwrap_or_else(|e| panic!("admin request: {e}"));
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .unwrap_or_else(|e| panic!("admin response: {e}"));
    response
}
