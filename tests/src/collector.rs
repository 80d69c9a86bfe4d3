//! The `hermes-collector` binary as a test process: started on a free (or a
//! chosen) port, or with a configuration file, or from any command line
//! ([`Collector::launch`]), with piped output and the admin server on an
//! ephemeral port (so tests run in parallel); up once its `/readyz` answers
//! 200 (the admin address read from its log). Every test that starts a
//! collector starts it here.

use std::ops::{Deref, DerefMut};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::{ChildGuard, cargo_bin, free_port};

/// How long the collector may take to start.
const START: Duration = Duration::from_secs(30);

/// A running collector; killed (with its process group) on drop. Derefs to
/// its [`ChildGuard`] (signals, output, exit).
pub struct Collector {
    pub guard: ChildGuard,
    /// Its ingest, `http://127.0.0.1:PORT`, for `HERMES_COLLECTOR_ENDPOINT`.
    pub endpoint: String,
}

impl Deref for Collector {
    type Target = ChildGuard;

    fn deref(&self) -> &ChildGuard {
        &self.guard
    }
}

impl DerefMut for Collector {
    fn deref_mut(&mut self) -> &mut ChildGuard {
        &mut self.guard
    }
}

impl Collector {
    /// A command running the workspace's `hermes-collector` binary, for
    /// [`launch`](Self::launch).
    pub fn command() -> Command {
        Command::new(cargo_bin("hermes-collector", "hermes-collector"))
    }

    /// Spawns `cmd` (a collector command line: its own arguments,
    /// environment, directory; `RUST_LOG` is `info` unless it sets one) and
    /// waits until the collector is ready. Its endpoint is the address its
    /// log says it receives on.
    pub fn launch(cmd: Command) -> Collector {
        let mut collector = Self::spawn(cmd, String::new());
        let line = "receiving Hermes events";
        assert!(
            collector.wait_for_stderr(START, |e| e.contains(line)),
            "the collector did not log `{line}`:\n{}",
            collector.stderr_text()
        );
        let listen = log_field(&collector.stderr_text(), line, "listen=")
            .unwrap_or_else(|| panic!("no ingest address in the log"));
        collector.endpoint = if listen.starts_with("unix:") {
            listen
        } else {
            format!("http://{listen}")
        };
        collector
    }

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

    /// Starts `hermes-collector --config FILE` in `cwd`, the file receiving
    /// on a free port of 127.0.0.1, serving admin on an ephemeral one, and
    /// holding `sections` (the rest of the configuration) after that.
    pub fn start_with_sections(cwd: &Path, sections: &str) -> Collector {
        let listen = format!("127.0.0.1:{}", free_port());
        let yaml =
            format!("receiver:\n  listen: {listen}\nadmin:\n  listen: 127.0.0.1:0\n{sections}");
        Self::start_with_config(cwd, &listen, &yaml)
    }

    /// As [`Collector::start_with_config`], with `env` added to the
    /// process' environment.
    pub fn start_with_config_env(
        cwd: &Path,
        listen: &str,
        yaml: &str,
        env: &[(&str, &str)],
    ) -> Collector {
        let config = write_config(cwd, yaml);
        let mut cmd = Command::new(cargo_bin("hermes-collector", "hermes-collector"));
        cmd.current_dir(cwd)
            .arg("--config")
            .arg(&config)
            .envs(env.iter().copied());
        Self::spawn(cmd, format!("http://{listen}"))
    }

    /// Spawns `cmd` with piped output and waits until it is ready.
    fn spawn(mut cmd: Command, endpoint: String) -> Collector {
        if !cmd.get_envs().any(|(key, _)| key == "RUST_LOG") {
            cmd.env("RUST_LOG", "info");
        }
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut guard = ChildGuard::spawn_named("hermes-collector", &mut cmd)
            .unwrap_or_else(|e| panic!("spawn collector: {e}"));
        if let Err(why) = wait_ready(&mut guard, START) {
            panic!("collector did not start: {why}:\n{}", guard.stderr_text());
        }
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

/// Writes `yaml` as `collector.yaml` in `dir`; returns its path.
pub fn write_config(dir: &Path, yaml: &str) -> String {
    crate::write_file(dir, "collector.yaml", yaml)
        .to_string_lossy()
        .into_owned()
}

/// The value of the unlabelled counter `name` on the `/metrics` of a
/// collector process, if it is there.
pub fn counter(collector: &ChildGuard, name: &str) -> Option<u64> {
    admin_get(collector, "/metrics")
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Waits at most `timeout` until the collector's `/readyz` answers 200 (the
/// admin address from its log line `serving /livez ... listen=`); why not,
/// if it exits or the time runs out first.
pub fn wait_ready(collector: &mut ChildGuard, timeout: Duration) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    let mut last = String::from("no admin address in the log yet");
    while Instant::now() < deadline {
        if let Some(status) = collector.try_wait() {
            return Err(format!("it exited ({status})"));
        }
        if let Some(addr) = admin_address(collector) {
            match get(&addr, "/readyz", &[]) {
                Ok(response) if response.starts_with("HTTP/1.1 200") => return Ok(()),
                Ok(response) => last = response.lines().next().unwrap_or_default().to_owned(),
                Err(e) => last = format!("/readyz: {e}"),
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(format!("not ready within {timeout:?} ({last})"))
}

/// The value of `key` (up to the next blank) on the first log line
/// containing `message`.
fn log_field(log: &str, message: &str, key: &str) -> Option<String> {
    log.lines()
        .find(|l| l.contains(message))
        .and_then(|l| l.split(key).nth(1))
        .and_then(|a| a.split_whitespace().next())
        .map(str::to_string)
}

/// The admin server's address, from the collector's log.
fn admin_address(collector: &ChildGuard) -> Option<String> {
    log_field(&collector.stderr_text(), "serving /livez", "listen=")
}

/// `GET path` on the admin server of a collector process (address from its
/// log line `serving /livez ... listen=`).
pub fn admin_get(collector: &ChildGuard, path: &str) -> String {
    admin_request(collector, path, &[])
}

/// `GET path` with the extra request `headers` on the admin server of a
/// collector process; the whole HTTP response.
pub fn admin_request(collector: &ChildGuard, path: &str, headers: &[(&str, &str)]) -> String {
    let addr = admin_address(collector)
        .unwrap_or_else(|| panic!("no admin address in the log:\n{}", collector.stderr_text()));
    get(&addr, path, headers).unwrap_or_else(|e| panic!("admin request {path}: {e}"))
}

/// `GET path` with `headers` at `addr`, one connection; the whole response.
fn get(addr: &str, path: &str, headers: &[(&str, &str)]) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let extra: String = headers
        .iter()
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .collect();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{extra}Connection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    Ok(response)
}
