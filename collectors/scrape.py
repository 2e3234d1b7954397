"""Fetch every target's /metrics concurrently with httpx; one slow target delays no other."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import httpx

from kneepoint.clock import Clock, system_clock
from kneepoint.config import Target
from kneepoint.secrets import revealed, scrub


class ScrapeError(Exception):
    """The target could not be read; the message says why in one sentence."""


@dataclass(frozen=True)
class Fetched:
    target: Target
    started_at: float
    duration: float
    body: str | None
    error: str | None


async def fetch(client: httpx.AsyncClient, target: Target) -> str:
    """Return the body of one target's /metrics, or raise ScrapeError. Its message never
    holds the target's URL unredacted or a header's value."""
    where = str(target.url)  # user info and query values masked (redact_url)
    try:
        async with asyncio.timeout(target.timeout):
            async with client.stream(
                "GET",
                target.url.reveal(),
                headers=revealed(target.headers),
                timeout=target.timeout,
            ) as response:
                if response.status_code != 200:
                    raise ScrapeError(f"HTTP {response.status_code} from {where}")
                content_type = response.headers.get("content-type", "")
                if "html" in content_type:
                    raise ScrapeError(f"{where} answered with an HTML page, not metrics")
                chunks: list[bytes] = []
                size = 0
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > target.max_bytes:
                        raise ScrapeError(f"response from {where} exceeds {target.max_bytes} bytes")
                    chunks.append(chunk)
                return b"".join(chunks).decode(response.encoding or "utf-8", errors="replace")
    except TimeoutError:
        raise ScrapeError(f"timed out after {target.timeout:g}s") from None
    except httpx.TimeoutException:
        raise ScrapeError(f"timed out after {target.timeout:g}s") from None
    except httpx.ConnectError as error:
        raise ScrapeError(f"cannot connect to {where}: {_reason(error, target)}") from None
    except httpx.HTTPError as error:
        reason = _reason(error, target)
        raise ScrapeError(f"{type(error).__name__} from {where}: {reason}") from None


async def fetch_all(targets: list[Target], clock: Clock = system_clock) -> list[Fetched]:
    """Fetch all targets at once; failures come back as Fetched with an error, never raise."""
    async with httpx.AsyncClient(follow_redirects=True) as client:
        return list(await asyncio.gather(*(_timed(client, t, clock) for t in targets)))


async def _timed(client: httpx.AsyncClient, target: Target, clock: Clock) -> Fetched:
    started_at, began = clock(), time.perf_counter()
    try:
        body = await fetch(client, target)
        return Fetched(target, started_at, time.perf_counter() - began, body, None)
    except ScrapeError as error:
        return Fetched(target, started_at, time.perf_counter() - began, None, str(error))
    except Exception as error:  # anything else still costs this target only, never the round
        why = f"{type(error).__name__}: {_reason(error, target)}"
        return Fetched(target, started_at, time.perf_counter() - began, None, why)


def _reason(error: BaseException, target: Target) -> str:
    """The error's first line, its secrets masked before it is cut (a cut could leave part
    of one): httpx writes the request's URL into its messages."""
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        cause = cause.__cause__ or cause.__context__
    text = scrub(str(error) or type(error).__name__, target.url, *target.headers.values())
    return text.splitlines()[0][:200]
