//! Child processes in tests: a guard that kills its process (group) on drop,
//! captures piped output in the background, and only ever waits with a
//! timeout; plus [`run_with_timeout`] and [`free_port`].
//!
//! Every child spawned here is the leader of its own process group, so that
//! killing it also kills what it spawned (Hermes' terminal tool runs shell
//! commands; maturin runs cargo). Signals are sent with the `kill` command,
//! which keeps this crate free of `unsafe`.

use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::wait_until;

/// How often bounded waits poll.
const POLL: Duration = Duration::from_millis(20);
/// How long to wait for output readers after the child exited (a grandchild
/// that inherited the pipe can keep it open forever).
const READER_GRACE: Duration = Duration::from_secs(5);

/// Returns a TCP port on 127.0.0.1 that was free a moment ago. Prefer letting
/// the server bind port 0 itself and report it, when the server can.
///
/// The port comes from below Linux' ephemeral range (32768-60999), so an
/// outgoing connection of a test running in parallel cannot take it between
/// this check and the server's bind (which is what a port-0 probe allowed);
/// a process-wide cursor hands each port out once, and the start is spread
/// by pid so that test binaries running side by side rarely meet. A port is
/// probed by connecting, not by binding: a probe listener would leak into any
/// child that a parallel test forks at that moment and keep the port taken.
pub fn free_port() -> u16 {
    const FIRST: u16 = 20_000;
    const SPAN: u16 = 12_000;
    static CURSOR: AtomicU16 = AtomicU16::new(0);
    let base = (std::process::id() % u32::from(SPAN)) as u16;
    for _ in 0..SPAN {
        let step = CURSOR.fetch_add(1, Ordering::Relaxed);
        let port = FIRST + (base.wrapping_add(step.wrapping_mul(7)) % SPAN);
        let probe = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        if std::net::TcpStream::connect_timeout(&probe, POLL).is_err() {
            return port;
        }
    }
    panic!("no free port in 127.0.0.1:{FIRST}..{}", FIRST + SPAN)
}

/// Output of a pipe, filled by a background reader thread.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn spawn_reader(
        mut source: impl Read + Send + 'static,
        name: &str,
    ) -> (Self, Option<JoinHandle<()>>) {
        let captured = Captured::default();
        let sink = captured.clone();
        let handle = std::thread::Builder::new()
            .name(format!("capture-{name}"))
            .spawn(move || {
                let mut buf = [0u8; 8192];
                loop {
                    match source.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => sink.lock().extend_from_slice(&buf[..n]),
                    }
                }
            })
            .ok();
        (captured, handle)
    }

    /// What `source` (a child's pipe, if piped) writes, its reader thread
    /// added to `readers`; empty if not piped.
    fn of(
        source: Option<impl Read + Send + 'static>,
        name: &str,
        readers: &mut Vec<JoinHandle<()>>,
    ) -> Self {
        let Some(source) = source else {
            return Captured::default();
        };
        let (captured, handle) = Captured::spawn_reader(source, name);
        readers.extend(handle);
        captured
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<u8>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn bytes(&self) -> Vec<u8> {
        self.lock().clone()
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.lock()).into_owned()
    }
}

