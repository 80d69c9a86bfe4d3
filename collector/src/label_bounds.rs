//! The bounds of the derived metrics' labels (see `series.rs`, which
//! applies them), apart from the metrics code so that the configuration,
//! which sets them, compiles without it (the `config` fuzz target includes
//! `config.rs` and its modules on their own).

/// The bounds of the derived metrics' labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// Longest label value, in bytes.
    pub max_value_bytes: usize,
    /// Most distinct values per label and instrument.
    pub max_values: usize,
    /// Most label sets per instrument, the overflow series aside.
    pub max_series: usize,
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            max_value_bytes: 128,
            max_values: 100,
            max_series: 1000,
        }
    }
}
