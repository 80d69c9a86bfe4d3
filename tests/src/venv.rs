//! The Python venv the end-to-end tests run Hermes in.
//!
//! `tests/setup_venv.sh` creates it (idempotently, under a `flock`, so
//! parallel test binaries don't race) at `$HERMES_E2E_VENV`, default
//! `<repo>/target/e2e-venv`, with `hermes-agent==0.19.0`, `maturin` and our
//! shim. [`ensure_venv`] runs the script at most once per test process.
//! Tests of older Hermes releases take a venv of their own per version
//! ([`ensure_venv_for`]), next to the default one.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::process::ChildGuard;
use crate::{env_secs, repo_root, tests_dir};

/// Default bound on `setup_venv.sh` (first run: ~1 min for the pip installs,
/// plus a maturin build of the shim, which may wait for the cargo lock).
const SETUP_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// The hermes-agent release the default venv holds.
pub const DEFAULT_HERMES_VERSION: &str = "0.19.0";

/// The venv path `setup_venv.sh` uses: `$HERMES_E2E_VENV` or
/// `<repo>/target/e2e-venv`.
pub fn venv_path() -> PathBuf {
    match std::env::var_os("HERMES_E2E_VENV") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => repo_root().join("target").join("e2e-venv"),
    }
}

/// Makes sure the venv exists and is up to date (running `setup_venv.sh`
/// once per process) and returns its path. Panics, in every caller, if the
/// setup failed.
///
/// The script's output goes to this process' stdout/stderr. Its run is
/// bounded by `$HERMES_E2E_SETUP_TIMEOUT_SECS` (default 1800). Set
/// `SKIP_SHIM=1` to skip the shim (only for developing the harness).
pub fn ensure_venv() -> PathBuf {
    ensure_venv_for(DEFAULT_HERMES_VERSION)
}

/// Like [`ensure_venv`] for another hermes-agent release (`"0.18.2"`): its
/// venv is the default path with `-<version>` appended, made and kept up to
/// date by the same script, at most once per test process and version.
pub fn ensure_venv_for(hermes_version: &str) -> PathBuf {
    type Setups = Mutex<HashMap<String, Arc<OnceLock<Result<PathBuf, String>>>>>;
    static VENVS: OnceLock<Setups> = OnceLock::new();
    let once = {
        let mut venvs = VENVS
            .get_or_init(Setups::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        Arc::clone(venvs.entry(hermes_version.to_string()).or_default())
    };
    match once.get_or_init(|| run_setup(hermes_version)) {
        Ok(path) => path.clone(),
        Err(e) => panic!("{e}"),
    }
}

/// Where the venv of `hermes_version` lives.
pub fn venv_path_for(hermes_version: &str) -> PathBuf {
    let default = venv_path();
    if hermes_version == DEFAULT_HERMES_VERSION {
        return default;
    }
    let mut name = default.file_name().unwrap_or_default().to_os_string();
    name.push(format!("-{hermes_version}"));
    default.with_file_name(name)
}

fn run_setup(hermes_version: &str) -> Result<PathBuf, String> {
    let venv = venv_path_for(hermes_version);
    run_setup_script(
        "setup_venv.sh",
        &[
            ("HERMES_E2E_VENV", venv.as_os_str()),
            ("HERMES_E2E_HERMES_VERSION", hermes_version.as_ref()),
        ],
        "(SKIP_SHIM=1 skips the shim while it does not build yet)",
    )?;
    let hermes = venv_bin_in(&venv, "hermes");
    if !hermes.is_file() {
        return Err(format!(
            "setup_venv.sh ran but {} is missing; run `bash tests/setup_venv.sh`",
            hermes.display()
        ));
    }
    Ok(venv)
}

/// Runs `tests/SCRIPT` with `env` from the repository root, its output
/// shown, bounded by `HERMES_E2E_SETUP_TIMEOUT_SECS`; on failure, an error
/// saying so and `hint` (what to run or check).
pub(crate) fn run_setup_script(
    script: &str,
    env: &[(&str, &std::ffi::OsStr)],
    hint: &str,
) -> Result<(), String> {
    let script = tests_dir().join(script);
    let timeout = env_secs("HERMES_E2E_SETUP_TIMEOUT_SECS", SETUP_TIMEOUT);
    let mut cmd = Command::new("bash");
    cmd.arg(&script)
        .envs(env.iter().copied())
        .current_dir(repo_root())
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit());
    // Never hand the agent's OTLP trap to pip/maturin either.
    cmd.env_remove("OTEL_EXPORTER_OTLP_ENDPOINT");
    let name = script
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut guard = ChildGuard::spawn_named(&name, &mut cmd)
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    match guard.wait_timeout(timeout) {
        Some(status) if status.success() => Ok(()),
        Some(status) => Err(format!(
            "{} failed ({status}); see its output above. {hint}",
            script.display()
        )),
        None => {
            guard.kill();
            Err(format!(
                "{} did not finish within {timeout:?}",
                script.display()
            ))
        }
    }
}

fn venv_bin_in(venv: &Path, program: &str) -> PathBuf {
    venv.join("bin").join(program)
}

/// The path of `program` in the venv's `bin/` (after [`ensure_venv`]).
pub fn venv_bin(program: &str) -> PathBuf {
    venv_bin_in(&ensure_venv(), program)
}

/// The venv's Python interpreter (after [`ensure_venv`]).
pub fn venv_python() -> PathBuf {
    venv_bin("python")
}
