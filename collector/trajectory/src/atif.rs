//! The ATIF document this crate writes: the subset of ATIF v1.8's models
//! (the `atif` package's `Trajectory`, `Agent`, `Step`, `ToolCall`,
//! `Observation`, `ObservationResult`, `Metrics`, `FinalMetrics`,
//! `SubagentTrajectoryRef`) that a Hermes session fills. Every field the
//! collector cannot know is left out of the JSON (`None` is skipped), since
//! the models forbid unknown keys but accept every optional one absent.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use serde_with::skip_serializing_none;

/// The schema tag every written trajectory carries.
pub const SCHEMA_VERSION: &str = "ATIF-v1.8";

/// The root document (`Trajectory`).
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trajectory {
    pub schema_version: String,
    pub session_id: Option<String>,
    pub trajectory_id: Option<String>,
    pub agent: Agent,
    pub steps: Vec<Step>,
    pub notes: Option<String>,
    pub final_metrics: Option<FinalMetrics>,
    pub continued_trajectory_ref: Option<String>,
    pub extra: Option<Map<String, Value>>,
    pub subagent_trajectories: Option<Vec<Trajectory>>,
}

/// The agent system (`Agent`).
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Agent {
    pub name: String,
    pub version: String,
    pub model_name: Option<String>,
    pub extra: Option<Map<String, Value>>,
}

/// Who produced a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    System,
    User,
    Agent,
}

/// One step (`Step`): a user message, or one model response with its tool
/// calls and their results.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    pub step_id: u64,
    pub timestamp: Option<String>,
    pub source: Source,
    pub model_name: Option<String>,
    pub message: String,
    pub tool_calls: Option<Vec<ToolCall>>,
    pub observation: Option<Observation>,
    pub metrics: Option<Metrics>,
    pub extra: Option<Map<String, Value>>,
    pub llm_call_count: Option<u64>,
}

/// One tool call of an agent step (`ToolCall`).
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub tool_call_id: String,
    pub function_name: String,
    /// A JSON object (ATIF requires one; `{}` when there are none).
    pub arguments: Map<String, Value>,
    pub extra: Option<Map<String, Value>>,
}

/// The results a step's tool calls returned (`Observation`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    pub results: Vec<ObservationResult>,
}

/// One tool call's result (`ObservationResult`).
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ObservationResult {
    pub source_call_id: Option<String>,
    pub content: Option<String>,
    pub subagent_trajectory_ref: Option<Vec<SubagentTrajectoryRef>>,
    pub extra: Option<Map<String, Value>>,
}

/// A link to an embedded subagent trajectory (`SubagentTrajectoryRef`).
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubagentTrajectoryRef {
    pub trajectory_id: Option<String>,
    pub session_id: Option<String>,
}

/// Token counts of one step (`Metrics`).
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    pub prompt_tokens: Option<i64>,
    pub completion_tokens: Option<i64>,
    pub cached_tokens: Option<i64>,
    pub extra: Option<Map<String, Value>>,
}

/// Totals of a trajectory (`FinalMetrics`).
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FinalMetrics {
    pub total_prompt_tokens: Option<i64>,
    pub total_completion_tokens: Option<i64>,
    pub total_cached_tokens: Option<i64>,
    pub total_steps: Option<u64>,
}
