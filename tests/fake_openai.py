#!/usr/bin/env python3
"""Scripted OpenAI-compatible chat completions server for end-to-end tests.

Python standard library only.

Usage:
    fake_openai.py SCRIPT.json [--log REQUESTS.jsonl] [--model NAME] [--max-seconds N]

The server listens on 127.0.0.1 with an OS-chosen port and prints
``PORT <n>`` as the first line of stdout (flushed) once it accepts
connections.

SCRIPT.json is either a list of entries or an object
``{"model": "...", "responses": [...], "aux_content": "..."}``.
Each entry answers one *main-conversation* chat completion request, in order:

    {"tool_calls": [{"name": "terminal", "arguments": {"command": "echo hi"}}],
     "usage": {...}}
    {"content": "final text", "usage": {...}}
    {"error": 500}            (or 429, 400, ...: HTTP error, OpenAI-style body)

Optional keys of an entry: ``delay_ms`` (sleep before answering),
``finish_reason`` (override), ``model`` (response model), ``id`` inside a
tool call (override the generated ``call_<n>``), ``retry_after`` on an error
entry (``Retry-After`` header value), ``message`` on an error entry, and
``only_if``: a text the request's first user message must contain for the
entry to answer it (for agents whose requests race, e.g. a background
subagent and its parent). A request takes the first unused entry it may;
entries without ``only_if`` are taken in order as before.

``usage`` may give ``prompt_tokens``, ``completion_tokens``, ``total_tokens``,
``cached_tokens`` / ``prompt_tokens_details.cached_tokens`` and
``reasoning_tokens`` / ``completion_tokens_details.reasoning_tokens``; missing
values get defaults (prompt 100, completion 20, total = sum, details 0).

When the script is exhausted the last ``content`` entry is repeated (or a
fixed text if the script has none).

Hermes 0.19.0 retries a failed main request itself (the OpenAI SDK's own
retries are off): after a 5xx with a jittered backoff of 2 s and more, after
a 429 with the ``Retry-After`` header when there is one (a value of 0 counts
as none), so ``{"error": 429, "retry_after": 0.1}`` keeps tests fast. Each
attempt consumes one entry.

Besides chat completions Hermes probes the server for model metadata
(``GET /api/v1/models``, ``/api/tags``, ``/v1/props``, ``/props``,
``/version``: answered 404, as a plain OpenAI server would; and
``GET /v1/models``: answered with the model). They are logged as "other".

Auxiliary requests that Hermes makes besides the main conversation (session
title generation, context compression, smart approval, background memory/skill
review, curator) are recognised by their shape (non-streaming without tools)
or by their known prompts (see ``classify``) and answered with a fixed short
text (``aux_content``) without consuming script entries.

Every request is appended as one JSON line to the log file (``--log`` or the
``FAKE_OPENAI_LOG`` environment variable):
    {"seq", "time", "method", "path", "kind": "main"|"aux"|"other",
     "script_index": int|null, "status", "stream", "body"}

The server exits when its stdin reaches EOF (the parent test process died;
pass ``--no-stdin-watch`` to run it by hand with stdin closed) or after
``--max-seconds`` (default 3600), so it never outlives a test run.
"""

import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DEFAULT_MODEL = "fake-model"
DEFAULT_AUX_CONTENT = "Scripted Test Session"
DEFAULT_FINAL_CONTENT = "(fake_openai: script exhausted)"

# Prompt fragments of Hermes 0.19.0 auxiliary LLM calls (lower case).
# Matched against the start of the system prompt ...
AUX_SYSTEM_PREFIXES = (
    "generate a short, descriptive title",  # agent/title_generator.py
    "you are a security reviewer",  # tools/approval.py (smart approvals)
)
# ... and against the start of the first and last user messages.
AUX_USER_PREFIXES = (
    "review the conversation above",  # agent/background_review.py (memory/skill review fork)
    "you are running as hermes' background skill curator",  # agent/curator.py
    "create a structured checkpoint summary",  # agent/context_compressor.py
)
AUX_USER_FRAGMENTS = ("turns to summarize:",)  # agent/context_compressor.py


