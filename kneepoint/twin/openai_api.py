"""The OpenAI-compatible surface vLLM serves, over a twin replica: request bodies in,
completion, chat and streaming (SSE) bodies out, with `usage` token counts.

An SGLang replica answers as SGLang's server does (sglang/srt/entrypoints/openai, 0.5.23):
it serves whatever `model` a request names and echoes it back ("default" when none); every
streamed completion chunk carries `"usage": null` and each choice a `matched_stop` (the end of
sequence token's id when the model stopped); a chat stream opens with a role-only chunk and
closes with a chunk holding only the finish reason, before the usage chunk (`choices: []`)
that `stream_options.include_usage` asks for; `usage` has `reasoning_tokens` and the null
details; errors are a top-level `{"object": "error", ...}` body, and its context-length
messages are SGLang's."""

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
# The end-of-sequence token a chat ends with, per served model (the `matched_stop` SGLang
# reports): Llama 3.1's <|eot_id|>, Qwen3's <|im_end|>.
EOS_TOKEN_IDS = {
    "meta-llama/Llama-3.1-8B-Instruct": 128009,
    "Qwen/Qwen3-4B": 151645,
    "Qwen/Qwen3-32B": 151645,
}
SGLANG_DEFAULT_MODEL = "default"  # what SGLang names a request that names no model


class BadRequest(ValueError):
    """The request body cannot be served; the message goes back as an OpenAI error."""

    def __init__(self, message: str, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.kind = kind  # SGLang's error `type`: "BadRequest" where a ValueError said it


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
    model: str = ""  # the name the response gives the model (SGLang: the request's)


def parse_call(
    body: bytes, chat: bool, served_name: str, max_model_len: int, engine: str = "vllm"
) -> Call:
    sglang = engine == "sglang"
    try:
        request = json.loads(body or b"{}")
    except json.JSONDecodeError as error:
        raise BadRequest(f"the body is not JSON: {error.msg}") from None
    if not isinstance(request, dict):
        raise BadRequest("the body must be a JSON object")
    model = served_name
    if sglang:  # SGLang serves any name (only `base:adapter` picks a LoRA adapter)
        model = str(request.get("model", SGLANG_DEFAULT_MODEL))
    elif request.get("model", served_name) != served_name:
        raise BadRequest(f"The model `{request.get('model')}` does not exist.")
    if chat:
        prompt = tokenize(chat_prompt(request.get("messages")))
    else:
        raw = request.get("prompt")
        if isinstance(raw, list) and raw and all(isinstance(t, int) for t in raw):
            prompt = [t % VOCABULARY for t in raw]  # token ids, as vllm bench sends them
        elif isinstance(raw, str) and raw:
            prompt = tokenize(raw)
        elif sglang:
            raise BadRequest("Prompt cannot be empty")
        else:
            raise BadRequest("'prompt' must be a non-empty string or list of token ids")
    # SGLang's chat requests default to the rest of the context (its completions to 16).
    default = max_model_len - len(prompt) if sglang and chat else 16
    max_tokens = request.get("max_completion_tokens", request.get("max_tokens", default))
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise BadRequest("'max_tokens' must be a positive integer")
    if sglang:
        _sglang_context(len(prompt), max_tokens, max_model_len)
    elif len(prompt) + max_tokens > max_model_len:
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
        model,
    )


def _sglang_context(prompt: int, max_tokens: int, context: int) -> None:
    """SGLang's tokenizer manager's length checks (_validate_one_request), its messages."""
    if prompt >= context:
        raise BadRequest(
            f"The input ({prompt} tokens) is longer than the model's context length "
            f"({context} tokens).",
            "BadRequest",
        )
    if prompt + max_tokens > context:
        raise BadRequest(
            "Requested token count exceeds the model's maximum context length of "
            f"{context} tokens. You requested a total of {prompt + max_tokens} tokens: "
            f"{prompt} tokens from the input messages and {max_tokens} tokens for the "
            "completion. Please reduce the number of tokens in the input messages or the "
            "completion to fit within the limit.",
            "BadRequest",
        )


def text_for(start: int, count: int) -> str:
    return "".join(" " + _WORDS[(start + i) % len(_WORDS)] for i in range(count))


