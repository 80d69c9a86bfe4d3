//! The release as a user without a Rust toolchain installs it (README.md,
//! "Install"): runs `deploy/release.sh` (bounded), checks what it wrote to
//! `dist/` (checksums; `auditwheel show` finds the wheel
//! `manylinux_2_17_x86_64`; the collector binary needs no glibc symbol above
//! 2.17), then creates a fresh venv whose `PATH` has no `cargo` or `rustc`,
//! installs `hermes-agent==0.19.0` and the wheel from `dist/` into it, and
//! runs the real agent through that plugin to the collector binary unpacked
//! from `dist/`, which exports the turn's spans to an in-test OTLP receiver.
//!
//! The release build takes minutes on a clean clone (the zig builds of the
//! shim and the collector, in `<target dir>/x86_64-unknown-linux-gnu`);
//! `$HERMES_RELEASE_TEST_TIMEOUT_SECS` bounds it (default 3600). Runs only
//! on x86_64 Linux, the platform the release command builds here.

#![allow(clippy::unwrap_used, clippy::expect_used)]
#![cfg(all(target_os = "linux", target_arch = "x86_64"))]

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use hermes_e2e::collector::Collector;
use hermes_e2e::{
    AttrsExt, FakeOpenAi, HermesHome, OtlpReceiver, SpanExt, env_secs, repo_root, run_with_timeout,
};
use serde_json::json;

const VERSION: &str = env!("CARGO_PKG_VERSION");
const TARGET: &str = "x86_64-unknown-linux-gnu";
/// The oldest glibc the release promises (manylinux2014's).
const GLIBC: (u32, u32) = (2, 17);
const RELEASE_TIMEOUT: Duration = Duration::from_secs(60 * 60);
const PIP_TIMEOUT: Duration = Duration::from_secs(20 * 60);
const WAIT: Duration = Duration::from_secs(30);

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"))
}

/// Runs `cmd` bounded by `timeout`; panics with its output unless it
/// succeeds. Returns stdout.
fn run(what: &str, cmd: &mut Command, timeout: Duration) -> String {
    let out = run_with_timeout(cmd, timeout);
    assert!(out.success(), "{what}: {}", out.describe());
    out.stdout()
}

/// `deploy/release.sh`, as documented: writes to `<repo>/dist`.
fn release() -> PathBuf {
    let timeout = env_secs("HERMES_RELEASE_TEST_TIMEOUT_SECS", RELEASE_TIMEOUT);
    let mut cmd = Command::new("bash");
    cmd.arg(repo_root().join("deploy/release.sh"))
        .current_dir(repo_root())
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT");
    let out = run_with_timeout(&mut cmd, timeout);
    println!("{}", out.stdout());
    assert!(out.success(), "deploy/release.sh: {}", out.describe());
    println!("deploy/release.sh took {:?}", out.elapsed);
    let dist = repo_root().join("dist");
    assert!(
        out.stdout()
            .lines()
            .any(|l| l == format!("release: ready {}", dist.display())),
        "{}",
        out.describe()
    );
    dist
}

/// The one file in `dist` whose name starts with `prefix` and ends with
/// `suffix`.
fn artifact(dist: &Path, prefix: &str, suffix: &str) -> PathBuf {
    let found: Vec<PathBuf> = std::fs::read_dir(dist)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.starts_with(prefix) && name.ends_with(suffix)
        })
        .collect();
    assert_eq!(
        found.len(),
        1,
        "{prefix}…{suffix} in {}: {found:?}",
        dist.display()
    );
    found.into_iter().next().unwrap()
}

/// The highest `GLIBC_x.y` symbol version `elf` needs (`objdump -T`).
fn glibc_needed(elf: &Path) -> (u32, u32) {
    let symbols = run(
        "objdump -T",
        Command::new("objdump").arg("-T").arg(elf),
        WAIT,
    );
    symbols
        .split("GLIBC_")
        .skip(1)
        .filter_map(|rest| {
            let version: String = rest
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.')
                .collect();
            let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
            Some((parts.next()??, parts.next().flatten().unwrap_or(0)))
        })
        .max()
        .expect("the collector links glibc")
}

/// This process' `PATH` without the directories that hold `cargo` or
/// `rustc` (rustup's and the system's alike).
fn path_without_rust() -> OsString {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let kept: Vec<PathBuf> = std::env::split_paths(&path)
        .filter(|dir| !["cargo", "rustc"].iter().any(|t| dir.join(t).exists()))
        .collect();
    std::env::join_paths(kept).unwrap()
}