def _error_body(status, message):
    kinds = {
        400: ("invalid_request_error", "invalid_request"),
        401: ("authentication_error", "invalid_api_key"),
        403: ("permission_error", "forbidden"),
        404: ("not_found_error", "model_not_found"),
        429: ("rate_limit_error", "rate_limit_exceeded"),
        500: ("server_error", "internal_error"),
        502: ("server_error", "bad_gateway"),
        503: ("server_error", "overloaded"),
    }
    etype, code = kinds.get(status, ("server_error", "error"))
    return {
        "error": {
            "message": message or f"fake_openai scripted error {status}",
            "type": etype,
            "param": None,
            "code": code,
        }
    }


def _usage(spec):
    spec = dict(spec or {})
    prompt = int(spec.get("prompt_tokens", 100))
    completion = int(spec.get("completion_tokens", 20))
    total = int(spec.get("total_tokens", prompt + completion))
    cached = spec.get("cached_tokens")
    if cached is None:
        cached = (spec.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    reasoning = spec.get("reasoning_tokens")
    if reasoning is None:
        reasoning = (spec.get("completion_tokens_details") or {}).get("reasoning_tokens", 0)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": total,
        "prompt_tokens_details": {"cached_tokens": int(cached)},
        "completion_tokens_details": {"reasoning_tokens": int(reasoning)},
    }


