"""Prometheus as the source: for fleets that already run Prometheus (or Thanos, Mimir,
VictoriaMetrics), read back what it scraped through its HTTP API (prometheus-api-client)
instead of scraping the targets a second time.

Each round asks for every raw sample since the last one stored, with a range selector, so
every scrape Prometheus made comes back with its own timestamp. Only the series kneepoint
stores are asked for, never further back than `prometheus.lookback` (default 1 h: an outage
longer than that leaves a gap, logged), in range queries of at most `prometheus.chunk`
(default 10 min), so a catch-up never grows into a query Prometheus refuses. The samples of
one scrape are rebuilt into the text exposition the target served and go through the same
parsers and writer as a direct scrape: both modes store the same canonical samples.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from requests import RequestException
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from collectors.collect import Outcome, store_fetched
from collectors.dcgm import FIELDS
from collectors.engines.vllm import WANTED
from collectors.scrape import Fetched
from kneepoint.clock import Clock, system_clock
from kneepoint.config import Config, PrometheusSource, Target
from kneepoint.secrets import SecretURL, revealed, scrub
from kneepoint.store.models import TargetRow

log = logging.getLogger(__name__)


def _names(kind: str) -> str:
    """The name matcher of the series a kind's normalizer reads (and no others): vLLM's
    in both spellings (`vllm:` and Ray's `vllm_`) and the API server's own, unprefixed ones
    (`http_requests_total`), DCGM's fields."""
    if kind == "vllm":
        own = sorted(n.removeprefix("vllm:") for n in WANTED if n.startswith("vllm:"))
        server = sorted(n for n in WANTED if not n.startswith("vllm:"))
        return "|".join(["vllm[:_](" + "|".join(own) + ")", *server])
    return "(" + "|".join(sorted(name for name, _ in FIELDS.values())) + ")"


FAMILIES = {kind: _names(kind) for kind in ("vllm", "dcgm")}
FIRST_LOOKBACK = 300.0  # seconds read back for a target nothing is stored for yet


class PrometheusSourceError(Exception):
    """The Prometheus API could not be read; the message says why in one sentence."""


@dataclass(frozen=True)
class Scrape:
    """One scrape as Prometheus stored it, rebuilt as text exposition."""

    instance: str
    ts: float
    body: str


def instance_of(target: Target) -> str:
    """The `instance` label Prometheus gives the target: its own, or its URL's host:port."""
    if target.instance:
        return target.instance
    parts = urlsplit(target.url.reveal())
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.hostname}:{port}"


def selector(base: str, kind: str) -> str:
    """The configured selector (`{job="vllm"}`, or empty) with the kind's family names."""
    inner = base.strip().removeprefix("{").removesuffix("}").strip()
    return "{" + ", ".join(m for m in (inner, f'__name__=~"{FAMILIES[kind]}"') if m) + "}"


