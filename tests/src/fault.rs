//! Support for the fault tests (`tests/tests/fault_*.rs`): metrics in the
//! admin exposition, the load generator, and the span-id sets
//! `hermes-loadgen --expect-spans` writes. The collector process itself is
//! [`crate::collector::Collector`].
//!
//! Everything listens on 127.0.0.1 and every wait is bounded.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use opentelemetry_proto::tonic::trace::v1::Span;

use crate::otlp_receiver::ReceivedExport;
use crate::span_tree::hex;
use crate::{ChildGuard, RunOutput, cargo_bin, run_with_timeout};

/// The sum of every sample of `name` in a Prometheus text exposition.
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next())
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .sum()
}

/// Runs `hermes-loadgen ARGS…` to completion, bounded by `timeout`.
pub fn run_loadgen(args: &[&str], timeout: Duration) -> RunOutput {
    let mut cmd = Command::new(cargo_bin("hermes-loadgen", "hermes-loadgen"));
    cmd.args(args).env("RUST_BACKTRACE", "0");
    run_with_timeout(&mut cmd, timeout)
}

/// Starts `hermes-loadgen ARGS…` in the background, its output captured;
/// killed on drop.
pub fn spawn_loadgen(args: &[&str]) -> ChildGuard {
    let mut cmd = Command::new(cargo_bin("hermes-loadgen", "hermes-loadgen"));
    cmd.args(args)
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    ChildGuard::spawn_named("hermes-loadgen", &mut cmd)
        .unwrap_or_else(|e| panic!("spawn hermes-loadgen: {e}"))
}

/// The JSON summary line of a loadgen run.
pub fn loadgen_summary(out: &RunOutput) -> serde_json::Value {
    out.stdout()
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no loadgen summary:\n{}", out.describe()))
}

/// `trace_id/span_id` in hex, as `hermes-loadgen --expect-spans` writes.
pub fn span_key(span: &Span) -> String {
    format!("{}/{}", hex(&span.trace_id), hex(&span.span_id))
}

/// The span keys of an `--expect-spans` file.
pub fn read_span_keys(path: &Path) -> BTreeSet<String> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect()
}

/// Fails unless every key of `expected` is in `got`, naming a few missing
/// ones, with `context` (the collectors' logs).
pub fn assert_all_arrived(expected: &BTreeSet<String>, got: &BTreeSet<String>, context: &str) {
    let missing: Vec<_> = expected.difference(got).take(10).collect();
    assert!(
        missing.is_empty(),
        "{} of {} spans missing, e.g. {missing:?}\n{context}",
        expected.difference(got).count(),
        expected.len(),
    );
}

/// The span keys of every span in `exports`, with how often each occurs.
pub fn export_span_counts(exports: &[ReceivedExport]) -> std::collections::BTreeMap<String, usize> {
    let mut counts = std::collections::BTreeMap::new();
    for export in exports {
        for rs in &export.request.resource_spans {
            for ss in &rs.scope_spans {
                for span in &ss.spans {
                    *counts.entry(span_key(span)).or_insert(0) += 1;
                }
            }
        }
    }
    counts
}

/// The spool files (`*.spool`) in `dir`.
pub fn spool_files(dir: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.to_string_lossy().ends_with(".spool"))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_a_metric_over_its_labels() {
        let text = "# HELP x_total help\n# TYPE x_total counter\n\
                    x_total{exporter=\"a\"} 3\nx_total{exporter=\"b\"} 4\n\
                    x_total_other 100\nx_total 1\n";
        assert_eq!(metric_sum(text, "x_total"), 8.0);
        assert_eq!(metric_sum(text, "missing_total"), 0.0);
    }
}
