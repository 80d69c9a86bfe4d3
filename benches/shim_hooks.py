"""The hooks the shim registers at capture level `metadata`.

One list for the Python benchmarks (hook_cost.py times each of them,
session_cost.py's `noop` variant registers the same set). It is the shim's
own `hermes_collector_shim::config::METADATA_HOOKS`, written out because the
benchmarks also run without the shim installed; the `hermes-benches` unit
test `python_benches_list_the_shims_metadata_hooks` keeps the two equal.
"""

METADATA_HOOKS = [
    "on_session_start",
    "on_session_end",
    "on_session_finalize",
    "on_session_reset",
    "pre_llm_call",
    "post_llm_call",
    "pre_api_request",
    "post_api_request",
    "api_request_error",
    "pre_tool_call",
    "post_tool_call",
    "subagent_start",
    "subagent_stop",
    "pre_approval_request",
    "post_approval_response",
]