def rebuild(series: Iterable[dict[str, Any]], since: dict[str, float]) -> list[Scrape]:
    """Group a range query's samples by instance and timestamp into scrapes, newer than
    `since[instance]`, oldest first. `job` and `instance` are Prometheus's labels, dropped
    so the exposition reads as the target served it."""
    lines: dict[tuple[str, float], list[str]] = {}
    for item in series:
        labels = dict(item["metric"])
        name = labels.pop("__name__")
        instance = labels.pop("instance", "")
        labels.pop("job", None)
        head = name + _labels(labels)
        after = since.get(instance, -math.inf)
        for ts, value in item["values"]:
            if float(ts) > after:
                lines.setdefault((instance, float(ts)), []).append(f"{head} {value}")
    return [
        Scrape(instance, ts, "\n".join(body) + "\n")
        for (instance, ts), body in sorted(lines.items(), key=lambda item: item[0][1])
    ]


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    escaped = (
        (k, v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n"))
        for k, v in sorted(labels.items())
    )
    return "{" + ",".join(f'{k}="{v}"' for k, v in escaped) + "}"


class PrometheusReader:
    """Reads one kind of target's scrapes and health from a Prometheus-compatible API."""

    def __init__(self, source: PrometheusSource) -> None:
        self.source = source
        self.client = PrometheusConnect(
            url=source.url.reveal(),
            headers=revealed(source.headers) or None,
            timeout=math.ceil(source.timeout),
        )

    def _query(self, query: str, at: float) -> list[dict[str, Any]]:
        try:
            return list(self.client.custom_query(query, params={"time": at}))
        except (PrometheusApiClientException, RequestException) as error:
            raise self._error(error) from None

    def _error(self, error: Exception) -> PrometheusSourceError:
        # The source's URL shown redacted; its secrets masked in the client's message
        # before it is cut, so no part of one is left.
        why = scrub(str(error), self.source.url, *self.source.headers.values())
        return PrometheusSourceError(f"cannot read {self.source.url}: {why[:200]}")

    def active_targets(self) -> list[dict[str, Any]]:
        """The targets Prometheus scrapes now (`/api/v1/targets?state=active`)."""
        try:
            return list(self.client.get_targets(state="active").get("activeTargets") or [])
        except (PrometheusApiClientException, RequestException, ValueError) as error:
            raise self._error(error) from None

    def scrapes(self, kind: str, since: dict[str, float], now: float) -> list[Scrape]:
        """Every scrape of the kind's instances after `since` (per instance), up to `now`,
        and no older than the source's lookback, read in chunks oldest first."""
        floor = now - self.source.lookback
        after = {instance: max(ts, floor) for instance, ts in since.items()}
        start = min(after.values(), default=max(now - FIRST_LOOKBACK, floor))
        base = self.source.vllm_selector if kind == "vllm" else self.source.dcgm_selector
        step = max(1, math.ceil(self.source.chunk))
        found: list[Scrape] = []
        while start < now:
            end = min(start + step, now)
            query = f"{selector(base, kind)}[{max(1, math.ceil(end - start))}s]"
            for scrape in rebuild(self._query(query, end), after):
                found.append(scrape)
                after[scrape.instance] = max(after.get(scrape.instance, -math.inf), scrape.ts)
            start = end
        return found

    def health(self, kind: str, now: float) -> dict[str, float]:
        """The latest `up` of each instance Prometheus scrapes for the kind."""
        base = self.source.vllm_selector if kind == "vllm" else self.source.dcgm_selector
        inner = base.strip().removeprefix("{").removesuffix("}").strip()
        result = self._query(f"up{{{inner}}}" if inner else "up", now)
        return {r["metric"].get("instance", ""): float(r["value"][1]) for r in result}


def collect_from_prometheus(
    config: Config, sessions: sessionmaker[Session], clock: Clock = system_clock
) -> list[Outcome]:
    """One round in Prometheus mode: store every scrape of the configured targets that
    Prometheus made since the last one stored, and each target's health as Prometheus
    sees it. The targets are the configured ones, matched by their `instance` label."""
    assert config.prometheus is not None
    reader = PrometheusReader(config.prometheus)
    now = clock()
    with sessions() as session:
        stored = {
            row.name: row.last_success_at
            for row in session.scalars(select(TargetRow))
            if row.last_success_at is not None
        }
    fetched: list[Fetched] = []
    for kind in FAMILIES:
        targets = {instance_of(t): t for t in config.targets if t.kind == kind}
        if not targets:
            continue
        since = {
            instance: stored.get(target.name, now - FIRST_LOOKBACK)
            for instance, target in targets.items()
        }
        for instance, ts in since.items():
            if ts < now - config.prometheus.lookback:
                log.warning(
                    "%s: scrapes from %.0f s to %.0f s ago are older than prometheus.lookback "
                    "and are not read back",
                    targets[instance].name,
                    now - ts,
                    config.prometheus.lookback,
                )
        up = reader.health(kind, now)
        fresh: set[str] = set()
        for scrape in reader.scrapes(kind, since, now):
            if scrape.instance in targets:
                fresh.add(scrape.instance)
                fetched.append(Fetched(targets[scrape.instance], scrape.ts, 0.0, scrape.body, None))
        for instance, target in targets.items():
            error = _down(instance, up, config.prometheus.url)
            if error and instance not in fresh:
                fetched.append(Fetched(target, now, 0.0, None, error))
    return store_fetched(fetched, sessions)


def _down(instance: str, up: dict[str, float], url: SecretURL) -> str | None:
    if instance not in up:
        return f"Prometheus at {url} does not scrape instance {instance}"
    if up[instance] != 1.0:
        return f"Prometheus reports instance {instance} down (up == 0)"
    return None
