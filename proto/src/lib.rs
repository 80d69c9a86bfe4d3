//! The `hermes.collector.v1` wire contract: the shim streams [`v1::EventBatch`]es
//! to the collector's [`server::event_ingest_server::EventIngest`] service and
//! receives [`v1::Ack`]s. See `docs/PROTOCOL.md`.

pub mod codec;
mod utf8;
pub mod view;
pub mod wire;

/// The gRPC package of this release of the wire protocol: the collector
/// refuses calls to any other release of it, and the shim names it when a
/// collector refuses this one (docs/PROTOCOL.md, "Versioning").
pub const WIRE_PACKAGE: &str = "hermes.collector.v1";

/// Generated from `proto/hermes/collector/v1/ingest.proto`: the messages
/// and the client, which uses [`codec::SliceCodec`].
#[allow(clippy::all, missing_docs)]
pub mod v1 {
    tonic::include_proto!("hermes.collector.v1");
}

/// Generated from the same file: the server, which uses
/// [`codec::WireCodec`] and receives each `EventBatch` as a
/// [`wire::WireBatch`].
#[allow(clippy::all, missing_docs)]
pub mod server {
    include!(concat!(env!("OUT_DIR"), "/server/hermes.collector.v1.rs"));
}

/// The hook names of hermes-agent 0.19.0's observer contract.
pub mod hooks {
    pub const ON_SESSION_START: &str = "on_session_start";
    pub const ON_SESSION_END: &str = "on_session_end";
    pub const ON_SESSION_FINALIZE: &str = "on_session_finalize";
    pub const ON_SESSION_RESET: &str = "on_session_reset";
    pub const PRE_LLM_CALL: &str = "pre_llm_call";
    pub const POST_LLM_CALL: &str = "post_llm_call";
    pub const PRE_API_REQUEST: &str = "pre_api_request";
    pub const POST_API_REQUEST: &str = "post_api_request";
    pub const API_REQUEST_ERROR: &str = "api_request_error";
    pub const PRE_TOOL_CALL: &str = "pre_tool_call";
    pub const POST_TOOL_CALL: &str = "post_tool_call";
    pub const SUBAGENT_START: &str = "subagent_start";
    pub const SUBAGENT_STOP: &str = "subagent_stop";
    pub const PRE_APPROVAL_REQUEST: &str = "pre_approval_request";
    pub const POST_APPROVAL_RESPONSE: &str = "post_approval_response";

    /// Not a Hermes hook: the shim's last event before its process ends
    /// (after every hook the agent fired), so the collector knows that
    /// whatever of that agent is still open was cut off by the exit. The
    /// dot keeps it apart from every Hermes hook name.
    pub const PROCESS_EXIT: &str = "hermes_collector.process_exit";

    /// Every observer hook of Hermes 0.19.0 the collector understands.
    pub const ALL: [&str; 15] = [
        ON_SESSION_START,
        ON_SESSION_END,
        ON_SESSION_FINALIZE,
        ON_SESSION_RESET,
        PRE_LLM_CALL,
        POST_LLM_CALL,
        PRE_API_REQUEST,
        POST_API_REQUEST,
        API_REQUEST_ERROR,
        PRE_TOOL_CALL,
        POST_TOOL_CALL,
        SUBAGENT_START,
        SUBAGENT_STOP,
        PRE_APPROVAL_REQUEST,
        POST_APPROVAL_RESPONSE,
    ];
}
