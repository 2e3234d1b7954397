"""The SLO reports, computed once a minute by the HA leader and stored for every page.

Alert evaluation needs each SLO's burn rates once a minute (the burn windows are five
minutes and longer); the SLOs page and the Overview show the same reports with each SLO's
budget over its whole window. Both came from the same reads, done twice: by evaluation, and
by every app's warmer (35 s a minute at 1,000 replicas, more than the warmer had). Now the
leader's first evaluation round in a minute computes the whole reports (`prepare`: windows
ending at that round's `now`, exactly the moment its burn rates were computed as of before),
takes its burn rates from them, and stores them (kneepoint/store/prepared_rows.py) under a
fingerprint of the config's parts they read (`fingerprint`); pages read the newest.

What a page shows (app/data.py `slo_minute`): the newest stored reports whose moment is at
most STALE before the page's "now", with their "As of" (the SLOs page prints it), rather
than make a visitor wait for the computation; a page's "now" between the start of a minute
and the leader's write shows the minute before's. Older than STALE (no leader: a store only
read, `kneepoint serve --no-collect` on a store no collector leads, a dead collector, a
collector whose config differs) the app computes them itself, as before.

Only alert evaluation writes them: the collector's alerts job, on the HA leader only, inside
its transaction, which `collectors.cluster.serialize_evaluation` runs one leader at a time
(and `kneepoint alerts eval`, run by hand, which evaluates the same way). A second leader in
the same minute reads the first's row instead of computing again. Rows never change once
written, and the newest few are kept."""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable

from sqlalchemy.orm import Session

from alerts import slo
from kneepoint.config import ENGINE_KINDS, Config
from kneepoint.status import stale_after, stall_after
from kneepoint.store import prepared_rows

KIND = "slo_reports"
FORMAT = 1  # the payload's layout (alerts/slo.py report_json): a new one never reads an old
STEP = 60.0  # computed once per minute, as the burn rates were
STALE = 300.0  # pages show stored reports at most this old (the shortest burn window's length)

Compute = Callable[[Session, Config, float], list[slo.Report]]


def fingerprint(config: Config) -> str:
    """What the reports read besides the store: the SLOs, the maintenance windows, the
    engine replicas and how stalls are judged. An app whose config differs in any of them
    reads no stored reports (it computes its own)."""
    parts = {
        "format": FORMAT,
        "slos": [s.model_dump(mode="json") for s in config.slos],
        "maintenance": [m.model_dump(mode="json") for m in config.maintenance],
        "replicas": sorted(t.name for t in config.targets if t.kind in ENGINE_KINDS),
        "stall": [stall_after(config), stale_after(config)],
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def encode(reports: list[slo.Report]) -> str:
    return json.dumps([slo.report_json(r) for r in reports], separators=(",", ":"))


def decode(payload: str) -> list[slo.Report]:
    return [slo.report_of(values) for values in json.loads(payload)]


def stored(session: Session, config: Config, as_of: float) -> list[slo.Report] | None:
    """The reports stored for `config` as of exactly `as_of`; None if none."""
    payload = prepared_rows.read(session, KIND, fingerprint(config), as_of)
    return None if payload is None else decode(payload)


def newest(session: Session, config: Config, now: float, stale: float = STALE) -> float | None:
    """The moment of the newest reports stored for `config` as of `now - stale` to `now`."""
    return prepared_rows.newest(session, KIND, fingerprint(config), now - stale, now)


def prepare(session: Session, config: Config, now: float, compute: Compute) -> list[slo.Report]:
    """The reports of `now`'s minute: the ones stored in it (by this leader or the one
    before it in turn), else `compute(session, config, now)` stored as of `now`. Alert
    evaluation calls it (alerts/evaluate.py burn_rates_cached); nothing else writes them."""
    key = fingerprint(config)
    found = prepared_rows.newest(session, KIND, key, math.floor(now / STEP) * STEP, now)
    if found is not None:
        payload = prepared_rows.read(session, KIND, key, found)
        if payload is not None:
            return decode(payload)
    reports = compute(session, config, now)
    prepared_rows.write(session, KIND, key, now, encode(reports), time.time())
    return reports