#[test]
fn the_released_wheel_and_collector_run_without_a_rust_toolchain() {
    let dist = release();

    // Checksums of every artifact.
    run(
        "sha256sum -c SHA256SUMS",
        Command::new("sha256sum")
            .args(["--check", "--strict", "SHA256SUMS"])
            .current_dir(&dist),
        WAIT,
    );
    let wheel = artifact(
        &dist,
        &format!("hermes_collector_shim-{VERSION}-cp311-abi3-"),
        "manylinux_2_17_x86_64.whl",
    );
    artifact(
        &dist,
        &format!("hermes_collector_shim-{VERSION}"),
        ".tar.gz",
    );
    let archive = artifact(
        &dist,
        &format!("hermes-collector-{VERSION}-{TARGET}"),
        ".tar.gz",
    );

    // The wheel runs on manylinux_2_17 (glibc 2.17): a change that links a
    // newer glibc symbol fails here.
    let auditwheel = target_dir().join("release-venv/bin/auditwheel");
    let report = run(
        "auditwheel show",
        Command::new(&auditwheel).arg("show").arg(&wheel),
        WAIT,
    );
    assert!(
        report.contains("\"manylinux_2_17_x86_64\""),
        "auditwheel does not find the wheel manylinux_2_17 compliant:\n{report}"
    );

    // The collector binary, unpacked as a user would.
    let unpacked = tempfile::tempdir().unwrap();
    run(
        "tar -xzf",
        Command::new("tar")
            .arg("-xzf")
            .arg(&archive)
            .arg("-C")
            .arg(unpacked.path()),
        WAIT,
    );
    let collector_dir = unpacked
        .path()
        .join(format!("hermes-collector-{VERSION}-{TARGET}"));
    let binary = collector_dir.join("hermes-collector");
    assert!(collector_dir.join("collector.yaml").is_file());
    let needed = glibc_needed(&binary);
    assert!(
        needed <= GLIBC,
        "the collector needs GLIBC_{}.{}, above the {}.{} the release promises",
        needed.0,
        needed.1,
        GLIBC.0,
        GLIBC.1
    );
    let version = run(
        "hermes-collector --version",
        Command::new(&binary).arg("--version"),
        WAIT,
    );
    assert_eq!(version.trim(), format!("hermes-collector {VERSION}"));

    // A fresh venv, and a PATH where no Rust toolchain is found.
    let path = path_without_rust();
    let venv = target_dir().join("release-e2e-venv");
    let _ = std::fs::remove_dir_all(&venv);
    run(
        "python3 -m venv",
        Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .env("PATH", &path),
        WAIT,
    );
    let mut venv_path = OsString::from(venv.join("bin"));
    venv_path.push(":");
    venv_path.push(&path);
    let in_venv = |program: &str| {
        let mut cmd = Command::new(venv.join("bin").join(program));
        cmd.env_clear()
            .env("PATH", &venv_path)
            .env("HOME", std::env::var_os("HOME").unwrap_or_default())
            .env("VIRTUAL_ENV", &venv)
            .env("LANG", "C.UTF-8");
        cmd
    };
    let which = run_with_timeout(
        Command::new("sh")
            .args(["-c", "command -v cargo || command -v rustc"])
            .env_clear()
            .env("PATH", &venv_path),
        WAIT,
    );
    assert!(
        !which.success(),
        "a Rust toolchain is on the venv's PATH: {}",
        which.stdout()
    );
    run(
        "pip install hermes-agent and the wheel",
        in_venv("python")
            .args([
                "-m",
                "pip",
                "--disable-pip-version-check",
                "--no-input",
                "install",
                "-q",
                "--only-binary",
                "hermes-collector-shim",
                "hermes-agent==0.19.0",
            ])
            .arg(&wheel),
        PIP_TIMEOUT,
    );
    let site = run(
        "import hermes_collector",
        in_venv("python").args([
            "-c",
            "import hermes_collector as h, hermes_collector._core as c; \
             print(h.__version__, h.stats()['version'], c.__file__)",
        ]),
        WAIT,
    );
    let fields: Vec<&str> = site.split_whitespace().collect();
    assert_eq!(fields[..2], [VERSION, VERSION], "{site}");
    assert!(
        Path::new(fields[2]).starts_with(&venv),
        "the plugin comes from {}, not from the venv",
        fields[2]
    );

    // The real agent, through the released plugin and collector.
    let server = FakeOpenAi::start_with(
        &venv.join("bin/python"),
        json!([{"content": "Hello from the release.",
                "usage": {"prompt_tokens": 40, "completion_tokens": 5}}]),
    );
    let receiver = OtlpReceiver::start();
    let collector = Collector::start_binary(
        &binary,
        collector_dir.as_path(),
        &["--otlp-endpoint", &receiver.endpoint()],
    );
    let home = HermesHome::in_venv(
        hermes_e2e::DEFAULT_HERMES_VERSION,
        venv.clone(),
        Some(path),
        &server.base_url(),
        server.model(),
    );
    home.enable_plugin("hermes_collector");
    let out = home.run_chat(
        "Say hello",
        &[("HERMES_COLLECTOR_ENDPOINT", collector.endpoint.as_str())],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("Hello from the release."),
        "hermes chat: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let chat = format!("chat {}", server.model());
    let arrived = receiver.wait_for(
        |spans| {
            spans
                .iter()
                .any(|(_, s)| s.name == "invoke_agent hermes" && s.is_root())
                && spans.iter().any(|(_, s)| s.name == chat)
        },
        WAIT,
    );
    assert!(
        arrived,
        "the turn's spans did not arrive: {}\n--- collector log ---\n{}",
        receiver.store().tree().render(),
        collector.guard.stderr_text()
    );
    for (resource, span) in receiver.spans() {
        assert_eq!(
            resource.str_attr("hermes.shim.version"),
            Some(VERSION),
            "{}",
            span.name
        );
    }
    assert_eq!(
        collector.metric("hermes_collector_receiver_unknown_shim_version_streams_total"),
        0.0
    );
}
