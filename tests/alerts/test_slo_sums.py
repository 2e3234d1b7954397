"""SLO running sums per bucket (kneepoint/store/slo_sums.py) give the numbers the samples give:
on a seeded store with gaps, restarts, a stale and a stalled replica (its stall crossing
bucket edges and a window's edges), a vLLM and an SGLang replica, windows not aligned to
buckets, and a maintenance window, `slo_reports` and `burn_rates` from the sums equal the
direct computation, on SQLite and on PostgreSQL (where the sums are written too, row for row
as on SQLite). Stalled time is read from the rows of candidate stuck pairs only
(kneepoint/store/stall_rows.py): the same rows replica_frame reads, the same seconds. A
burn-rate round, availability SLO included, reads a few rows per replica, not every sample
of its windows."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import random
import statistics
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from sqlalchemy import select

from alerts import evaluate, slo
from alerts.evaluate import advance_sums, burn_rates, slo_reports
from collectors.engines.sglang import parse_sglang
from collectors.engines.vllm import parse_vllm
from kneepoint import status
from kneepoint.config import Config, load_config
from kneepoint.derived import stall
from kneepoint.samples import HISTOGRAMS, Histogram, ReplicaSample
from kneepoint.store import queries, rollup, slo_sums, stall_rows
from kneepoint.store.db import open_store
from kneepoint.store.models import Base, ReplicaRollupRow, ReplicaSampleRow, SloSumRow
from kneepoint.store.rollup import REPLICA_SHAPE
from kneepoint.store.writer import ensure_targets, record_replica_history
from tests.conftest import OWN_FIXTURES, VLLM_032, migrated, read
from tests.postgres import running_postgres

pytestmark = pytest.mark.timeout(120)
NOW = 1_800_000_000.0 + 4321.7  # not aligned to any bucket
HOURS = 8  # the longest burn window (3 days) and the SLO's (30 days) start before the first
STEP = 120.0
SAMPLES = int(HOURS * 3600 / STEP)
# About NOW - 4,200 s to NOW - 3,000 s: the hour's window starts inside it, and EARLIER's
# windows end inside it.
FROZEN = range(SAMPLES - 35, SAMPLES - 25)
EARLIER = NOW - 3300 - 61.3  # a second end, not aligned either
GAP = range(60, 90)  # an hour without samples: EARLIER's 6 h window starts inside it
FINISHED = [f"requests_finished_{r}" for r in slo_sums.FINISHED]
# A second stall, still going at NOW: longer than the 5-minute, 30-minute and hour windows,
# it covers them whole and crosses many bucket edges (not aligned to any).
WEDGED = NOW - 75 * 60 - 41.9
# An engine put to sleep (vLLM's sleep mode) with requests waiting: its counters frozen on
# purpose for 20 minutes, crossing bucket edges and the hour's window start. Never stalled.
ASLEEP = FROZEN
NAMES = ["steady", "restarts", "stale", "stalled", "gaps", "sglang", "wedged", "asleep"]


def _config(tmp_path: Path, maintenance: str = "", database: str | None = None) -> Config:
    targets = "\n".join(
        f'  - {{name: {n}, kind: {"sglang" if n == "sglang" else "vllm"}, url: "http://127.0.0.1:9/{n}"}}'
        for n in NAMES
    )
    path = tmp_path / "kneepoint.yaml"
    path.write_text(f"""
