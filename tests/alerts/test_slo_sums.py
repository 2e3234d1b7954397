"""SLO running sums per bucket (kneepoint/store/slo_sums.py) give the numbers the samples give:
on a seeded store with gaps, restarts, a stale and a stalled replica, a vLLM and an SGLang
replica, windows not aligned to buckets, and a maintenance window, `slo_reports` and
`burn_rates` from the sums equal the direct computation; and a burn-rate round reads a few
rows per replica, not every sample of its windows."""

from __future__ import annotations

import copy
import random
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from alerts import evaluate
from alerts.evaluate import advance_sums, burn_rates, slo_reports
from collectors.sglang import parse_sglang
from collectors.vllm import parse_vllm
from kneepoint.config import Config, load_config
from kneepoint.samples import Histogram, ReplicaSample
from kneepoint.store import rollup, slo_sums
from kneepoint.store.db import open_store
from kneepoint.store.rollup import REPLICA_SHAPE
from kneepoint.store.writer import ensure_targets, record_replica
from tests.conftest import OWN_FIXTURES, VLLM_032, migrated, read

pytestmark = pytest.mark.timeout(120)
NOW = 1_800_000_000.0 + 4321.7  # not aligned to any bucket
HOURS = 27
STEP = 120.0
FINISHED = [f"requests_finished_{r}" for r in slo_sums.FINISHED]


def _config(tmp_path: Path, maintenance: str = "") -> Config:
    names = ["steady", "restarts", "stale", "stalled", "gaps", "sglang"]
    targets = "\n".join(
        f'  - {{name: {n}, kind: {"sglang" if n == "sglang" else "vllm"}, url: "http://127.0.0.1:9/{n}"}}'
        for n in names
    )
    path = tmp_path / "kneepoint.yaml"
    path.write_text(f"""
database: sqlite:///{tmp_path / "k.db"}
targets:
{targets}
slos:
  - {{name: fast, metric: ttft, threshold: 0.25s, objective: 0.99}}
  - {{name: up, kind: availability, objective: 0.99}}
{maintenance}
""")
    migrated(path)
    return load_config(path)


def _grow(sample: ReplicaSample, rng: random.Random, reset: bool) -> None:
    """Requests served since the last scrape (or, after a restart, since the restart)."""
    for name in [*FINISHED, "prompt_tokens", "generation_tokens", "http_requests"]:
        value = sample.counters.get(name)
        if value is None:
            continue
        more = float(rng.randint(0, 40 if name.endswith("tokens") else 6))
        sample.counters[name] = more if reset else value + more
    for name, h in list(sample.histograms.items()):
        per_bucket = [rng.choice([0.0, 0.0, 1.0, 2.0]) for _ in h.bounds]
        base = [0.0] * len(h.counts) if reset else list(h.counts)
        counts, running = [], 0.0
        for old, new in zip(base, per_bucket, strict=True):
            running += new
            counts.append(old + running)
        total = (0.0 if reset else h.total) + 0.05 * running
        sample.histograms[name] = Histogram(h.bounds, tuple(counts), total)


def _seed(config: Config) -> None:
    rng = random.Random(7)
    vllm = parse_vllm(read(VLLM_032))
    sglang = parse_sglang(read(OWN_FIXTURES / "sglang-0.4.6.prom"))
    sessions = open_store(config.database)
    with sessions.begin() as session:
        ids = ensure_targets(session, [(t.name, t.kind, t.url) for t in config.targets])
        for name, target_id in ids.items():
            sample = copy.deepcopy(sglang if name == "sglang" else vllm)
            if name != "sglang":
                sample.counters["http_requests"] = None
            ts = NOW - HOURS * 3600 + rng.uniform(0, STEP)
            stop = NOW - 3 * 3600 - 17 if name == "stale" else NOW
            index = 0
            while ts <= stop:
                index += 1
                gap = name == "gaps" and (250 <= index < 310 or 650 <= index < 656)
                restart = name == "restarts" and index % 200 == 0
                frozen = name == "stalled" and 750 <= index < 760
                if not frozen:
                    _grow(sample, rng, restart)
                sample.gauges["requests_running"] = 3.0 if frozen else float(rng.randint(0, 2))
                if not gap:
                    record_replica(session, target_id, ts, copy.deepcopy(sample))
                ts += STEP + rng.uniform(-3, 3)
    with sessions.begin() as session:  # summary tiers: the direct path reads through them
        rollup.summarize(session, REPLICA_SHAPE, NOW)


