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