database: {database or f"sqlite:///{tmp_path / 'k.db'}"}
targets:
{targets}
slos:
  - {{name: fast, metric: ttft, threshold: 0.25s, objective: 0.99}}
  - {{name: up, kind: availability, objective: 0.99}}
{maintenance}
""")
    if database is None:
        migrated(path)
    return load_config(path)


def _grow(sample: ReplicaSample, rng: random.Random, reset: bool) -> None:
    """Requests served since the last scrape (or, after a restart, since the restart)."""
    refused = sample.counters.get("admission_rejections")  # vLLM 0.32's load shedding
    if refused is not None:  # (its own generator: the other counters' draws as before)
        sample.counters["admission_rejections"] = (0.0 if reset else refused) + SHED.choice(
            [0.0, 0.0, 0.0, 1.0, 4.0]
        )
    for name in [*FINISHED, "prompt_tokens", "generation_tokens", "http_requests"]:
        value = sample.counters.get(name)
        if value is None:
            continue
        more = float(rng.randint(0, 40 if name.endswith("tokens") else 6))
        sample.counters[name] = more if reset else value + more
    for name, h in list(sample.histograms.items()):
        if name not in HISTOGRAMS:  # the load histograms: no SLO reads them
            continue
        per_bucket = [rng.choice([0.0, 0.0, 1.0, 2.0]) for _ in h.bounds]
        base = [0.0] * len(h.counts) if reset else list(h.counts)
        counts, running = [], 0.0
        for old, new in zip(base, per_bucket, strict=True):
            running += new
            counts.append(old + running)
        total = (0.0 if reset else h.total) + 0.05 * running
        sample.histograms[name] = Histogram(h.bounds, tuple(counts), total)


SHED = random.Random(3)


def _seed(config: Config) -> None:
    SHED.seed(3)
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
            index, kept = 0, []
            while ts <= stop:
                index += 1
                gap = name == "gaps" and (index in GAP or 200 <= index < 203)
                restart = name == "restarts" and index % 70 == 0
                sleeping = name == "asleep" and index in ASLEEP
                frozen = (
                    (name == "stalled" and index in FROZEN)
                    or (name == "wedged" and ts >= WEDGED)
                    or sleeping
                )
                if not frozen:
                    _grow(sample, rng, restart)
                sample.gauges["requests_running"] = 3.0 if frozen else float(rng.randint(0, 2))
                asleep = 1.0 if sleeping else 0.0
                sample.gauges["sleep_level"] = None if name == "sglang" else asleep
                if not gap:  # a snapshot: _grow changes the dicts, never a Histogram
                    kept.append(
                        (
                            ts,
                            dataclasses.replace(
                                sample,
                                counters=dict(sample.counters),
                                gauges=dict(sample.gauges),
                                histograms=dict(sample.histograms),
                            ),
                        )
                    )
                ts += STEP + rng.uniform(-3, 3)
            record_replica_history(session, target_id, kept)  # one statement per replica
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
    elif dataclasses.is_dataclass(a) and not isinstance(a, type):
        _same(dataclasses.asdict(a), dataclasses.asdict(b))  # type: ignore[arg-type]
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    else:
        assert a == b


def _compare(config: Config, now: float, rates: bool = False) -> None:
    """slo_reports from the sums equal the direct ones (their burn rates are burn_rates'
    windows; `rates`: burn_rates itself compared too), stalled seconds aside: the sums judge
    them on the raw samples, runs whole (slo_sums docstring; test_stalled_seconds_*), so an
    availability SLO's windows are compared count by count, all but `stalled`."""
    sessions = open_store(config.database)
    latency = config.model_copy(
        update={"slos": [s for s in config.slos if s.kind != "availability"]}
    )
    with sessions() as session:
        summed = slo_reports(session, latency, now)
        direct = slo_reports(session, latency, now, direct=True)
        if rates:
            _same(burn_rates(session, latency, now), burn_rates(session, latency, now, direct=True))
        if any(s.kind == "availability" for s in config.slos):
            spans = sorted({*slo.windows_needed(), *(s.window for s in config.slos)})
            shared = evaluate._shared(config, now, spans)
            counted, refused = set(), set()
            for span in spans:
                mine = evaluate.measure(session, config, now - span, now, False, shared)
                theirs = evaluate.measure(session, config, now - span, now, True)
                _same(mine.histograms, theirs.histograms)
                assert mine.availability is not None and theirs.availability is not None
                fields = dataclasses.asdict(mine.availability)
                assert fields.pop("stalled") >= 0
                other = dataclasses.asdict(theirs.availability)
                other.pop("stalled")
                _same(fields, other)
                counted.add(fields["finished"])
                refused.add(fields["refused"])
            # Not all the same: the windows differ, so the comparison compares something.
            assert len(counted - {0.0}) > 2
            assert len(refused - {0.0}) > 2  # load shedding summed as the samples give it
    assert [r.rates for r in summed]  # something was judged
    for a, b in zip(summed, direct, strict=True):
        _same(a.rates, b.rates)
        _same(a.budget.compliance, b.budget.compliance)
        _same(a.budget.budget_left, b.budget.budget_left)
        assert a.burning == b.burning and a.problem == b.problem