def _write_sums(config: Config, now: float) -> None:
    sessions = open_store(config.database)
    with sessions.begin() as session:
        while advance_sums(session, config, now):
            pass


def _same(a: Any, b: Any) -> None:
    if isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-12)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            _same(a[key], b[key])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    else:
        assert a == b


def _compare(config: Config, now: float) -> None:
    sessions = open_store(config.database)
    with sessions() as session:
        summed = slo_reports(session, config, now)
        direct = slo_reports(session, config, now, direct=True)
        _same(burn_rates(session, config, now), burn_rates(session, config, now, direct=True))
    assert [r.rates for r in summed]  # something was judged
    for a, b in zip(summed, direct, strict=True):
        _same(a.rates, b.rates)
        _same(a.budget.compliance, b.budget.compliance)
        _same(a.budget.budget_left, b.budget.budget_left)
        assert a.burning == b.burning and a.problem == b.problem
    # Not all the same: the windows differ, so the comparison compares something.
    assert len({v for r in direct for v in r.rates.values()}) > 2


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The samples, seeded once for the module (each test works on a copy)."""
    folder = tmp_path_factory.mktemp("seeded")
    _seed(_config(folder))
    return folder / "k.db"


def _copy(seeded: Path, tmp_path: Path) -> None:
    for part in seeded.parent.glob("k.db*"):  # with SQLite's write-ahead log, if any
        shutil.copy(part, tmp_path / part.name)


def test_the_sums_give_the_direct_numbers(tmp_path: Path, seeded: Path) -> None:
    _copy(seeded, tmp_path)
    config = _config(tmp_path)
    _write_sums(config, NOW)
    for now in (NOW, NOW - 7 * 3600 - 61.0):  # two ends, neither aligned
        _compare(config, now)
    # Every replica is read from the sums over the last 6 hours (none has a break there).
    sessions = open_store(config.database)
    with sessions() as session:
        ids = sorted(t.id for t in evaluate.queries.targets(session).values())
        summed = evaluate._summed(
            session, NOW - 6 * 3600, NOW, ids, evaluate.queries.histogram_layouts(session)
        )
    assert sorted(summed) == ids


def test_a_maintenance_window_leaves_the_same_numbers(tmp_path: Path, seeded: Path) -> None:
    _copy(seeded, tmp_path)
    start = datetime.fromtimestamp(NOW - 5 * 3600, UTC).isoformat()
    end = datetime.fromtimestamp(NOW - 4 * 3600, UTC).isoformat()
    config = _config(
        tmp_path,
        f"maintenance:\n  - {{name: m, start: '{start}', end: '{end}', replicas: [restarts]}}",
    )
    _write_sums(config, NOW)
    _compare(config, NOW)


def test_a_burn_round_reads_a_few_rows_per_replica(tmp_path: Path, seeded: Path) -> None:
    """Sample rows a burn-rate round of a latency SLO reads: with the sums, a partial bucket
    at each end of each window; the samples' path reads every sample. (An availability SLO
    still reads the stall columns of every sample: `measure` says why.)"""
    _copy(seeded, tmp_path)
    config = _config(tmp_path)
    config = config.model_copy(update={"slos": config.slos[:1]})
    _write_sums(config, NOW)
    sessions = open_store(config.database)
    with sessions() as session:
        rows_read: dict[bool, int] = {}
        for direct in (True, False):
            fetched: list[int] = []
            original = evaluate.queries.read_frame

            def spy(s: Any, query: Any, _orig: Any = original, _out: list[int] = fetched) -> Any:
                frame = _orig(s, query)
                _out.append(len(frame))
                return frame

            evaluate.queries.read_frame = spy  # type: ignore[assignment]
            try:
                burn_rates(session, config, NOW, direct=direct)
            finally:
                evaluate.queries.read_frame = original  # type: ignore[assignment]
            rows_read[direct] = sum(fetched)
    replicas = len(config.targets)
    windows = 7
    # A partial bucket at both ends of each window: at most 3 samples each at 120 s.
    assert rows_read[False] <= replicas * windows * 2 * 3
    assert rows_read[True] > 20 * rows_read[False]
