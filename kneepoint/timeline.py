"""What changed: one timeline of every change kneepoint can see in the data it stores.

Each detector is a pure function over consecutive stored samples (or stored rows) that
returns Events; `events` reads the store and runs them all. (Work in progress: issue 16.)
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session

from kneepoint.config import Config

KINDS = (
    "restart",
    "config_change",
    "upgrade",
    "gpu_xid",
    "gpu_throttle",
    "gpu_power_cap",
    "gpu_gone",
    "scrape_outage",
    "hit_rate_drop",
    "prefill_storm",
    "alert_firing",
    "alert_resolved",
    "silence",
    "annotation",
)


@dataclass(frozen=True)
class Event:
    """One change: when (epoch seconds), on which replica (None: the fleet), its kind (one
    of KINDS) and what it was, in words."""

    at: float
    replica: str | None
    kind: str
    detail: str


def events(
    session: Session, config: Config, since: float, until: float, replica: str | None = None
) -> list[Event]:
    """Every event in [since, until], oldest first; only `replica`'s (and the fleet's) when
    given."""
    return []
