//! `sampling:`: tail sampling of whole turns, modelled on the OpenTelemetry
//! Collector's `tail_sampling` processor, and its conversion into the
//! sampler's [`SamplingSettings`](hermes_sampling::SamplingSettings).
//!
//! Owns: the policy keys, their checks (each error names its key, e.g.
//! `sampling.policies[2].percent`), and the mapping to
//! [`hermes_sampling::Rule`]s. Without the section every turn is kept.

use serde::Deserialize;

use crate::ConfigError;

/// Tail sampling: which turns (whole traces, subagents included) are
/// exported. A turn is kept when any policy keeps it; the first policy in
/// order that keeps it names itself in `hermes.sampling.policy`. The
/// derived metrics count every turn, kept or not. Without this section
/// every turn is kept.
#[derive(Debug, Clone, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SamplingConfig {
    /// The policies, in order; at least one.
    pub policies: Vec<PolicyConfig>,
    /// Most spans held until their turn is decided (a turn's spans are
    /// held until its root span closes); past it the oldest turn is
    /// decided with the spans it has.
    #[schemars(range(min = 1, max = MAX_HELD_SPANS))]
    pub max_held_spans: usize,
}

/// Upper bound of `sampling.max_held_spans`: about a gigabyte of spans.
const MAX_HELD_SPANS: usize = 10_000_000;

/// Longest policy name: it is a label value of `/metrics`.
const MAX_NAME_BYTES: usize = 64;

impl Default for SamplingConfig {
    fn default() -> Self {
        Self {
            policies: Vec::new(),
            max_held_spans: hermes_sampling::SamplingSettings::default().max_held_spans,
        }
    }
}

/// One sampling policy. `name` is required (except inside `and`): the
/// label of its metrics and the value of `hermes.sampling.policy`.
#[derive(Debug, Clone, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum PolicyConfig {
    /// Keeps a turn any of whose spans has status ERROR (a failed API
    /// attempt, tool, subagent or turn).
    StatusCode {
        #[serde(default)]
        name: String,
    },
    /// Keeps a turn lasting at least `threshold_ms` (its earliest span
    /// start to its latest span end).
    Latency {
        #[serde(default)]
        name: String,
        #[schemars(range(min = 1))]
        threshold_ms: u64,
    },
    /// Keeps a turn any of whose spans has the attribute `key` with a
    /// number from `min_value` to `max_value` (inclusive; at least one).
    NumericAttribute {
        #[serde(default)]
        name: String,
        key: String,
        #[serde(default)]
        min_value: Option<f64>,
        #[serde(default)]
        max_value: Option<f64>,
    },
    /// Keeps a turn any of whose spans has the attribute `key` with one of
    /// `values` (exact match).
    StringAttribute {
        #[serde(default)]
        name: String,
        key: String,
        values: Vec<String>,
    },
    /// Keeps `percent` of sessions, every turn of each: the session id is
    /// hashed with a fixed function, so every replica and restart agree.
    Probabilistic {
        #[serde(default)]
        name: String,
        #[schemars(range(min = 0.0, max = 100.0))]
        percent: f64,
    },
    /// Keeps at most `turns_per_second` turns a second of those no other
    /// policy keeps. Not inside `and`.
    RateLimiting {
        #[serde(default)]
        name: String,
        #[schemars(range(min = 1))]
        turns_per_second: u32,
    },
    /// Keeps a turn every one of `policies` keeps (their names are not
    /// needed).
    And {
        #[serde(default)]
        name: String,
        policies: Vec<PolicyConfig>,
    },
}

impl PolicyConfig {
    fn name(&self) -> &str {
        match self {
            Self::StatusCode { name }
            | Self::Latency { name, .. }
            | Self::NumericAttribute { name, .. }
            | Self::StringAttribute { name, .. }
            | Self::Probabilistic { name, .. }
            | Self::RateLimiting { name, .. }
            | Self::And { name, .. } => name,
        }
    }