def _text_of(content):
    """Flatten an OpenAI message content (str or list of parts) to text."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "\n".join(parts)
    return ""


def classify(body):
    """Return "main" for a main-conversation request, "aux" otherwise.

    Hermes 0.19.0 main-conversation requests always stream (``stream: true``,
    ``stream_options.include_usage``) and carry the tool schemas. Auxiliary
    calls made through ``agent.auxiliary_client.call_llm`` (title generation,
    compression, smart approval, ...) are non-streaming and carry no tools.
    The background memory/skill review and the curator fork a whole AIAgent
    (streaming, with tools), so they are recognised by their prompts.
    """
    if not isinstance(body, dict):
        return "aux"
    messages = [m for m in (body.get("messages") or []) if isinstance(m, dict)]
    system = ""
    for msg in messages:
        if msg.get("role") in ("system", "developer"):
            system = _text_of(msg.get("content")).strip().lower()
            break
    if system.startswith(AUX_SYSTEM_PREFIXES):
        return "aux"
    users = [_text_of(m.get("content")).strip().lower() for m in messages if m.get("role") == "user"]
    for text in users[:1] + users[-1:]:
        if text.startswith(AUX_USER_PREFIXES) or any(f in text[:4000] for f in AUX_USER_FRAGMENTS):
            return "aux"
    if not body.get("stream") and not body.get("tools"):
        return "aux"
    return "main"


class Script:
    def __init__(self, spec, default_model, aux_content):
        if isinstance(spec, dict):
            entries = spec.get("responses", [])
            self.model = spec.get("model", default_model)
            self.aux_content = spec.get("aux_content", aux_content)
        else:
            entries = spec
            self.model = default_model
            self.aux_content = aux_content
        if not isinstance(entries, list):
            raise SystemExit("script must be a list of entries")
        self.entries = entries
        self.used = set()
        self.next_call = 1
        self.next_completion = 1
        self.seq = 0
        self.lock = threading.Lock()

    def take(self, body=None):
        """Return (index, entry) of the next main-conversation answer."""
        with self.lock:
            first_user = ""
            for msg in (body or {}).get("messages") or [] if isinstance(body, dict) else []:
                if isinstance(msg, dict) and msg.get("role") == "user":
                    first_user = _text_of(msg.get("content"))
                    break
            for idx in range(len(self.entries)):
                if idx in self.used:
                    continue
                entry = self.entries[idx]
                wanted = entry.get("only_if") if isinstance(entry, dict) else None
                if wanted is None or wanted in first_user:
                    self.used.add(idx)
                    return idx, entry
            for idx in range(len(self.entries) - 1, -1, -1):
                entry = self.entries[idx]
                if isinstance(entry, dict) and "content" in entry and "error" not in entry:
                    if not entry.get("tool_calls"):
                        return idx, entry
            return None, {"content": DEFAULT_FINAL_CONTENT}

    def call_id(self):
        with self.lock:
            n = self.next_call
            self.next_call += 1
            return f"call_{n}"

    def completion_id(self):
        with self.lock:
            n = self.next_completion
            self.next_completion += 1
            return f"chatcmpl-fake-{n}"

    def next_seq(self):
        with self.lock:
            self.seq += 1
            return self.seq


class Log:
    def __init__(self, path):
        self.path = path
        self.lock = threading.Lock()
        if path:
            # Truncate: one log per server run.
            with open(path, "w", encoding="utf-8"):
                pass

    def write(self, record):
        if not self.path:
            return
        line = json.dumps(record, sort_keys=True)
        with self.lock:
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(line + "\n")
                fh.flush()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fake-openai/1"

    # Quiet: the default logs every request to stderr.
    def log_message(self, fmt, *args):  # noqa: D401
        if os.environ.get("FAKE_OPENAI_VERBOSE"):
            sys.stderr.write("fake_openai: " + (fmt % args) + "\n")

    @property
    def script(self):
        return self.server.script

    def _record(self, kind, body, status, idx=None, stream=None):
        self.server.log.write(
            {
                "seq": self.script.next_seq(),
                "time": time.time(),
                "method": self.command,
                "path": self.path,
                "kind": kind,
                "script_index": idx,
                "status": status,
                "stream": stream,
                "body": body,
            }
        )

    def _send_json(self, status, obj, headers=None):
        data = json.dumps(obj).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def _read_body(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length > 0 else b""
        if not raw:
            return None
        try:
            return json.loads(raw.decode("utf-8"))
        except ValueError:
            return {"_unparsed": raw.decode("utf-8", "replace")}

    def do_GET(self):
        path = self.path.split("?", 1)[0].rstrip("/")
        if path in ("/v1/models", "/models"):
            self._record("other", None, 200)
            self._send_json(
                200,
                {
                    "object": "list",
                    "data": [
                        {
                            "id": self.script.model,
                            "object": "model",
                            "created": 1700000000,
                            "owned_by": "fake-openai",
                            "context_length": 128000,
                        }
                    ],
                },
            )
            return
        if path.startswith("/v1/models/") or path.startswith("/models/"):
            model = path.rsplit("/", 1)[1]
            self._record("other", None, 200)
            self._send_json(
                200,
                {
                    "id": model,
                    "object": "model",
                    "created": 1700000000,
                    "owned_by": "fake-openai",
                    "context_length": 128000,
                },
            )
            return
        if path in ("", "/health", "/v1"):
            self._record("other", None, 200)
            self._send_json(200, {"status": "ok"})
            return
        self._record("other", None, 404)
        self._send_json(404, _error_body(404, f"no route GET {self.path}"))

    def do_POST(self):
        path = self.path.split("?", 1)[0].rstrip("/")
        body = self._read_body()
        if path not in ("/v1/chat/completions", "/chat/completions"):
            self._record("other", body, 404)
            self._send_json(404, _error_body(404, f"no route POST {self.path}"))
            return
        stream = bool(isinstance(body, dict) and body.get("stream"))
        include_usage = bool(
            isinstance(body, dict) and (body.get("stream_options") or {}).get("include_usage")
        )
        kind = classify(body)
        if kind == "aux":
            self._record("aux", body, 200, None, stream)
            entry = {"content": self.script.aux_content, "usage": {"prompt_tokens": 50, "completion_tokens": 5}}
            self._answer(entry, stream, include_usage)
            return
        idx, entry = self.script.take(body)
        if not isinstance(entry, dict):
            entry = {"content": str(entry)}
        status = int(entry["error"]) if "error" in entry else 200
        self._record("main", body, status, idx, stream)
        delay = entry.get("delay_ms")
        if delay:
            time.sleep(min(float(delay), 600_000.0) / 1000.0)
        if "error" in entry:
            headers = {}
            if "retry_after" in entry:
                headers["Retry-After"] = str(entry["retry_after"])
            self._send_json(status, _error_body(status, entry.get("message")), headers)
            return
        self._answer(entry, stream, include_usage)

    # -- answers -----------------------------------------------------------

    def _tool_calls(self, entry):
        calls = []
        for call in entry.get("tool_calls") or []:
            args = call.get("arguments", {})
            if not isinstance(args, str):
                args = json.dumps(args)
            calls.append(
                {
                    "id": call.get("id") or self.script.call_id(),
                    "type": "function",
                    "function": {"name": call["name"], "arguments": args},
                }
            )
        return calls

    def _answer(self, entry, stream, include_usage):
        model = entry.get("model", self.script.model)
        content = entry.get("content")
        calls = self._tool_calls(entry)
        finish = entry.get("finish_reason") or ("tool_calls" if calls else "stop")
        usage = _usage(entry.get("usage"))
        cid = self.script.completion_id()
        created = int(time.time())
        if not stream:
            message = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"] = calls
            self._send_json(
                200,
                {
                    "id": cid,
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "choices": [
                        {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
                    ],
                    "usage": usage,
                },
            )
            return

        def chunk(delta, finish_reason=None, usage_obj=None, no_choices=False):
            obj = {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": []
                if no_choices
                else [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}],
            }
            if include_usage:
                obj["usage"] = usage_obj
            return obj

        events = [chunk({"role": "assistant", "content": ""})]
        if content:
            # Two pieces, so clients really have to concatenate deltas.
            half = max(1, len(content) // 2)
            events.append(chunk({"content": content[:half]}))
            if content[half:]:
                events.append(chunk({"content": content[half:]}))
        for i, call in enumerate(calls):
            events.append(
                chunk(
                    {
                        "tool_calls": [
                            {
                                "index": i,
                                "id": call["id"],
                                "type": "function",
                                "function": {"name": call["function"]["name"], "arguments": ""},
                            }
                        ]
                    }
                )
            )
            events.append(
                chunk({"tool_calls": [{"index": i, "function": {"arguments": call["function"]["arguments"]}}]})
            )
        events.append(chunk({}, finish))
        if include_usage:
            events.append(chunk(None, usage_obj=usage, no_choices=True))

        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for event in events:
                self._write_chunk(b"data: " + json.dumps(event).encode("utf-8") + b"\n\n")
            self._write_chunk(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _write_chunk(self, data):
        self.wfile.write(b"%x\r\n" % len(data) + data + b"\r\n")
        self.wfile.flush()


def _watch_stdin(server):
    """Shut down when the parent closes our stdin (or dies)."""
    try:
        while True:
            if not sys.stdin.buffer.read(4096):
                break
    except Exception:  # noqa: BLE001
        pass
    server.shutdown()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("script", help="JSON script file")
    parser.add_argument("--log", default=os.environ.get("FAKE_OPENAI_LOG"))
    parser.add_argument("--model", default=os.environ.get("FAKE_OPENAI_MODEL", DEFAULT_MODEL))
    parser.add_argument("--aux-content", default=DEFAULT_AUX_CONTENT)
    parser.add_argument("--max-seconds", type=float, default=3600.0)
    parser.add_argument(
        "--no-stdin-watch", action="store_true", help="do not exit when stdin reaches EOF"
    )
    args = parser.parse_args(argv)

    with open(args.script, encoding="utf-8") as fh:
        spec = json.load(fh)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.script = Script(spec, args.model, args.aux_content)
    server.log = Log(args.log)

    if not args.no_stdin_watch:
        threading.Thread(target=_watch_stdin, args=(server,), daemon=True).start()
    timer = threading.Timer(args.max_seconds, server.shutdown)
    timer.daemon = True
    timer.start()

    print(f"PORT {server.server_address[1]}", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
