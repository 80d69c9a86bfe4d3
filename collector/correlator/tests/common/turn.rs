//! The turn of the correlator's rule tests (correlator.rs, closing.rs): its
//! session, turn and API request ids, as Hermes 0.19.0 names them, and the
//! attempts of its calls to a local OpenAI-compatible server.

use hermes_e2e::events::{self, with_api, with_call};
use hermes_proto::v1;

pub const SESSION: &str = "20261129_200230_bbf019";
pub const TURN: &str = "20261129_200230_bbf019:task-1:1b06e77d";
pub const API1: &str = "20261129_200230_bbf019:task-1:1b06e77d:api:1";
pub const API2: &str = "20261129_200230_bbf019:task-1:1b06e77d:api:2";

/// The ids of an event of `turn` in [`SESSION`].
pub fn ids(turn: &str) -> v1::Ids {
    events::ids(SESSION, "task-1", turn)
}

/// The ids of tool call `call` of `turn`, asked by [`API1`].
pub fn tool_ids(turn: &str, call: &str) -> v1::Ids {
    with_call(with_api(ids(turn), API1), call)
}

/// The ids of API request `api_request_id` of [`TURN`].
pub fn api_ids(api_request_id: &str) -> v1::Ids {
    with_api(ids(TURN), api_request_id)
}

/// Attempt `attempt` of a chat call, started and ended (0: not yet) at
/// these offsets from the events' clock.
pub fn api(attempt: u32, started_ms: u64, ended_ms: u64) -> v1::ApiCall {
    v1::ApiCall {
        platform: "cli".into(),
        provider: "custom".into(),
        base_url: "http://127.0.0.1:45501/v1".into(),
        api_call_count: 1,
        ..events::api_call("fake-model-1", attempt, started_ms, ended_ms)
    }
}

/// `call` failed with HTTP `status_code` for `reason`.
pub fn failed(call: v1::ApiCall, status_code: i32, reason: &str) -> v1::ApiCall {
    v1::ApiCall {
        status_code: Some(status_code),
        reason: reason.into(),
        ..call
    }
}

/// `call`, which Hermes judged `retryable` or not.
pub fn with_retryable(call: v1::ApiCall, retryable: bool) -> v1::ApiCall {
    v1::ApiCall {
        retryable: Some(retryable),
        ..call
    }
}

/// The events of the rule tests' turn, one call each.
impl super::Feed {
    /// A feed in which [`TURN`] has started (`pre_llm_call` at 0 ms).
    pub fn in_turn() -> Self {
        let mut f = Self::new();
        f.turn_start(0, TURN);
        f
    }

    /// `pre_llm_call` of `turn`.
    pub fn turn_start(&mut self, t_ms: u64, turn: &str) {
        self.ev("pre_llm_call", t_ms, ids(turn), events::turn_body());
    }

    /// `post_llm_call` of `turn`.
    pub fn turn_end(&mut self, t_ms: u64, turn: &str) {
        self.ev("post_llm_call", t_ms, ids(turn), events::turn_body());
    }

    /// `on_session_end` of `turn`, the turn `completed` or `interrupted`.
    pub fn session_end(&mut self, t_ms: u64, turn: &str, completed: bool, interrupted: bool) {
        let body = events::end_body(completed, interrupted);
        self.ev("on_session_end", t_ms, ids(turn), body);
    }

    /// `pre_tool_call` of tool `name`, call `call` of `turn`.
    pub fn tool_start(&mut self, t_ms: u64, turn: &str, call: &str, name: &str) {
        self.ev(
            "pre_tool_call",
            t_ms,
            tool_ids(turn, call),
            events::tool(name),
        );
    }

    /// `post_tool_call` of tool `name`, call `call` of `turn`, ended with
    /// `status` after `duration_ms`.
    pub fn tool_end(
        &mut self,
        t_ms: u64,
        turn: &str,
        call: &str,
        name: &str,
        status: &str,
        duration_ms: Option<u64>,
    ) {
        let body = events::tool_done(name, status, duration_ms);
        self.ev("post_tool_call", t_ms, tool_ids(turn, call), body);
    }

    /// `pre_api_request` of attempt `attempt` of API request
    /// `api_request_id`, started at `started_ms`.
    pub fn api_start(&mut self, t_ms: u64, api_request_id: &str, attempt: u32, started_ms: u64) {
        let body = events::api_body(api(attempt, started_ms, 0));
        self.ev("pre_api_request", t_ms, api_ids(api_request_id), body);
    }

    /// `post_api_request` of API request `api_request_id`, ending `call`.
    pub fn api_done(&mut self, t_ms: u64, api_request_id: &str, call: v1::ApiCall) {
        let body = events::api_body(call);
        self.ev("post_api_request", t_ms, api_ids(api_request_id), body);
    }

    /// `api_request_error` of API request `api_request_id`, failing `call`.
    pub fn api_error(&mut self, t_ms: u64, api_request_id: &str, call: v1::ApiCall) {
        let body = events::api_body(call);
        self.ev("api_request_error", t_ms, api_ids(api_request_id), body);
    }
}
