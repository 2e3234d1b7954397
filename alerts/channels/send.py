"""One HTTP request to a platform, cut at an overall deadline, told back as a `Result`.

The deadline covers everything (connecting, sending, waiting, reading the answer): httpx's own
timeouts are per phase, so a receiver that trickles a byte a second would never hit them. The
request runs under `asyncio.timeout`, which cancels it wherever it is. The answer is read up
to `MAX_ANSWER` bytes, whatever the receiver sends.

A channel URL is a secret (its path or query is the token): nothing here puts it in an error,
only `where(url)`, `scheme://host[:port]/…`; an error's text goes through `scrub`, which
masks the URL and every secret of the config (kneepoint/secrets.py)."""

from __future__ import annotations

import asyncio
import functools
import math
import ssl
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from alerts.channels.base import Outgoing
from kneepoint.config import url_problem
from kneepoint.secrets import HookURL, redact_url
from kneepoint.secrets import scrub as scrub_secrets

DEADLINE = 10.0  # seconds one send may take, all of it
MAX_ANSWER = 2000  # bytes of the answer kept (errors quote its start)
LONGEST_RETRY_AFTER = 3600.0

T = TypeVar("T")


@dataclass(frozen=True)
class Result:
    """What a platform answered. Status 0: no answer (refused connection, deadline, invalid
    URL); `maybe_delivered` when the request may have reached it all the same; `permanent`
    when no retry can help (an invalid or unsupported URL)."""

    status: int
    body: str = ""
    retry_after: float | None = None
    maybe_delivered: bool = False
    permanent: bool = False


Sender = Callable[[Outgoing], Result]


def where(url: str) -> str:
    """What of a channel URL may be shown: `scheme://host[:port]/…`."""
    return redact_url(url, path=False)


def scrub(text: str, url: str) -> str:
    """`text` without the request's URL or its secret parts (user info, path, query), nor
    any other secret of the config."""
    return scrub_secrets(text, HookURL(url, remember=False))


def http_sender(timeout: float = DEADLINE) -> Sender:
    """A sender that POSTs with httpx, all of it within `timeout` seconds."""

    def send(request: Outgoing) -> Result:
        try:
            return _run(_post(request, timeout))
        except Exception as error:  # a bug or an odd platform: this row only, refused
            return Result(0, scrub(f"{type(error).__name__}: {error}", request.url), permanent=True)

    return send


async def _post(request: Outgoing, deadline: float) -> Result:
    problem = url_problem(request.url)
    if problem:
        return Result(0, f"invalid URL: {problem}", permanent=True)
    answer: dict[str, Any] = {}  # status and what arrived of the body, as it comes
    try:
        async with (
            asyncio.timeout(deadline),
            httpx.AsyncClient(timeout=deadline, verify=_tls()) as client,
            client.stream(
                "POST",
                request.url,
                json=None if request.content is not None else request.json,
                content=request.content,
                headers=request.headers,
            ) as response,
        ):
            answer["status"] = response.status_code
            answer["retry"] = response.headers.get("Retry-After")
            await _head(response, answer)
    except TimeoutError:  # the overall deadline
        if "status" not in answer:
            return Result(0, f"no complete answer within {deadline:g}s", maybe_delivered=True)
    except (httpx.ConnectError, httpx.ConnectTimeout) as error:  # it never got the request
        return Result(0, scrub(f"{type(error).__name__}: {error}", request.url))
    except (httpx.InvalidURL, httpx.UnsupportedProtocol) as error:
        return Result(0, f"invalid URL: {type(error).__name__}", permanent=True)
    except httpx.HTTPError as error:  # cut before the answer: it may have taken the message
        if "status" not in answer:
            text = scrub(f"{type(error).__name__}: {error}", request.url)
            return Result(0, text, maybe_delivered=True)
    # An answer's status line counts even when its body was cut (deadline, dropped link).
    body = bytes(answer.get("body", b""))[:MAX_ANSWER].decode("utf-8", "replace")
    return Result(int(answer["status"]), body, _seconds(answer.get("retry")))


async def _head(response: httpx.Response, answer: dict[str, Any]) -> None:
    answer["body"] = bytearray()
    async for chunk in response.aiter_bytes():
        answer["body"] += chunk
        if len(answer["body"]) >= MAX_ANSWER:
            break


@functools.cache
def _tls() -> ssl.SSLContext:
    """httpx's default TLS settings, made once (a new client would load them again, ~0.1 s)."""
    return httpx.create_ssl_context()


def _seconds(header: str | None) -> float | None:
    """Retry-After in seconds (the HTTP-date form is not used by chat platforms)."""
    try:
        wait = float(header) if header else None
    except ValueError:
        return None
    if wait is None or not math.isfinite(wait) or wait < 0:
        return None
    return min(wait, LONGEST_RETRY_AFTER)


def _run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to its end, also from a thread that already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()
