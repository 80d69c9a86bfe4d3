//! Content attributes: the prompts, answers, tool arguments and results the
//! shim sends at capture level `content` (`Event.content`, JSON text per
//! kwarg), mapped to the GenAI semantic conventions' message format.
//!
//! Only ever called for events that carry content; at the default level the
//! maps are empty and nothing here runs. Values are exported as JSON text;
//! cutting them to `max_attribute_bytes` and redaction happen later, in the
//! span processor, on every attribute alike.
//!
//! Message format (`gen_ai.input.messages`, `gen_ai.output.messages`): an
//! array of `{"role", "parts": [...]}` with parts `{"type":"text","content"}`,
//! `{"type":"tool_call","id","name","arguments"}` and
//! `{"type":"tool_call_response","id","response"}`; system messages go to
//! `gen_ai.system_instructions` as an array of text parts.

use serde_json::{Value, json};

/// Content keys of `Event.content`.
pub const USER_MESSAGE: &str = "user_message";
pub const ASSISTANT_RESPONSE: &str = "assistant_response";
pub const ARGS: &str = "args";
pub const RESULT: &str = "result";
pub const REQUEST: &str = "request";
pub const RESPONSE: &str = "response";

/// The chat input of a sanitized `request` (`{method, body: {messages}}`):
/// `(gen_ai.input.messages, gen_ai.system_instructions)`.
pub fn chat_input(request_json: &str) -> (Option<String>, Option<String>) {
    let Ok(request) = serde_json::from_str::<Value>(request_json) else {
        return (None, None);
    };
    let Some(messages) = request.pointer("/body/messages").and_then(Value::as_array) else {
        return (None, None);
    };
    let mut system = Vec::new();
    let mut input = Vec::new();
    for m in messages {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("user");
        if role == "system" || role == "developer" {
            system.extend(text_parts(m.get("content")));
            continue;
        }
        input.push(message(role, m));
    }
    let encode = |v: Vec<Value>| (!v.is_empty()).then(|| Value::Array(v).to_string());
    (encode(input), encode(system))
}

/// The chat output of a sanitized `response` (`{assistant_message,
/// finish_reason}`): `gen_ai.output.messages`.
pub fn chat_output(response_json: &str) -> Option<String> {
    let response = serde_json::from_str::<Value>(response_json).ok()?;
    let assistant = response.get("assistant_message")?;
    let mut msg = message("assistant", assistant);
    if let Some(reason) = response.get("finish_reason").and_then(Value::as_str) {
        msg["finish_reason"] = Value::String(reason.to_owned());
    }
    Some(Value::Array(vec![msg]).to_string())
}

/// A JSON-encoded string kwarg (`user_message`, `assistant_response`,
/// `result`) as plain text; other JSON values as their JSON text.
pub fn text(json_text: &str) -> String {
    match serde_json::from_str::<Value>(json_text) {
        Ok(Value::String(s)) => s,
        _ => json_text.to_owned(),
    }
}

fn message(role: &str, m: &Value) -> Value {
    let mut parts: Vec<Value> = if role == "tool" {
        let id = m.get("tool_call_id").cloned().unwrap_or(Value::Null);
        vec![
            json!({"type": "tool_call_response", "id": id, "response": m.get("content").cloned().unwrap_or(Value::Null)}),
        ]
    } else {
        text_parts(m.get("content"))
    };
    if let Some(calls) = m.get("tool_calls").and_then(Value::as_array) {
        for call in calls {
            // OpenAI shape {id, function: {name, arguments}} or Hermes' flat {id, name, arguments}.
            let function = call.get("function").unwrap_or(call);
            let arguments = function.get("arguments").cloned().unwrap_or(Value::Null);
            let arguments = match arguments {
                Value::String(s) => serde_json::from_str(&s).unwrap_or(Value::String(s)),
                other => other,
            };
            parts.push(json!({
                "type": "tool_call",
                "id": call.get("id").cloned().unwrap_or(Value::Null),
                "name": function.get("name").cloned().unwrap_or(Value::Null),
                "arguments": arguments,
            }));
        }
    }
    json!({"role": role, "parts": parts})
}

fn text_parts(content: Option<&Value>) -> Vec<Value> {
    match content {
        Some(Value::String(s)) if !s.is_empty() => vec![json!({"type": "text", "content": s})],
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(|item| match item.get("text").and_then(Value::as_str) {
                Some(t) => Some(json!({"type": "text", "content": t})),
                None => (!item.is_null()).then(|| item.clone()),
            })
            .collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_messages_become_semconv_messages() {
        let request = json!({"method": "POST", "body": {"model": "m", "messages": [
            {"role": "system", "content": "You are Hermes."},
            {"role": "user", "content": "run echo"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "terminal", "arguments": "{\"command\":\"echo\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "{\"output\":\"\"}"}
        ]}});
        let (input, system) = chat_input(&request.to_string());
        let input: Value = serde_json::from_str(&input.unwrap()).unwrap();
        let system: Value = serde_json::from_str(&system.unwrap()).unwrap();
        assert_eq!(
            system,
            json!([{"type": "text", "content": "You are Hermes."}])
        );
        assert_eq!(
            input[0],
            json!({"role": "user", "parts": [{"type": "text", "content": "run echo"}]})
        );
        assert_eq!(
            input[1]["parts"][0],
            json!({"type": "tool_call", "id": "c1", "name": "terminal", "arguments": {"command": "echo"}})
        );
        assert_eq!(input[2]["parts"][0]["type"], "tool_call_response");
        assert_eq!(input[2]["parts"][0]["id"], "c1");
    }

    #[test]
    fn response_becomes_output_message() {
        let response = json!({"model": "m", "finish_reason": "stop",
            "assistant_message": {"role": "assistant", "content": "done", "tool_calls": []}});
        let out: Value =
            serde_json::from_str(&chat_output(&response.to_string()).unwrap()).unwrap();
        assert_eq!(
            out,
            json!([{"role": "assistant", "parts": [{"type": "text", "content": "done"}], "finish_reason": "stop"}])
        );
    }

    #[test]
    fn truncated_or_foreign_payloads_are_skipped() {
        assert_eq!(chat_input("{\"_truncated\": true}"), (None, None));
        assert_eq!(chat_input("not json"), (None, None));
        assert_eq!(chat_output("{}"), None);
        assert_eq!(text("\"hi\""), "hi");
        assert_eq!(text("{\"a\":1}"), "{\"a\":1}");
    }
}
