"""Availability SLOs on a fleet twin: requests sent over its OpenAI API, some of which it fails
(finish reason error) or aborts, and an engine it stalls; its /metrics scraped and stored as
the collector stores them, one scrape per five minutes of an hour (the scrapes' times are
spread over the hour so the hour-long burn windows have data; every count is the twin's)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from alerts import slo
from alerts.evaluate import evaluate_once, measure, slo_reports
from alerts.lifecycle import FIRING
from collectors.engines.vllm import parse_vllm
from kneepoint.config import Slo, load_config
from kneepoint.store.db import open_store
from kneepoint.store.models import AlertRow
from kneepoint.store.writer import ensure_targets, record_replica
from kneepoint.twin.fleet import Fleet, FleetSpec
from tests.conftest import OWN_FIXTURES, migrated, read

pytestmark = pytest.mark.timeout(120)
STEP = 300.0  # seconds between the stored scrapes
ROUNDS = 13  # scrapes: an hour, both ends included
PER_ROUND = 8  # requests per replica between two scrapes
OBJECTIVE = 0.99


@pytest.fixture
def fleet() -> Iterator[Fleet]:
    spec = FleetSpec.model_validate(
        {
            "speed": 50.0,
            "nodes": [{"name": "node", "gpus": ["h100-80gb", "h100-80gb"]}],
            "replicas": [
                {"name": "steady", "model": "qwen3-4b", "node": "node", "gpu_index": 0},
                {"name": "flaky", "model": "qwen3-4b", "node": "node", "gpu_index": 1},
            ],
        }
    )
    running = Fleet(spec).start()
    yield running
    for replica in running.replicas.values():
        replica.resume()
    running.stop()


def store_for(tmp_path: Path, fleet: Fleet) -> Path:
    config_file = tmp_path / "kneepoint.yaml"
    targets = "\n".join(
        f'  - {{name: {name}, kind: vllm, url: "{fleet.url(name)}/metrics"}}'
        for name in fleet.replicas
    )
    config_file.write_text(f"""
database: sqlite:///{tmp_path / "k.db"}
targets:
{targets}
slos:
  - {{name: up, kind: availability, objective: {OBJECTIVE}}}
""")
    return migrated(config_file)


def ask(client: httpx.Client, fleet: Fleet, name: str) -> str:
    """One completion over the twin's API; its finish reason as the client got it."""
    reply = client.post(
        f"{fleet.url(name)}/v1/completions",
        json={"model": "Qwen/Qwen3-4B", "prompt": "hello there", "max_tokens": 4},
    )
    reply.raise_for_status()
    return str(reply.json()["choices"][0]["finish_reason"])


def scrape_and_store(config_file: Path, fleet: Fleet, ts: float) -> None:
    config = load_config(config_file)
    with open_store(config.database).begin() as session:
        ids = ensure_targets(session, [(t.name, t.kind, t.url) for t in config.targets])
        for name in fleet.replicas:
            text = httpx.get(f"{fleet.url(name)}/metrics").text
            record_replica(session, ids[name], ts, parse_vllm(text))


def firing_burns(config_file: Path) -> set[str]:
    config = load_config(config_file)
    with open_store(config.database)() as session:
        rows = session.scalars(select(AlertRow).where(AlertRow.state == FIRING))
        return {row.rule for row in rows if row.rule.startswith("up-burn-")}


def expected_burns(config_file: Path, bad: dict[float, float]) -> set[str]:
    """The burn alerts that must fire for these bad shares per window length."""
    (up,) = load_config(config_file).slos
    rate = {seconds: share / (1 - up.objective) for seconds, share in bad.items()}
    return {
        f"up-burn-{slo.window_label(w.long)}"
        for w in slo.BURN_WINDOWS
        if rate[w.long] > w.factor(up.window) and rate[w.short] > w.factor(up.window)
    }


@pytest.mark.parametrize("share", [0.0, 0.25], ids=["no failures", "a quarter failing"])
def test_failed_and_aborted_requests_burn_the_availability_budget(
    tmp_path: Path, fleet: Fleet, share: float
) -> None:
    config_file = store_for(tmp_path, fleet)
    fleet.replicas["flaky"].fail(share, "error")
    fleet.replicas["steady"].fail(share / 4, "abort")
    now = float(int(time.time()))
    told: Counter[str] = Counter()
    with httpx.Client(timeout=30) as client:
        for step in range(ROUNDS):
            if step:
                for name in fleet.replicas:
                    told.update(ask(client, fleet, name) for _ in range(PER_ROUND))
            scrape_and_store(config_file, fleet, now - 3600 + step * STEP)
    failed = told["error"] + told["abort"]
    assert (failed > 0) == (share > 0)  # the twin failed requests as it was told to
    share_told = failed / sum(told.values())

    config = load_config(config_file)
    with open_store(config.database).begin() as session:
        (report,) = slo_reports(session, config, now)
        counted = measure(session, config, now - 3600, now).availability
        evaluate_once(session, config, now)
    assert counted is not None
    # The stored counters say what the clients were told, request for request.
    assert counted.failed == failed and counted.finished == sum(told.values())
    assert report.budget.compliance == pytest.approx(1 - share_told)
    assert report.budget.budget_left == pytest.approx(1 - share_told / (1 - OBJECTIVE))
    # Failures are spread evenly, so every window burns alike; the alerts follow the factors.
    assert report.rates[3600.0] == pytest.approx(share_told / (1 - OBJECTIVE))
    windows = {seconds: share_told for seconds in slo.windows_needed()}
    assert firing_burns(config_file) == expected_burns(config_file, windows)
    if share:
        assert "up-burn-1h" in firing_burns(config_file)  # pages
    else:
        assert firing_burns(config_file) == set()