    /// Checks the policy at `path`; `nested` inside an `and`.
    fn validate(&self, path: &str, nested: bool) -> Result<(), ConfigError> {
        let at = |key: &str| format!("{path}.{key}");
        match self {
            Self::StatusCode { .. } => {}
            Self::Latency { threshold_ms, .. } => {
                crate::positive(&at("threshold_ms"), *threshold_ms)?;
            }
            Self::NumericAttribute {
                key,
                min_value,
                max_value,
                ..
            } => {
                not_empty(&at("key"), key)?;
                for (k, v) in [("min_value", min_value), ("max_value", max_value)] {
                    if v.is_some_and(|v| !v.is_finite()) {
                        return Err(ConfigError::new(at(k), "must be a finite number"));
                    }
                }
                match (min_value, max_value) {
                    (None, None) => {
                        return Err(ConfigError::new(
                            at("min_value"),
                            "set min_value, max_value or both",
                        ));
                    }
                    (Some(min), Some(max)) if min > max => {
                        return Err(ConfigError::new(
                            at("max_value"),
                            format!("must not be below min_value ({min})"),
                        ));
                    }
                    _ => {}
                }
            }
            Self::StringAttribute { key, values, .. } => {
                not_empty(&at("key"), key)?;
                if values.is_empty() {
                    return Err(ConfigError::new(at("values"), "list at least one value"));
                }
            }
            Self::Probabilistic { percent, .. } => {
                if !(percent.is_finite() && *percent > 0.0 && *percent <= 100.0) {
                    return Err(ConfigError::new(
                        at("percent"),
                        format!("must be above 0 and at most 100, not {percent}"),
                    ));
                }
            }
            Self::RateLimiting {
                turns_per_second, ..
            } => {
                if nested {
                    return Err(ConfigError::new(
                        at("type"),
                        "rate_limiting cannot be part of `and` (it keeps what no other policy keeps)",
                    ));
                }
                crate::positive(&at("turns_per_second"), u64::from(*turns_per_second))?;
            }
            Self::And { policies, .. } => {
                if policies.is_empty() {
                    return Err(ConfigError::new(at("policies"), "list at least one policy"));
                }
                for (i, p) in policies.iter().enumerate() {
                    p.validate(&format!("{path}.policies[{i}]"), true)?;
                }
            }
        }
        Ok(())
    }

    /// The sampler's rule.
    fn rule(&self) -> hermes_sampling::Rule {
        use hermes_sampling::Rule;
        match self {
            Self::StatusCode { .. } => Rule::StatusCode,
            Self::Latency { threshold_ms, .. } => Rule::Latency {
                threshold_nanos: threshold_ms.saturating_mul(1_000_000),
            },
            Self::NumericAttribute {
                key,
                min_value,
                max_value,
                ..
            } => Rule::NumericAttribute {
                key: key.clone(),
                min: *min_value,
                max: *max_value,
            },
            Self::StringAttribute { key, values, .. } => Rule::StringAttribute {
                key: key.clone(),
                values: values.clone(),
            },
            Self::Probabilistic { percent, .. } => Rule::Probabilistic { percent: *percent },
            Self::RateLimiting {
                turns_per_second, ..
            } => Rule::RateLimiting {
                turns_per_second: *turns_per_second,
            },
            Self::And { policies, .. } => Rule::And(policies.iter().map(Self::rule).collect()),
        }
    }
}

fn not_empty(path: &str, value: &str) -> Result<(), ConfigError> {
    if value.is_empty() {
        Err(ConfigError::new(path, "must not be empty"))
    } else {
        Ok(())
    }
}

impl SamplingConfig {
    /// Checks every policy; errors name the key (`sampling.policies[2].percent`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.policies.is_empty() {
            return Err(ConfigError::new(
                "sampling.policies",
                "list at least one policy (without the sampling section every turn is kept)",
            ));
        }
        if !(1..=MAX_HELD_SPANS).contains(&self.max_held_spans) {
            return Err(ConfigError::new(
                "sampling.max_held_spans",
                format!("must be between 1 and {MAX_HELD_SPANS}"),
            ));
        }
        let mut names = std::collections::HashSet::new();
        for (i, policy) in self.policies.iter().enumerate() {
            let path = format!("sampling.policies[{i}]");
            let name = policy.name();
            if name.is_empty() || name.len() > MAX_NAME_BYTES {
                return Err(ConfigError::new(
                    format!("{path}.name"),
                    format!("give the policy a name of 1 to {MAX_NAME_BYTES} bytes"),
                ));
            }
            if !names.insert(name) {
                return Err(ConfigError::new(
                    format!("{path}.name"),
                    format!("`{name}` names another policy too"),
                ));
            }
            policy.validate(&path, false)?;
        }
        Ok(())
    }

    /// The policies of the `sampling` section of the configuration file at
    /// `path`, re-read for a live change (SIGHUP): checked as at startup;
    /// a file without the section keeps every turn (no policies). Other
    /// sections are parsed but not applied.
    pub fn policies_from_file(
        path: &std::path::Path,
    ) -> Result<Vec<hermes_sampling::Policy>, ConfigError> {
        match crate::Config::parse_file(path)?.sampling {
            Some(sampling) => sampling.validate().map(|()| sampling.policies()),
            None => Ok(Vec::new()),
        }
    }

    /// The sampler's policies, in order.
    pub fn policies(&self) -> Vec<hermes_sampling::Policy> {
        self.policies
            .iter()
            .map(|p| hermes_sampling::Policy {
                name: p.name().to_owned(),
                rule: p.rule(),
            })
            .collect()
    }
}