def _credits(points: list[stall.Point], after: float, widest: float) -> list[tuple[float, float]]:
    """The seconds the sums credit at each sample (slo_sums docstring), found another way:
    each run of stuck samples that lasts `after` (stall.stalled_intervals, over every raw
    sample of the replica), credited all it lasted at its first sample `after` from its
    start, then each later step at the sample ending it."""
    out: list[tuple[float, float]] = []
    for start, end in stall.stalled_intervals(points, after, widest):
        times = [p.ts for p in points if start <= p.ts <= end]
        due = next(t for t in times if t - start >= after)
        out.append((due, due - start))
        out += [(b, b - a) for a, b in itertools.pairwise(times) if a >= due]
    return out


Runs = tuple[list[tuple[float, float]], list[tuple[float, float]], float]


def _stall_runs(config: Config) -> dict[int, Runs]:
    """Per replica: the credits at its samples (_credits, from all its raw samples), its
    stalled runs, and its widest step that may be stuck."""
    out = {}
    widest = status.stale_after(config)
    with open_store(config.database)() as session:
        for row in queries.targets(session).values():
            rows = session.execute(
                select(ReplicaSampleRow)
                .where(ReplicaSampleRow.target_id == row.id)
                .order_by(ReplicaSampleRow.ts)
            ).scalars()
            points = [
                stall.Point(
                    r.ts,
                    r.requests_running,
                    r.requests_waiting,
                    *(getattr(r, c) for c in stall.PROGRESS),
                    r.sleep_level,
                )
                for r in rows
            ]
            steps = [b.ts - a.ts for a, b in itertools.pairwise(points)]
            gap = max(widest, 2 * statistics.median(steps))
            runs = stall.stalled_intervals(points, status.stall_after(config), gap)
            credits = _credits(points, status.stall_after(config), gap)
            out[row.id] = (credits, runs, max(s for s in steps if s < gap))
    return out


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A store seeded once for the module, summary tiers and SLO sums written up to NOW;
    the tests only read it."""
    folder = tmp_path_factory.mktemp("seeded")
    config = _config(folder)
    _seed(config)
    _write_sums(config, NOW)
    return f"sqlite:///{folder / 'k.db'}"


def test_the_sums_give_the_direct_numbers(tmp_path: Path, seeded: str) -> None:
    config = _config(tmp_path, database=seeded)
    _compare(config, NOW, rates=True)
    _compare(config, EARLIER)
    # Every replica is read from the sums over the last 6 hours (none has a break there).
    sessions = open_store(config.database)
    with sessions() as session:
        ids = sorted(t.id for t in queries.targets(session).values())
        summed, _ = evaluate._summed(
            session, NOW - 6 * 3600, NOW, ids, queries.histogram_layouts(session)
        )
    assert sorted(summed) == ids


def test_a_maintenance_window_leaves_the_same_numbers(tmp_path: Path, seeded: str) -> None:
    start = datetime.fromtimestamp(NOW - 5 * 3600, UTC).isoformat()
    end = datetime.fromtimestamp(NOW - 4 * 3600, UTC).isoformat()
    config = _config(
        tmp_path,
        f"maintenance:\n  - {{name: m, start: '{start}', end: '{end}', replicas: [restarts]}}",
        database=seeded,
    )
    _compare(config, NOW)


def _stall_rows_match(config: Config) -> None:
    """stall_rows reads the rows replica_frame reads, and the stalled seconds from its
    candidates are `_stalled_seconds`' over the whole frame, for every window at both ends."""
    sessions = open_store(config.database)
    seconds: dict[tuple[float, float], float] = {}
    wedged: dict[tuple[float, float], float] = {}
    with sessions() as session:
        names = {name: row.id for name, row in queries.targets(session).items()}
        ids = sorted(names.values())
        for now in (NOW, EARLIER):
            for span in slo.windows_needed():
                start = now - span
                frame = queries.replica_frame(
                    session, start, now, ids, columns=evaluate.STALL_COLUMNS
                )
                rows = stall_rows.frame_rows(session, ids, start, now)
                mine = pd.DataFrame(session.execute(select(rows)).mappings().all())
                read = ["target_id", "ts", *evaluate.STALL_COLUMNS]
                mine = mine[read].sort_values(["target_id", "ts"], ignore_index=True)
                pd.testing.assert_frame_equal(mine, frame[read], check_dtype=False)
                direct = evaluate._stalled_seconds(frame, config, start, now)
                store = evaluate._stalled_in_store(session, config, ids, start, now)
                assert {k: v for k, v in store.items() if v} == {
                    k: v for k, v in direct.items() if v
                }
                seconds[(now, span)] = direct.get(names["stalled"], 0.0)
                wedged[(now, span)] = direct.get(names["wedged"], 0.0)
        # EARLIER's 6 h window starts in the gaps replica's gap: its first row read is a
        # summary row, and replica_frame reads the samples up to it in its place.
        start = EARLIER - 6 * 3600
        low = (start // 300 + 1) * 300
        frame = queries.replica_frame(session, start, EARLIER, [names["gaps"]])
        summaries = set(
            session.scalars(
                select(ReplicaRollupRow.ts).where(
                    ReplicaRollupRow.target_id == names["gaps"], ReplicaRollupRow.resolution == 300
                )
            )
        )
        assert any(ts >= low and ts not in summaries for ts in frame.ts)
    # The stall is seen, cut by the hour's window at NOW, and still going at EARLIER.
    stalled = seconds[(NOW, 7200.0)]
    assert 0 < seconds[(NOW, 3600.0)] < stalled
    assert 0 < seconds[(EARLIER, 300.0)] < seconds[(EARLIER, 1800.0)]
    # The stall still going at NOW covers its short windows whole (from their first sample
    # on), and every longer window counts all of it.
    assert 300 - STEP - 3 <= wedged[(NOW, 300.0)] <= 300
    assert 3600 - STEP - 3 <= wedged[(NOW, 3600.0)] <= 3600
    assert wedged[(NOW, 7200.0)] == wedged[(NOW, 86400.0)] > 3600
    assert 0 < wedged[(EARLIER, 7200.0)] < wedged[(NOW, 7200.0)]  # still going at EARLIER


def test_stalled_seconds_from_the_sums(tmp_path: Path, seeded: str) -> None:
    """The sums' stalled seconds of every window (at NOW and EARLIER, not on bucket bounds)
    are the seconds credited at its samples, runs judged whole on the raw samples
    (_credits). Against the direct computation: equal in every window of raw samples (an
    hour and less) that no run crosses the start of; where one does, the direct one cuts
    it there (and judges what is left), so they differ by at most `after` and a step; in
    longer windows the direct one judges summary rows, 5 minutes (an hour past 2 days)
    apart: at most two of those a run, plus `after` and a step."""
    config = _config(tmp_path, database=seeded)
    runs = _stall_runs(config)
    after = status.stall_after(config)
    spans = sorted({*slo.windows_needed(), *(s.window for s in config.slos)})
    equal = differ = 0
    with open_store(config.database)() as session:
        ids = sorted(runs)
        layouts = queries.histogram_layouts(session)
        for now in (NOW, EARLIER):
            shared = evaluate._shared(config, now, spans)
            for span in spans:
                since = now - span
                windows, mine = evaluate._summed(session, since, now, ids, layouts, shared)
                # (Windows the sums do not reach, the longest, are the samples' path's.)
                assert windows or span > 6 * 3600
                assert sorted(mine) == sorted(windows)
                frame = queries.replica_frame(
                    session, since, now, ids, columns=evaluate.STALL_COLUMNS
                )
                direct = evaluate._stalled_seconds(frame, config, since, now)
                for target_id, seconds in mine.items():
                    credits, stalled, step = runs[target_id]
                    expected = sum(c for ts, c in credits if since <= ts <= now)
                    assert seconds == pytest.approx(expected, rel=1e-9, abs=1e-9)
                    theirs = direct.get(target_id, 0.0)
                    inside = [(a, b) for a, b in stalled if b >= since and a <= now]
                    crossing = any(a < since for a, _ in inside)
                    if queries.coarsest_for(span) == queries.RAW and not crossing:
                        assert seconds == pytest.approx(theirs, rel=1e-9, abs=1e-9)
                        equal += seconds > 0
                        continue
                    resolution = queries.coarsest_for(span)
                    most = after + step
                    if queries.coarsest_for(span) != queries.RAW:
                        most += 2 * resolution * len(inside)
                    assert abs(seconds - theirs) <= most
                    differ += seconds != pytest.approx(theirs)
    # Both cases were met: stalls the sums count as the direct computation does, and ones
    # cut or coarsened by it.
    assert equal and differ


def test_an_asleep_replica_is_never_stalled(tmp_path: Path, seeded: str) -> None:
    """The asleep replica's 20 minutes of work present and frozen counters are no stall:
    not in the sums, not in the direct computation, not in the candidate rows; the same
    samples read without their sleep level are one."""
    config = _config(tmp_path, database=seeded)
    runs = _stall_runs(config)
    with open_store(config.database)() as session:
        target = queries.targets(session)["asleep"].id
        ids = sorted(runs)
        layouts = queries.histogram_layouts(session)
        for span in (3600.0, 7200.0):
            since = NOW - span
            _, summed = evaluate._summed(session, since, NOW, ids, layouts)
            assert summed.get(target, 0.0) == 0.0
            assert target not in evaluate._stalled_in_store(session, config, ids, since, NOW)
            frame = queries.replica_frame(session, since, NOW, ids, columns=evaluate.STALL_COLUMNS)
            assert evaluate._stalled_seconds(frame, config, since, NOW).get(target, 0.0) == 0.0
            mine = frame[frame.target_id == target]
            awake = evaluate._stalled_seconds(mine.assign(sleep_level=0.0), config, since, NOW)
            # The frozen stretch, were it awake (the hour's window starts inside it).
            assert awake[target] >= (600 if span > 3600 else 60)
    assert runs[target][0] == [] and runs[target][1] == []


def test_stalled_seconds_come_from_the_candidate_rows(tmp_path: Path, seeded: str) -> None:
    _stall_rows_match(_config(tmp_path, database=seeded))


def _rows_read(config: Config, direct: bool) -> tuple[int, int]:
    """Sample rows one burn-rate round reads into Python (through queries.read_frame), and
    how many frames of samples the sums' reader converts (slo_sums._Rows.of)."""
    fetched: list[int] = []
    converted: list[int] = []
    original, convert = queries.read_frame, slo_sums._Rows.of

    def spy(session: Any, query: Any) -> pd.DataFrame:
        frame = original(session, query)
        fetched.append(len(frame))
        return frame

    def counted(frame: pd.DataFrame, *parts: Any) -> Any:
        converted.append(len(frame))
        return convert(frame, *parts)

    sessions = open_store(config.database)
    with sessions() as session:
        queries.read_frame = spy  # type: ignore[assignment]
        slo_sums._Rows.of = staticmethod(counted)  # type: ignore[method-assign,assignment]
        try:
            burn_rates(session, config, NOW, direct=direct)
        finally:
            queries.read_frame = original  # type: ignore[assignment]
            slo_sums._Rows.of = staticmethod(convert)  # type: ignore[method-assign,assignment]
    return sum(fetched), len(converted)


@pytest.mark.parametrize("kinds", [("latency",), ("latency", "availability")])
def test_a_burn_round_reads_a_few_rows_per_replica(
    tmp_path: Path, seeded: str, kinds: tuple[str, ...]
) -> None:
    """With the sums, a partial bucket at each end of each window (converted for all replicas
    at once); with an availability SLO, also the rows of candidate stuck pairs (the stalled
    replica's frozen stretch and its edges). The samples' path reads every sample."""
    config = _config(tmp_path, database=seeded)
    config = config.model_copy(update={"slos": [s for s in config.slos if s.kind in kinds]})
    assert [s.kind for s in config.slos] == list(kinds)
    (summed, conversions), (direct, _) = _rows_read(config, False), _rows_read(config, True)
    windows = len(slo.windows_needed())
    # The partial buckets of all replicas at one end of a window are converted at once.
    assert conversions <= 2 * windows
    # A partial bucket at both ends of each window: at most 3 samples each at 120 s; the
    # frozen stretch and a row at each side, in each window that reaches it.
    most = len(NAMES) * windows * 2 * 3
    if "availability" in kinds:
        most += windows * (len(FROZEN) + 2 + int((NOW - WEDGED) / STEP) + 2)
    assert summed <= most
    # (The wedged replica's frozen rows are candidates in every window that reaches them.)
    assert direct > 5 * summed


@pytest.fixture(scope="module")
def postgres(seeded: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Config]:
    """The seeded samples and summary tiers copied into a throwaway PostgreSQL, and the SLO
    sums written there by the same writer."""
    with running_postgres() as fresh:
        url = fresh()
        config = _config(tmp_path_factory.mktemp("pg"), database=url)
        source, target = open_store(seeded), open_store(url)
        with source() as a, target.begin() as b:
            for table in Base.metadata.sorted_tables:
                if table.name in ("slo_sums", "slo_sum_progress"):
                    continue
                rows = [dict(r) for r in a.execute(select(table)).mappings()]
                if rows:
                    b.execute(table.insert(), rows)
        _write_sums(config, NOW)
        yield config


def _sum_rows(url: str) -> dict[tuple[int, float], dict[str, Any]]:
    import json

    with open_store(url)() as session:
        rows = session.execute(select(SloSumRow.__table__)).mappings().all()
    out = {}
    for row in rows:
        values = dict(row)
        for name in ("sums", "inner", "last"):
            values[name] = json.loads(values[name])
        out[(int(row["target_id"]), float(row["bucket"]))] = values
    return out


@pytest.mark.real
def test_on_postgresql_the_writer_gives_the_same_rows(seeded: str, postgres: Config) -> None:
    on_sqlite, on_postgres = _sum_rows(seeded), _sum_rows(postgres.database.reveal())
    assert len(on_sqlite) > len(NAMES) * 60  # hours of buckets for every replica
    _same(on_postgres, on_sqlite)


@pytest.mark.real
def test_on_postgresql_the_sums_give_the_direct_numbers(postgres: Config) -> None:
    _compare(postgres, NOW)  # EARLIER's reads are the same queries (compared on SQLite)
    _stall_rows_match(postgres)


def test_sums_still_being_built_leave_the_window_to_the_samples_path(
    tmp_path: Path, seeded: str
) -> None:
    """Sums that reach only 3 hours back (a first run catching up): the windows that end now
    are not read as sums plus hours of raw samples with their histograms (a burn round took
    266 s so at 200 replicas), but by the samples' path through the summary tiers; the
    numbers are the direct ones."""
    import shutil

    from sqlalchemy import delete, update

    from kneepoint.store.models import SloSumProgressRow

    for part in Path(seeded.removeprefix("sqlite:///")).parent.glob("k.db*"):  # with its WAL
        shutil.copy(part, tmp_path / part.name)
    config = _config(tmp_path, database=f"sqlite:///{tmp_path / 'k.db'}")
    behind = (NOW - 3 * 3600) // 300 * 300
    with open_store(config.database).begin() as session:
        session.execute(delete(SloSumRow).where(SloSumRow.bucket >= behind))
        session.execute(update(SloSumProgressRow).values(until=behind))
    raw_rows: list[int] = []
    original = slo_sums.raw

    def spy(*args: Any, **kwargs: Any) -> pd.DataFrame:
        frame = original(*args, **kwargs)
        raw_rows.append(len(frame))
        return frame

    slo_sums.raw = spy  # type: ignore[assignment]
    try:
        _compare(config, NOW)
    finally:
        slo_sums.raw = original  # type: ignore[assignment]
    assert sum(raw_rows) <= len(NAMES) * 8 * 2 * 3  # partial buckets only, never hours


def test_a_burn_round_reads_the_end_bucket_once(tmp_path: Path, seeded: str) -> None:
    """Every window of a round ends at the same time: the newest summed row of each replica
    and the samples of the partial bucket at the end are read once for all of them."""
    config = _config(tmp_path, database=seeded)
    tails: list[float] = []
    original = slo_sums.raw

    def spy(session: Any, ids: Any, start: float, end: float, closed: bool) -> pd.DataFrame:
        if closed:
            tails.append(start)
        return original(session, ids, start, end, closed)

    slo_sums.raw = spy  # type: ignore[assignment]
    try:
        with open_store(config.database)() as session:
            burn_rates(session, config, NOW)
    finally:
        slo_sums.raw = original  # type: ignore[assignment]
    assert len(tails) == 1


@pytest.mark.real
def test_on_postgresql_every_connection_runs_without_jit(postgres: Config) -> None:
    """JIT compiling the stall candidates' query took 7.9 s of 8.8 s at 200 replicas: the
    store's connections have jit off (kneepoint/store/db.py), after a rollback too, and the
    candidates are read under it."""
    from sqlalchemy import text

    seen: list[str] = []
    original = queries.read_bulk

    def spy(session: Any, query: Any) -> pd.DataFrame:
        seen.append(session.execute(text("SELECT current_setting('jit')")).scalar())
        return original(session, query)

    sessions = open_store(postgres.database)
    with sessions() as session:
        ids = sorted(t.id for t in queries.targets(session).values())
        queries.read_bulk = spy  # type: ignore[assignment]
        try:
            stall_rows.candidates(session, ids, NOW - 6 * 3600, NOW)
        finally:
            queries.read_bulk = original  # type: ignore[assignment]
        session.rollback()
        after = session.execute(text("SELECT current_setting('jit')")).scalar()
    with open_store(postgres.database)() as other:
        fresh = other.execute(text("SELECT current_setting('jit')")).scalar()
    assert seen == ["off"] and after == "off" and fresh == "off"


def test_raw_windows_slice_one_read_of_stall_candidates(tmp_path: Path, seeded: str) -> None:
    """The windows a round reads from raw samples alone (an hour and less) take their stall
    candidates from one read over the longest: the same stalled seconds as a read of their
    own, with windows starting inside the stalled replica's frozen stretch."""
    config = _config(tmp_path, database=seeded)
    reads: list[float] = []
    original = stall_rows.candidates

    def spy(session: Any, ids: Any, start: float, end: float) -> pd.DataFrame:
        reads.append(start)
        return original(session, ids, start, end)

    with open_store(config.database)() as session:
        names = {name: row.id for name, row in queries.targets(session).items()}
        ids = sorted(names.values())
        shared = evaluate.Shared(raw_since=NOW - 3600)
        stalled = []
        for start in (NOW - 3500, NOW - 3400, NOW - 3600, NOW - 1800):
            direct = evaluate._stalled_in_store(session, config, ids, start, NOW)
            own = original(session, ids, start, NOW)
            stall_rows.candidates = spy  # type: ignore[assignment]
            try:
                mine = evaluate._stalled_in_store(session, config, ids, start, NOW, shared)
                rows = shared.stall_candidates(session, ids, start, NOW)
            finally:
                stall_rows.candidates = original  # type: ignore[assignment]
            assert mine == direct
            pd.testing.assert_frame_equal(rows, own, check_dtype=False)
            stalled.append(direct.get(names["stalled"], 0.0))
    assert reads == [NOW - 3600]
    # The frozen stretch (until about NOW - 3,260 s) cut at different starts.
    assert stalled[0] > stalled[1] > 0 and stalled[2] > stalled[0] and stalled[3] == 0


def test_a_burn_round_reads_every_windows_start_bucket_in_one_statement(
    tmp_path: Path, seeded: str
) -> None:
    """The samples the sums' path reads (with their histograms) come in two statements per
    round, whatever the number of windows: the partial bucket at the start of every window
    together, and the one at the end; the 5-minute window, inside that end read, takes its
    numbers from it, not from the samples' path (queries.replica_frame). Same numbers:
    test_the_sums_give_the_direct_numbers."""
    from sqlalchemy import event

    config = _config(tmp_path, database=seeded)
    # Every replica with samples in every window (the stale one's are left to the samples'
    # path, which finds none).
    live = [t for t in config.targets if t.name != "stale"]
    config = config.model_copy(update={"targets": live})
    statements: list[str] = []
    frames: list[float] = []
    original = queries.replica_frame

    def spy(session: Any, start: float, end: float, *args: Any, **kwargs: Any) -> pd.DataFrame:
        frames.append(end - start)
        return original(session, start, end, *args, **kwargs)

    def seen(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if "replica_samples" in statement and "hist_ttft" in statement:
            statements.append(statement)

    with open_store(config.database)() as session:
        engine = session.get_bind()
        event.listen(engine, "before_cursor_execute", seen)
        queries.replica_frame = spy  # type: ignore[assignment]
        try:
            burn_rates(session, config, NOW)
        finally:
            queries.replica_frame = original  # type: ignore[assignment]
            event.remove(engine, "before_cursor_execute", seen)
    assert len(slo.windows_needed()) > 2
    assert frames == []
    assert len(statements) == 2


def test_a_burn_round_reads_no_stall_rows(tmp_path: Path, seeded: str) -> None:
    """Stalled seconds are summed per bucket: a burn-rate round with an availability SLO
    asks the database for no stall candidates (five reads of every window's rows before)."""
    config = _config(tmp_path, database=seeded)
    assert any(s.kind == "availability" for s in config.slos)
    reads: list[float] = []
    original = stall_rows.candidates

    def spy(session: Any, ids: Any, start: float, end: float) -> pd.DataFrame:
        reads.append(end - start)
        return original(session, ids, start, end)

    stall_rows.candidates = spy  # type: ignore[assignment]
    try:
        with open_store(config.database)() as session:
            rates = burn_rates(session, config, NOW)
    finally:
        stall_rows.candidates = original  # type: ignore[assignment]
    assert reads == []
    assert any(v for v in rates["up"].values())  # the availability SLO was judged


def test_rows_summed_before_stalls_were_read_from_the_candidate_rows(
    tmp_path: Path, seeded: str
) -> None:
    """Rows an older version wrote keep no stall state: the windows that need them take
    their stalled seconds from the store's candidate rows, as before (the same seconds as
    `_stalled_in_store`), and the other numbers from the sums all the same."""
    import json
    import shutil

    from sqlalchemy import update

    for part in Path(seeded.removeprefix("sqlite:///")).parent.glob("k.db*"):  # with its WAL
        shutil.copy(part, tmp_path / part.name)
    config = _config(tmp_path, database=f"sqlite:///{tmp_path / 'k.db'}")
    sessions = open_store(config.database)
    with sessions.begin() as session:
        for row in session.execute(select(SloSumRow.__table__)).mappings().all():
            parts = {k: json.loads(row[k]) for k in ("sums", "inner", "last")}
            for key in ("st", "w", "wi"):
                for value in parts.values():
                    value.pop(key, None)
            session.execute(
                update(SloSumRow)
                .where(SloSumRow.target_id == row["target_id"], SloSumRow.bucket == row["bucket"])
                .values(**{k: json.dumps(v) for k, v in parts.items()})
            )
    with sessions() as session:
        ids = sorted(t.id for t in queries.targets(session).values())
        layouts = queries.histogram_layouts(session)
        windows, credited = evaluate._summed(session, NOW - 3600, NOW, ids, layouts)
        assert len(windows) == len(ids) - 1 and credited == {}  # all but the stale one
        measured = evaluate.measure(session, config, NOW - 3600, NOW)
        stalled = evaluate._stalled_in_store(session, config, ids, NOW - 3600, NOW)
    assert measured.availability is not None
    assert sum(stalled.values()) > 0
    assert measured.availability.stalled == pytest.approx(sum(stalled.values()))


def test_a_burn_round_decodes_a_histogram_once_per_window_start(
    tmp_path: Path, seeded: str
) -> None:
    """A window's partial start bucket ends at its bucket's last sample, whose histograms
    its sums row keeps decoded (`last`): only the first sample in the window is decoded
    there; the samples at the end are decoded once for every window (before: both ends of
    every partial bucket, and the 5-minute window's samples again)."""
    config = _config(tmp_path, database=seeded)
    decoded: list[object] = []
    original = slo_sums._hist

    def spy(text: object, layouts: Any) -> Any:
        decoded.append(text)
        return original(text, layouts)

    slo_sums._hist = spy  # type: ignore[assignment]
    try:
        with open_store(config.database)() as session:
            burn_rates(session, config, NOW)
    finally:
        slo_sums._hist = original  # type: ignore[assignment]
    with open_store(config.database)() as session:
        # The histograms each replica's latest sample has (the stale one's are old).
        latest = session.execute(
            select(ReplicaSampleRow).where(ReplicaSampleRow.ts > NOW - 600)
        ).scalars()
        present = {(r.target_id, h) for r in latest for h in HISTOGRAMS if getattr(r, f"hist_{h}")}
    windows = len(slo.windows_needed())
    # One sample per window start, two at the end (a counter reset adds two, rarely).
    assert 0 < len(decoded) <= len(present) * (windows + 2) + 4
