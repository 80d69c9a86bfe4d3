//! What the criterion benches share.

use std::time::Duration;

use criterion::Criterion;

/// Short warm-up and measurement: the suite runs in ~2.5 minutes
/// (`benches/run.sh`); command-line flags override these.
pub fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(50)
        .configure_from_args()
}
