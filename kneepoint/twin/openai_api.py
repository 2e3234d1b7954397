"""The OpenAI-compatible surface vLLM serves, over a twin replica: request bodies in,
completion, chat and streaming (SSE) bodies out, with `usage` token counts."""

from __future__ import annotations

import json
import re
import time
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kneepoint.twin.replica import Replica, Tokens

_PIECES = re.compile(r"\w+|[^\w\s]")
_WORDS = (
    "the",
    "agent",
    "calls",
    "a",
    "tool",
    "and",
    "reads",
    "result",
    "then",
    "plans",
    "next",
    "step",
    "with",
    "file",
    "search",
    "query",
    "done",
    ".",
)
VOCABULARY = 151_000


class BadRequest(ValueError):
    """The request body cannot be served; the message goes back as an OpenAI error."""


def tokenize(text: str) -> list[int]:
    """Stable token ids: one per word or punctuation mark, so equal prefixes share tokens."""
    return [zlib.crc32(piece.encode()) % VOCABULARY for piece in _PIECES.findall(text)]


def chat_prompt(messages: Any) -> str:
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list")
    parts = []
    for message in messages:
        if not isinstance(message, dict) or "content" not in message:
            raise BadRequest("each message needs 'role' and 'content'")
        content = message["content"]
        if isinstance(content, list):  # content parts
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        parts.append(f"<|{message.get('role', 'user')}|> {content}")
    return "\n".join(parts) + "\n<|assistant|>"


@dataclass(frozen=True)
class Call:
    chat: bool
    prompt: list[int]
    max_tokens: int
    stream: bool
    include_usage: bool
    stop_after: int | None


def parse_call(body: bytes, chat: bool, served_name: str, max_model_len: int) -> Call:
    try:
        request = json.loads(body or b"{}")
    except json.JSONDecodeError as error:
        raise BadRequest(f"the body is not JSON: {error.msg}") from None
    if not isinstance(request, dict):
        raise BadRequest("the body must be a JSON object")
    if request.get("model", served_name) != served_name:
        raise BadRequest(f"The model `{request.get('model')}` does not exist.")
    if chat:
        prompt = tokenize(chat_prompt(request.get("messages")))
    else:
        raw = request.get("prompt")
        if isinstance(raw, list) and raw and all(isinstance(t, int) for t in raw):
            prompt = [t % VOCABULARY for t in raw]  # token ids, as vllm bench sends them
        elif isinstance(raw, str) and raw:
            prompt = tokenize(raw)
        else:
            raise BadRequest("'prompt' must be a non-empty string or list of token ids")
    max_tokens = request.get("max_completion_tokens", request.get("max_tokens", 16))
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise BadRequest("'max_tokens' must be a positive integer")
    if len(prompt) + max_tokens > max_model_len:
        raise BadRequest(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {len(prompt) + max_tokens} tokens ({len(prompt)} in the messages, "
            f"{max_tokens} in the completion)."
        )
    # Without ignore_eos the "model" ends where its end-of-sequence falls: a stable length
    # from the prompt, so the same prompt always answers the same way.
    natural = None if request.get("ignore_eos") else 24 + zlib.crc32(str(prompt).encode()) % 360
    options = request.get("stream_options") or {}
    return Call(
        chat,
        prompt,
        max_tokens,
        bool(request.get("stream")),
        bool(options.get("include_usage")),
        natural,
    )


def text_for(start: int, count: int) -> str:
    return "".join(" " + _WORDS[(start + i) % len(_WORDS)] for i in range(count))


def respond(replica: Replica, call: Call) -> dict[str, Any]:
    """Wait for the whole completion and return the non-streaming body."""
    generated, reason = 0, "length"
    events = replica.submit(call.prompt, call.max_tokens, call.stop_after)
    while True:
        tokens: Tokens = events.get()
        generated += tokens.count
        if tokens.done:
            reason = tokens.reason
            break
    text = text_for(0, generated)
    choice: dict[str, Any] = {"index": 0, "finish_reason": reason, "logprobs": None}
    if call.chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return {
        **_envelope(replica, call),
        "choices": [choice],
        "usage": _usage(len(call.prompt), generated),
    }


def stream(replica: Replica, call: Call) -> Iterator[bytes]:
    """Server-sent events, one chunk per engine step, as vLLM streams them."""
    envelope = _envelope(replica, call, chunk=True)
    events = replica.submit(call.prompt, call.max_tokens, call.stop_after)
    generated = 0
    if call.chat:
        yield _event(
            {
                **envelope,
                "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}],
            }
        )
    while True:
        tokens = events.get()
        text = text_for(generated, tokens.count)
        generated += tokens.count
        reason = tokens.reason if tokens.done else None
        choice: dict[str, Any] = {"index": 0, "finish_reason": reason}
        if call.chat:
            choice["delta"] = {"content": text}
        else:
            choice["text"] = text
        yield _event({**envelope, "choices": [choice]})
        if tokens.done:
            break
    if call.include_usage:
        yield _event({**envelope, "choices": [], "usage": _usage(len(call.prompt), generated)})
    yield b"data: [DONE]\n\n"


def models(replica: Replica) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {
                "id": replica.served_name,
                "object": "model",
                "created": int(replica.started_at),
                "owned_by": "vllm",
                "root": replica.served_name,
                "max_model_len": replica.engine.config.max_model_len,
            }
        ],
    }


def error_body(message: str, status: int = 400) -> dict[str, Any]:
    return {"error": {"message": message, "type": "BadRequestError", "param": None, "code": status}}


def _envelope(replica: Replica, call: Call, chunk: bool = False) -> dict[str, Any]:
    kind = "chat.completion" if call.chat else "text_completion"
    return {
        "id": f"{'chatcmpl' if call.chat else 'cmpl'}-{uuid.uuid4().hex}",
        "object": f"{kind}.chunk" if chunk and call.chat else kind,
        "created": int(time.time()),
        "model": replica.served_name,
    }


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"
