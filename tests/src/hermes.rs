//! An isolated Hermes installation state for one test: a temporary `HOME`
//! and `HERMES_HOME`, configured for a custom OpenAI-compatible provider
//! (normally a [`FakeOpenAi`](crate::FakeOpenAi)), and runners for
//! `hermes chat -q …` and Python snippets that use the `AIAgent` API.
//!
//! Every process gets a hermetic environment: the parent's environment is
//! cleared, then `PATH` (venv first), `HOME`, `HERMES_HOME`, `LANG`, `TERM`,
//! `TMPDIR`/`USER`/`LOGNAME`/`SHELL`/`RUST_LOG`/`RUST_BACKTRACE` when set,
//! `HERMES_E2E_BASE_URL`/`_MODEL`/`_API_KEY` (for snippets), and the test's
//! extra variables. `OTEL_*` variables are never passed: with
//! `OTEL_EXPORTER_OTLP_ENDPOINT` set, Hermes' `nemo-relay` dependency exports
//! prompts and responses by itself.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use tempfile::TempDir;

use crate::env_secs;
use crate::process::{RunOutput, run_with_timeout};
use crate::venv::{DEFAULT_HERMES_VERSION, ensure_venv_for};

/// API key configured for the custom provider (the fake server ignores it).
pub const API_KEY: &str = "sk-hermes-e2e";

/// Default bound on one `hermes` run; `$HERMES_E2E_CHAT_TIMEOUT_SECS` overrides.
pub const DEFAULT_RUN_TIMEOUT: Duration = Duration::from_secs(120);
/// Bound on `hermes config …` / `hermes plugins …` commands.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(60);

/// Toolsets passed to `hermes chat -t` by [`HermesHome::run_chat`].
pub const DEFAULT_TOOLSETS: &str = "terminal";

/// Variables a test may not hand to the agent (see the module doc).
fn forbidden_env(key: &str) -> bool {
    key.starts_with("OTEL_")
}

/// A temporary Hermes home; removed on drop.
pub struct HermesHome {
    dir: TempDir,
    venv: PathBuf,
    hermes_version: String,
    /// `PATH` after the venv's `bin/`; None: this process' `PATH`.
    path: Option<OsString>,
    base_url: String,
    model: String,
    timeout: Duration,
}

impl HermesHome {
    /// Creates `HOME=<tmp>/home`, `HERMES_HOME=<tmp>/home/.hermes` and a work
    /// directory `<tmp>/work` (the cwd of every run), then configures Hermes
    /// through its own CLI, as a user would:
    ///
    /// ```text
    /// hermes config set model.provider custom
    /// hermes config set model.base_url <base_url>
    /// hermes config set model.default <model>
    /// hermes config set model.api_key sk-hermes-e2e
    /// hermes config set model.context_length 128000           # no metadata lookup on openrouter.ai
    /// hermes config set security.tirith_enabled false         # no download of the tirith scanner
    /// hermes config set curator.enabled false                 # no background skill curator
    /// hermes config set --force memory.nudge_interval 0       # no background memory review fork
    /// hermes config set --force skills.creation_nudge_interval 0  # no background skill review fork
    /// ```
    ///
    /// (The nine commands run in one Python process through the same entry
    /// point as the `hermes` script, `hermes_cli.main.main`, to save ~4 s of
    /// interpreter start-up per test; [`config_set`](Self::config_set) runs
    /// the real command.)
    pub fn new(base_url: &str, model: &str) -> HermesHome {
        HermesHome::with_hermes(DEFAULT_HERMES_VERSION, base_url, model)
    }

    /// Like [`new`](Self::new), running another hermes-agent release
    /// (`"0.18.2"`) from its own venv ([`ensure_venv_for`]), configured the
    /// same way (before 0.19, `hermes config set` has no `--force`: the
    /// nudge keys are set without it).
    pub fn with_hermes(hermes_version: &str, base_url: &str, model: &str) -> HermesHome {
        let venv = ensure_venv_for(hermes_version);
        HermesHome::in_venv(hermes_version, venv, None, base_url, model)
    }