/// Sends `signal` (a name such as `TERM`, `KILL`, `INT`) to `pid`, or to the
/// process group `pid` when `group` is set. Returns whether `kill` succeeded.
pub fn send_signal(pid: u32, signal: &str, group: bool) -> bool {
    let target = if group {
        format!("-{pid}")
    } else {
        pid.to_string()
    };
    Command::new("kill")
        .args(["-s", signal, "--", &target])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// A spawned process that is killed (with its whole process group) when the
/// guard is dropped.
///
/// If the command had `Stdio::piped()` for stdout and/or stderr, the output
/// is read in the background and available at any time through
/// [`stdout_text`](Self::stdout_text) / [`stderr_text`](Self::stderr_text)
/// and the `wait_for_*` methods. A piped stdin is kept open for the life of
/// the guard (so a child that exits on stdin EOF exits when the test process
/// dies).
pub struct ChildGuard {
    name: String,
    child: Child,
    stdout: Captured,
    stderr: Captured,
    readers: Vec<JoinHandle<()>>,
    status: Option<ExitStatus>,
}

impl ChildGuard {
    /// Spawns `cmd` as the leader of a new process group and guards it.
    pub fn spawn(cmd: &mut Command) -> std::io::Result<ChildGuard> {
        let name = cmd.get_program().to_string_lossy().into_owned();
        Self::spawn_named(&name, cmd)
    }

    /// As [`spawn`](Self::spawn), with a name used in messages and thread names.
    pub fn spawn_named(name: &str, cmd: &mut Command) -> std::io::Result<ChildGuard> {
        cmd.process_group(0);
        let mut child = cmd.spawn()?;
        let mut readers = Vec::new();
        let stdout = Captured::of(child.stdout.take(), &format!("{name}-stdout"), &mut readers);
        let stderr = Captured::of(child.stderr.take(), &format!("{name}-stderr"), &mut readers);
        Ok(ChildGuard {
            name: name.to_string(),
            child,
            stdout,
            stderr,
            readers,
            status: None,
        })
    }

    /// The process id (also the process group id).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The name given at spawn time.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The guarded child, e.g. to take its stdin.
    pub fn child_mut(&mut self) -> &mut Child {
        &mut self.child
    }

    /// Everything the child wrote to its piped stdout so far (lossy UTF-8).
    pub fn stdout_text(&self) -> String {
        self.stdout.text()
    }

    /// Everything the child wrote to its piped stderr so far (lossy UTF-8).
    pub fn stderr_text(&self) -> String {
        self.stderr.text()
    }

    /// Waits until `pred` holds for the captured stdout, at most `timeout`.
    /// Returns false on timeout or if the child exited without satisfying it.
    pub fn wait_for_stdout(&mut self, timeout: Duration, pred: impl Fn(&str) -> bool) -> bool {
        let out = self.stdout.clone();
        self.wait_for_captured(&out, timeout, pred)
    }

    /// Waits until `pred` holds for the captured stderr, at most `timeout`.
    pub fn wait_for_stderr(&mut self, timeout: Duration, pred: impl Fn(&str) -> bool) -> bool {
        let err = self.stderr.clone();
        self.wait_for_captured(&err, timeout, pred)
    }

    fn wait_for_captured(
        &mut self,
        captured: &Captured,
        timeout: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> bool {
        let mut exited_checks = 0;
        wait_until(timeout, POLL, || {
            if pred(&captured.text()) {
                return true;
            }
            if self.try_wait().is_some() {
                // Give the reader a few polls to drain the pipe, then stop.
                exited_checks += 1;
                if exited_checks > 10 {
                    return true;
                }
            }
            false
        }) && pred(&captured.text())
    }

    /// The exit status if the child has exited, without blocking.
    ///
    /// When it first sees the exit, it kills what is left of the process
    /// group (background processes the child started). That is done right
    /// after reaping, only once: later the group id could belong to someone
    /// else.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().ok().flatten();
            if self.status.is_some() {
                send_signal(self.pid(), "KILL", true);
            }
        }
        self.status
    }

    /// Waits at most `timeout` for the child to exit.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        wait_until(timeout, POLL, || self.try_wait().is_some());
        self.status
    }

    /// Sends `signal` (e.g. `"TERM"`, `"INT"`, `"HUP"`) to the child only.
    pub fn signal(&self, signal: &str) -> bool {
        send_signal(self.pid(), signal, false)
    }

    /// SIGTERM to the child, then waits at most `timeout` for its exit:
    /// the status (None: still running) and the time from the signal on.
    pub fn sigterm(&mut self, timeout: Duration) -> (Option<ExitStatus>, Duration) {
        let signalled = Instant::now();
        assert!(self.signal("TERM"), "SIGTERM to {}", self.name);
        let status = self.wait_timeout(timeout);
        (status, signalled.elapsed())
    }

    /// [`sigterm`](Self::sigterm), asserting the child exits 0 in time
    /// (showing its stderr otherwise).
    pub fn assert_clean_stop(&mut self, timeout: Duration) {
        let (status, took) = self.sigterm(timeout);
        assert!(
            status.is_some_and(|s| s.success()),
            "{} did not exit 0 within {timeout:?} of SIGTERM ({status:?} after {took:?}):\n{}",
            self.name,
            self.stderr_text()
        );
    }

    /// Graceful stop: SIGTERM to the child, wait at most `grace`, then
    /// SIGKILL to the whole process group. Returns the exit status.
    pub fn terminate(&mut self, grace: Duration) -> ExitStatus {
        if let Some(status) = self.try_wait() {
            return status;
        }
        self.signal("TERM");
        if let Some(status) = self.wait_timeout(grace) {
            return status;
        }
        self.kill()
    }

    /// SIGKILL to the whole process group; returns the exit status.
    pub fn kill(&mut self) -> ExitStatus {
        if self.try_wait().is_none() {
            send_signal(self.pid(), "KILL", true);
            let _ = self.child.kill();
        }
        // SIGKILL cannot be ignored: a timeout here means the process is
        // stuck in the kernel. Report it as killed.
        self.wait_timeout(Duration::from_secs(10))
            .unwrap_or_else(|| ExitStatus::from_raw(9))
    }

    /// Waits at most `timeout` for the child to exit (killing it after the
    /// timeout) and returns its output; `timed_out` tells which happened.
    pub fn into_output(mut self, timeout: Duration) -> RunOutput {
        let start = Instant::now();
        let timed_out = self.wait_timeout(timeout).is_none();
        let status = match self.status {
            Some(status) if !timed_out => status,
            _ => self.kill(),
        };
        let deadline = Instant::now() + READER_GRACE;
        for reader in std::mem::take(&mut self.readers) {
            while !reader.is_finished() && Instant::now() < deadline {
                std::thread::sleep(POLL);
            }
            if reader.is_finished() {
                let _ = reader.join();
            }
        }
        RunOutput {
            output: Output {
                status,
                stdout: self.stdout.bytes(),
                stderr: self.stderr.bytes(),
            },
            timed_out,
            elapsed: start.elapsed(),
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        // If the leader is still running, the group id is certainly ours:
        // kill the whole group. (If it exited, try_wait already swept it.)
        if self.try_wait().is_none() {
            self.kill();
        }
    }
}