def test_stalled_time_counts_as_unavailable(tmp_path: Path, fleet: Fleet) -> None:
    """No request fails, but `flaky`'s engine stops stepping for the last scrapes with
    requests waiting: its stalled time is the SLO's bad time."""
    config_file = store_for(tmp_path, fleet)
    now = float(int(time.time()))
    stall_from = ROUNDS - 4  # the scrape from which flaky shows work and frozen counters
    times = [now - 3600 + step * STEP for step in range(ROUNDS)]
    with httpx.Client(timeout=30) as client:
        for step, ts in enumerate(times):
            if step == stall_from:
                fleet.replicas["flaky"].stall()
                for _ in range(3):  # accepted by the server, never stepped
                    fleet.replicas["flaky"].submit([1, 2, 3, 4], 4)
            if step:
                names = [n for n in fleet.replicas if n != "flaky" or step < stall_from]
                for name in names:
                    assert {ask(client, fleet, name) for _ in range(PER_ROUND)} == {"length"}
            scrape_and_store(config_file, fleet, ts)

    config = load_config(config_file)
    stalled = times[-1] - times[stall_from]  # from the first stuck scrape to the last
    observed = times[-1] - times[0]  # per replica

    def bad(seconds: float) -> float:
        """Stalled replica-seconds over observed ones, within the last `seconds`."""
        since = now - seconds
        seen = 2 * (times[-1] - max(since, times[0]))
        return max(0.0, times[-1] - max(since, times[stall_from])) / seen

    with open_store(config.database).begin() as session:
        counted = measure(session, config, now - 3600, now).availability
        (report,) = slo_reports(session, config, now)
        evaluate_once(session, config, now)
    assert counted is not None
    assert counted.failed == 0 and counted.finished > 0
    assert counted.stalled == pytest.approx(stalled)
    assert counted.seconds == pytest.approx(2 * observed)
    for seconds in slo.windows_needed():
        assert report.rates[seconds] == pytest.approx(bad(seconds) / (1 - OBJECTIVE))
    expected = expected_burns(
        config_file, {seconds: bad(seconds) for seconds in slo.windows_needed()}
    )
    assert expected  # the stall is long enough to burn
    assert firing_burns(config_file) == expected


AVAILABILITY = Slo(name="up", kind="availability", objective=OBJECTIVE)
A = slo.Availability
SHARES = {
    "a tenth of finished requests in error or aborted": (
        A(finished=100, failed=10, seconds=600),
        0.1,
    ),
    "the API server's 5xx share counts when it is the larger": (
        A(finished=100, failed=2, http=100, http_failed=5, seconds=600),
        0.05,
    ),
    "the engine's share counts when it is the larger (the layers are not added)": (
        A(finished=100, failed=5, http=100, http_failed=2, seconds=600),
        0.05,
    ),
    "a quarter of the time stalled and nothing failed": (
        A(finished=100, failed=0, seconds=800, stalled=200),
        0.25,
    ),
    "stalled time and failed requests combine as independent chances": (
        A(finished=100, failed=10, seconds=800, stalled=200),
        1 - (1 - 0.1) * (1 - 0.25),
    ),
    "stalled all along with nothing finished is all bad": (A(seconds=600, stalled=600), 1.0),
    "nothing finished and no stall: nothing to judge": (A(seconds=600), None),
    "a refused request is a failed one, offered = finished + refused": (
        A(finished=90, failed=0, refused=10, seconds=600),
        10 / 100,
    ),
    "refused and failed add up over every request offered": (
        A(finished=95, failed=5, refused=5, seconds=600),
        (5 + 5) / (95 + 5),
    ),
    "the API server's 503s already count the refusals: the larger share, not the sum": (
        A(finished=90, failed=0, refused=10, http=100, http_failed=10, seconds=600),
        0.1,
    ),
    "everything refused, nothing finished: all bad": (A(refused=8, seconds=600), 1.0),
}


@pytest.mark.parametrize("case", SHARES, ids=list(SHARES))
def test_the_bad_share(case: str) -> None:
    counts, expected = SHARES[case]
    share = slo.bad_share(AVAILABILITY, counts)
    assert share == (None if expected is None else pytest.approx(expected))


def test_the_api_servers_status_counters_are_read_from_a_real_vllm() -> None:
    text = read(OWN_FIXTURES / "vllm-0.32.0-cpu-preemption-under-load.prom")
    lines = [line for line in text.splitlines() if line.startswith("http_requests_total{")]
    assert lines  # the capture has them
    total = sum(float(line.rsplit(" ", 1)[1]) for line in lines)
    sample = parse_vllm(text)
    assert sample.counters["http_requests"] == total
    assert sample.counters["http_requests_5xx"] == 0.0  # no 5xx series yet: none
    failing = 'http_requests_total{handler="/v1/completions",method="POST",status="5xx"} 3.0'
    with_errors = parse_vllm(text + failing + "\n")
    assert with_errors.counters["http_requests_5xx"] == 3.0
    assert with_errors.counters["http_requests"] == total + 3.0