    /// Like [`new`](Self::new), running Hermes `hermes_version` from `venv`
    /// (made by the test), with `path` after the venv's `bin/` in every
    /// run's `PATH` instead of this process' `PATH` when given.
    pub fn in_venv(
        hermes_version: &str,
        venv: PathBuf,
        path: Option<OsString>,
        base_url: &str,
        model: &str,
    ) -> HermesHome {
        let dir = crate::temp_dir("hermes-home-");
        let home = HermesHome {
            dir,
            venv,
            hermes_version: hermes_version.to_string(),
            path,
            base_url: base_url.to_string(),
            model: model.to_string(),
            timeout: env_secs("HERMES_E2E_CHAT_TIMEOUT_SECS", DEFAULT_RUN_TIMEOUT),
        };
        for d in [home.hermes_home(), home.work_dir()] {
            std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("create {}: {e}", d.display()));
        }
        let force = if at_least(hermes_version, (0, 19)) {
            "--force "
        } else {
            ""
        };
        let memory_nudge = format!("{force}memory.nudge_interval");
        let skills_nudge = format!("{force}skills.creation_nudge_interval");
        home.config_set_many(&[
            ("model.provider", "custom"),
            ("model.base_url", base_url),
            ("model.default", model),
            ("model.api_key", API_KEY),
            ("model.context_length", "128000"),
            ("security.tirith_enabled", "false"),
            ("curator.enabled", "false"),
            (&memory_nudge, "0"),
            (&skills_nudge, "0"),
        ]);
        home
    }

    /// The hermes-agent release this home runs.
    pub fn hermes_version(&self) -> &str {
        &self.hermes_version
    }

    /// The temporary `HOME`.
    pub fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    /// `HERMES_HOME` (`$HOME/.hermes`).
    pub fn hermes_home(&self) -> PathBuf {
        self.home().join(".hermes")
    }

    /// The working directory of every run (the terminal tool's cwd).
    pub fn work_dir(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    /// The venv Hermes runs from.
    pub fn venv(&self) -> &Path {
        &self.venv
    }

    /// The provider base URL this home was configured with.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// The model this home was configured with.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// Changes the bound on each run (default 120 s or
    /// `$HERMES_E2E_CHAT_TIMEOUT_SECS`).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// `$HERMES_HOME/config.yaml`.
    pub fn config_yaml(&self) -> String {
        std::fs::read_to_string(self.hermes_home().join("config.yaml")).unwrap_or_default()
    }

    /// Hermes' own log (`$HERMES_HOME/logs/agent.log`), for failure messages.
    pub fn agent_log(&self) -> String {
        std::fs::read_to_string(self.hermes_home().join("logs").join("agent.log"))
            .unwrap_or_default()
    }

    /// A command for `program` from the venv's `bin/` with the hermetic
    /// environment and `extra_env`, in [`work_dir`](Self::work_dir).
    /// Panics if `extra_env` names an `OTEL_*` variable.
    pub fn command(&self, program: &str, extra_env: &[(&str, &str)]) -> Command {
        let bin = self.venv.join("bin");
        let mut cmd = Command::new(bin.join(program));
        cmd.env_clear();
        let mut path = OsString::from(bin.as_os_str());
        path.push(":");
        path.push(
            self.path
                .clone()
                .or_else(|| std::env::var_os("PATH"))
                .unwrap_or_else(|| OsString::from("/usr/local/bin:/usr/bin:/bin")),
        );
        cmd.env("PATH", path)
            .env("HOME", self.home())
            .env("HERMES_HOME", self.hermes_home())
            .env("VIRTUAL_ENV", &self.venv)
            .env("LANG", "C.UTF-8")
            .env("TERM", "dumb")
            .env("NO_COLOR", "1")
            .env("PYTHONUNBUFFERED", "1")
            .env("HERMES_E2E_BASE_URL", &self.base_url)
            .env("HERMES_E2E_MODEL", &self.model)
            .env("HERMES_E2E_API_KEY", API_KEY);
        for key in [
            "TMPDIR",
            "USER",
            "LOGNAME",
            "SHELL",
            "RUST_LOG",
            "RUST_BACKTRACE",
        ] {
            if let Some(v) = std::env::var_os(key) {
                cmd.env(key, v);
            }
        }
        for (k, v) in extra_env {
            assert!(
                !forbidden_env(k),
                "{k} must never be set for the agent (nemo-relay would export prompts and responses)"
            );
            cmd.env(k, v);
        }
        cmd.env_remove("OTEL_EXPORTER_OTLP_ENDPOINT");
        cmd.current_dir(self.work_dir());
        cmd
    }

    /// Runs `hermes ARGS…` with the hermetic environment, bounded by `timeout`.
    pub fn hermes(
        &self,
        args: &[&str],
        extra_env: &[(&str, &str)],
        timeout: Duration,
    ) -> RunOutput {
        let mut cmd = self.command("hermes", extra_env);
        cmd.args(args);
        run_with_timeout(&mut cmd, timeout)
    }

    /// Runs the real `hermes config set KEY VALUE`; panics on failure.
    pub fn config_set(&self, key: &str, value: &str) {
        let out = self.hermes(&["config", "set", key, value], &[], ADMIN_TIMEOUT);
        assert!(
            out.success(),
            "hermes config set {key} {value}: {}",
            out.describe()
        );
    }

    /// Runs `hermes config set` for each `(key, value)` in one interpreter,
    /// through `hermes_cli.main.main` (the `hermes` script's entry point).
    /// A key may start with `--force ` to pass that flag. Panics on failure.
    pub fn config_set_many(&self, pairs: &[(&str, &str)]) {
        let argv: Vec<Vec<String>> = pairs
            .iter()
            .map(|(key, value)| {
                let mut args = vec![
                    "hermes".to_string(),
                    "config".to_string(),
                    "set".to_string(),
                ];
                args.extend(key.split_whitespace().map(String::from));
                args.push(value.to_string());
                args
            })
            .collect();
        let argv = serde_json::to_string(&argv).unwrap_or_else(|e| panic!("encode argv: {e}"));
        let code = r#"
import json, os, sys
from hermes_cli.main import main
for argv in json.loads(os.environ["HERMES_E2E_ARGV"]):
    sys.argv = argv
    try:
        rc = main()
    except SystemExit as e:
        rc = e.code
    if rc not in (None, 0):
        sys.exit(" ".join(argv) + " exited with " + repr(rc))
"#;
        let out = self.python(code, &[("HERMES_E2E_ARGV", &argv)], ADMIN_TIMEOUT);
        assert!(out.success(), "hermes config set …: {}", out.describe());
    }

    /// `hermes plugins enable NAME --no-allow-tool-override` (the plugin
    /// must be installed in the venv: `pip install ./agent-shim`), as the
    /// README says: an observer never replaces built-in tools, and the flag
    /// answers the question Hermes (0.18 and later) would otherwise ask on
    /// stdin. Before 0.18 the command has no such flag (and no question).
    /// Returns the command's output.
    pub fn try_enable_plugin(&self, name: &str) -> RunOutput {
        let mut args = vec!["plugins", "enable", name];
        if at_least(&self.hermes_version, (0, 18)) {
            args.push("--no-allow-tool-override");
        }
        self.hermes(&args, &[], ADMIN_TIMEOUT)
    }

    /// Lists `name` in `plugins.enabled` of `$HERMES_HOME/config.yaml`
    /// (through the venv's PyYAML), the way to enable a pip plugin where
    /// `hermes plugins enable` cannot (0.17); panics on failure.
    pub fn enable_plugin_in_config(&self, name: &str) {
        let code = r#"
import os, yaml
path = os.path.join(os.environ["HERMES_HOME"], "config.yaml")
with open(path, encoding="utf-8") as f:
    config = yaml.safe_load(f) or {}
plugins = config.setdefault("plugins", {}) or {}
config["plugins"] = plugins
enabled = plugins.get("enabled") or []
if os.environ["HERMES_E2E_PLUGIN"] not in enabled:
    enabled.append(os.environ["HERMES_E2E_PLUGIN"])
plugins["enabled"] = enabled
with open(path, "w", encoding="utf-8") as f:
    yaml.safe_dump(config, f, sort_keys=False)
"#;
        let out = self.python(code, &[("HERMES_E2E_PLUGIN", name)], ADMIN_TIMEOUT);
        assert!(
            out.success(),
            "plugins.enabled += {name}: {}",
            out.describe()
        );
    }

    /// `hermes plugins enable NAME`; panics on failure.
    pub fn enable_plugin(&self, name: &str) {
        let out = self.try_enable_plugin(name);
        assert!(
            out.success(),
            "hermes plugins enable {name}: {}",
            out.describe()
        );
    }

    /// `hermes plugins list --plain`.
    pub fn plugins_list(&self) -> String {
        self.hermes(&["plugins", "list", "--plain"], &[], ADMIN_TIMEOUT)
            .stdout()
    }

    /// Runs `hermes chat -q QUERY -Q -t terminal` (one-shot, quiet: stdout is
    /// the final answer, stderr ends with `session_id: …`) with `extra_env`,
    /// killing it after the run timeout. Panics on timeout (with the output
    /// and the tail of Hermes' log); returns the output otherwise, whatever
    /// the exit status.
    pub fn run_chat(&self, query: &str, extra_env: &[(&str, &str)]) -> Output {
        self.run_chat_with(query, DEFAULT_TOOLSETS, &[], extra_env)
    }

    /// As [`run_chat`](Self::run_chat), with the toolsets (`-t`, comma
    /// separated) and extra `hermes chat` arguments (e.g. `--max-turns 3`).
    pub fn run_chat_with(
        &self,
        query: &str,
        toolsets: &str,
        args: &[&str],
        extra_env: &[(&str, &str)],
    ) -> Output {
        let mut argv = vec!["chat", "-q", query, "-Q", "-t", toolsets];
        argv.extend_from_slice(args);
        let out = self.hermes(&argv, extra_env, self.timeout);
        self.output_or_panic("hermes chat", out)
    }

    /// Runs `python -c CODE` with the venv's interpreter (which imports
    /// Hermes, e.g. `from run_agent import AIAgent`) in the work directory,
    /// with the hermetic environment plus `extra_env`. `HERMES_E2E_BASE_URL`,
    /// `HERMES_E2E_MODEL` and `HERMES_E2E_API_KEY` tell the snippet where the
    /// provider is. Panics on timeout; returns the output otherwise.
    pub fn run_python(&self, code: &str, extra_env: &[(&str, &str)]) -> Output {
        let out = self.python(code, extra_env, self.timeout);
        self.output_or_panic("python snippet", out)
    }

    /// `python -c CODE`, bounded by `timeout`, returning the full result.
    pub fn python(&self, code: &str, extra_env: &[(&str, &str)], timeout: Duration) -> RunOutput {
        let mut cmd = self.command("python", extra_env);
        cmd.arg("-c").arg(code);
        run_with_timeout(&mut cmd, timeout)
    }

    fn output_or_panic(&self, what: &str, out: RunOutput) -> Output {
        if out.timed_out {
            let log = self.agent_log();
            let tail: Vec<&str> = log
                .lines()
                .rev()
                .take(40)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            panic!(
                "{what} did not finish within {:?}\n{}\n--- tail of agent.log ---\n{}",
                self.timeout,
                out.describe(),
                tail.join("\n")
            );
        }
        out.output
    }
}

/// Whether `version` (`"0.18.2"`) is at least `(major, minor)`.
fn at_least(version: &str, (major, minor): (u32, u32)) -> bool {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let found = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    found >= (major, minor)
}

/// A Python prelude for [`HermesHome::run_python`] snippets: imports
/// `AIAgent` and defines `make_agent(**kw)`, which builds an agent for the
/// configured custom provider with the terminal toolset, quiet.
pub const PY_AGENT_PRELUDE: &str = r#"
import os
from run_agent import AIAgent

def make_agent(**kw):
    args = dict(
        base_url=os.environ["HERMES_E2E_BASE_URL"],
        api_key=os.environ["HERMES_E2E_API_KEY"],
        provider="custom",
        model=os.environ["HERMES_E2E_MODEL"],
        enabled_toolsets=["terminal"],
        quiet_mode=True,
    )
    args.update(kw)
    return AIAgent(**args)
"#;