/// The result of [`run_with_timeout`].
#[derive(Debug)]
pub struct RunOutput {
    /// Status, stdout and stderr. After a timeout the status is the one of
    /// the killed process.
    pub output: Output,
    /// The process did not finish in time and was killed.
    pub timed_out: bool,
    /// Wall time from the wait's start to the exit (or kill).
    pub elapsed: Duration,
}

impl RunOutput {
    /// stdout as lossy UTF-8.
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.output.stdout).into_owned()
    }

    /// stderr as lossy UTF-8.
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }

    /// Exited by itself with status 0.
    pub fn success(&self) -> bool {
        !self.timed_out && self.output.status.success()
    }

    /// Asserts the collector refused its configuration: exit 64 (usage
    /// error), with `needle` (the offending key) on stderr. `context` (the
    /// case) starts each failure message.
    pub fn assert_refused_naming(&self, context: &str, needle: &str) {
        assert_eq!(
            self.output.status.code(),
            Some(64),
            "{context}:\n{}",
            self.describe()
        );
        assert!(
            self.stderr().contains(needle),
            "{context}: stderr does not name {needle}:\n{}",
            self.describe()
        );
    }

    /// A multi-line description for assertion messages.
    pub fn describe(&self) -> String {
        format!(
            "status: {}{}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.output.status,
            if self.timed_out {
                " (timed out, killed)"
            } else {
                ""
            },
            self.stdout(),
            self.stderr()
        )
    }
}

/// Runs `cmd` with stdin closed and stdout/stderr captured, killing it (and
/// its process group) after `timeout`.
pub fn run_with_timeout(cmd: &mut Command, timeout: Duration) -> RunOutput {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let name = cmd.get_program().to_string_lossy().into_owned();
    let guard =
        ChildGuard::spawn_named(&name, cmd).unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    guard.into_output(timeout)
}

/// Build results by (package, binary).
type BuiltBins = std::collections::HashMap<(String, String), Result<std::path::PathBuf, String>>;

/// The path of binary `bin` of workspace package `package`, built once per
/// test process with `cargo build -p PACKAGE --bin BIN` (same profile as
/// the tests: debug unless `$HERMES_E2E_CARGO_PROFILE` says otherwise).
/// `$HERMES_COLLECTOR_BIN` short-cuts this for `hermes-collector`.
/// Panics if the build fails or takes longer than 30 min (it may wait for
/// the cargo lock while others build).
pub fn cargo_bin(package: &str, bin: &str) -> std::path::PathBuf {
    use std::sync::OnceLock;
    static BUILT: OnceLock<Mutex<BuiltBins>> = OnceLock::new();

    if bin == "hermes-collector"
        && let Some(path) = std::env::var_os("HERMES_COLLECTOR_BIN").filter(|p| !p.is_empty())
    {
        return std::path::PathBuf::from(path);
    }
    let built = BUILT.get_or_init(Mutex::default);
    // Held during the build: concurrent tests wait for one build.
    let mut map = built.lock().unwrap_or_else(PoisonError::into_inner);
    let entry = map
        .entry((package.to_string(), bin.to_string()))
        .or_insert_with(|| build_bin(package, bin));
    match entry {
        Ok(path) => path.clone(),
        Err(e) => panic!("{e}"),
    }
}

fn build_bin(package: &str, bin: &str) -> Result<std::path::PathBuf, String> {
    let root = crate::repo_root();
    let profile = std::env::var("HERMES_E2E_CARGO_PROFILE").unwrap_or_else(|_| "dev".to_string());
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--profile", &profile, "-p", package, "--bin", bin])
        .current_dir(&root)
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit());
    let mut guard = ChildGuard::spawn_named("cargo-build", &mut cmd)
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    let timeout = crate::env_secs(
        "HERMES_E2E_BUILD_TIMEOUT_SECS",
        Duration::from_secs(30 * 60),
    );
    match guard.wait_timeout(timeout) {
        Some(status) if status.success() => {}
        Some(status) => {
            return Err(format!(
                "cargo build -p {package} --bin {bin} failed: {status}"
            ));
        }
        None => {
            guard.kill();
            return Err(format!(
                "cargo build -p {package} --bin {bin} took longer than {timeout:?}"
            ));
        }
    }
    let dir = if profile == "dev" {
        "debug".to_string()
    } else {
        profile
    };
    let path = target_dir.join(dir).join(bin);
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "cargo build succeeded but {} does not exist",
            path.display()
        ))
    }
}