def respond(replica: Replica, call: Call) -> dict[str, Any]:
    """Wait for the whole completion and return the non-streaming body."""
    if replica.engine_name == "sglang":
        return _sglang_respond(replica, call)
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
    if replica.engine_name == "sglang":
        yield from _sglang_stream(replica, call)
        return
    envelope = _envelope(replica, call, chunk=True)
    events = replica.submit(call.prompt, call.max_tokens, call.stop_after, stream=True)
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
    sglang = replica.engine_name == "sglang"
    card: dict[str, Any] = {
        "id": replica.served_name,
        "object": "model",
        "created": int(time.time() if sglang else replica.started_at),
        "owned_by": replica.engine_name,
        "root": replica.served_name,
    }
    if sglang:
        card["parent"] = None
    card["max_model_len"] = replica.engine.config.max_model_len
    return {"object": "list", "data": [card]}


def error_body(
    message: str, status: int = 400, engine: str = "vllm", kind: str = "BadRequestError"
) -> dict[str, Any]:
    if engine == "sglang":
        if status == 404:
            return {"detail": "Not Found"}  # FastAPI's answer for a path it has no route for
        return {"object": "error", "message": message, "type": kind, "param": None, "code": status}
    return {"error": {"message": message, "type": "BadRequestError", "param": None, "code": status}}


def _sglang_usage(prompt: int, completion: int, nulls: bool = True) -> dict[str, Any]:
    """SGLang's UsageInfo (its stream's usage chunk of a completion leaves the nulls out)."""
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": None,
        "reasoning_tokens": 0,
        "completion_tokens_details": None,
    }
    return usage if nulls else {k: v for k, v in usage.items() if v is not None}


def _matched_stop(replica: Replica, reason: str | None) -> int | None:
    return EOS_TOKEN_IDS.get(replica.served_name) if reason == "stop" else None


def _sglang_respond(replica: Replica, call: Call) -> dict[str, Any]:
    generated, reason = 0, "length"
    events = replica.submit(call.prompt, call.max_tokens, call.stop_after, stream=False)
    while True:
        tokens: Tokens = events.get()
        generated += tokens.count
        if tokens.done:
            reason = tokens.reason
            break
    text = text_for(0, generated)
    choice: dict[str, Any] = {"index": 0}
    if call.chat:
        choice["message"] = {"role": "assistant", "content": text, "reasoning_content": None}
    else:
        choice["text"] = text
    choice |= {
        "logprobs": None,
        "finish_reason": reason,
        "matched_stop": _matched_stop(replica, reason),
    }
    return {
        **_envelope(replica, call),
        "choices": [choice],
        "usage": _sglang_usage(len(call.prompt), generated),
        "metadata": {"weight_version": "default"},
    }


def _sglang_stream(replica: Replica, call: Call) -> Iterator[bytes]:
    envelope = _envelope(replica, call, chunk=True)
    events = replica.submit(call.prompt, call.max_tokens, call.stop_after, stream=True)
    generated = 0

    def chat_chunk(delta: dict[str, Any], reason: str | None = None) -> bytes:
        choice = {
            "index": 0,
            "delta": {"reasoning_content": None, **delta},
            "logprobs": None,
            "finish_reason": reason,
            "matched_stop": _matched_stop(replica, reason),
        }
        return _event({**envelope, "choices": [choice]}, compact=True)

    while True:
        tokens = events.get()
        text = text_for(generated, tokens.count)
        reason = tokens.reason if tokens.done else None
        if call.chat:
            if not generated:
                yield chat_chunk({"role": "assistant", "content": ""})
            yield chat_chunk({"content": text})
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": reason,
                "matched_stop": _matched_stop(replica, reason),
            }
            yield _event({**envelope, "choices": [choice], "usage": None}, compact=True)
        generated += tokens.count
        if tokens.done:
            break
    if call.chat:
        yield chat_chunk({}, tokens.reason)
    if call.include_usage:
        usage = _sglang_usage(len(call.prompt), generated, nulls=call.chat)
        yield _event({**envelope, "choices": [], "usage": usage}, compact=True)
    yield b"data: [DONE]\n\n"


def _envelope(replica: Replica, call: Call, chunk: bool = False) -> dict[str, Any]:
    kind = "chat.completion" if call.chat else "text_completion"
    return {
        "id": f"{'chatcmpl' if call.chat else 'cmpl'}-{uuid.uuid4().hex}",
        "object": f"{kind}.chunk" if chunk and call.chat else kind,
        "created": int(time.time()),
        "model": call.model or replica.served_name,
    }


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _event(payload: dict[str, Any], compact: bool = False) -> bytes:
    """One server-sent event; `compact` as pydantic and msgspec write JSON (SGLang)."""
    text = json.dumps(payload, separators=(",", ":")) if compact else json.dumps(payload)
    return b"data: " + text.encode() + b"\n\n"
