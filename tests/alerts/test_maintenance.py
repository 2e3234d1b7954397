"""Maintenance windows: when they last (one-off, and cron across midnight in UTC), config
errors in one sentence, budgets that leave them out (with and without a window over a burning
SLO), and alerts muted while they last and sent once they end."""

from __future__ import annotations

import copy
import itertools
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from alerts import maintenance
from alerts.evaluate import evaluate_once, slo_reports
from alerts.lifecycle import FIRING
from collectors.engines.vllm import parse_vllm
from kneepoint.config import ConfigError, Maintenance, load_config, parse_config
from kneepoint.samples import Histogram
from kneepoint.store.db import open_store
from kneepoint.store.models import AlertRow, NotificationRow
from kneepoint.store.writer import ensure_targets, record_replica
from tests.conftest import VLLM_032, migrated, read

DAY = 86400.0


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def window(**fields: object) -> Maintenance:
    return Maintenance.model_validate({"name": "w", **fields})


def test_a_nightly_window_crosses_midnight_in_utc() -> None:
    nightly = window(cron="30 23 * * *", duration="2h")
    assert nightly.duration is not None
    since, until = at("2026-03-28T00:00:00"), at("2026-03-31T00:00:00")  # EU DST starts 3-29
    found = maintenance.occurrences([nightly], since, until)
    # The one that began the evening before `since` still covers its first 90 minutes.
    starts = [datetime.fromtimestamp(o.start, UTC) for o in found]
    assert starts[0] == datetime.fromtimestamp(since, UTC) - timedelta(minutes=30)
    assert all((s.hour, s.minute) == (23, 30) for s in starts)
    assert [b - a for a, b in itertools.pairwise(starts)] == [timedelta(days=1)] * (len(starts) - 1)
    assert all(o.end - o.start == nightly.duration for o in found)
    # Each window runs past midnight into the next day, and none is cut at the day's end.
    assert all(
        datetime.fromtimestamp(o.end, UTC).day != s.day for o, s in zip(found, starts, strict=True)
    )
    # Three days from midnight: the first morning's end, two whole windows, the last
    # evening's start: as much as one window a day.
    cut = maintenance.excluded([nightly], "any", since, until)
    assert sum(b - a for a, b in cut) == pytest.approx((until - since) / DAY * nightly.duration)
    # Active at 00:59 the next morning, not at 01:30 (half-open), again at 23:30.
    morning = at("2026-03-29T00:59:00")
    assert maintenance.covering([nightly], "r", morning) is not None
    assert maintenance.covering([nightly], "r", morning + 31 * 60) is None
    assert maintenance.covering([nightly], "r", at("2026-03-29T23:30:00")) is not None


def test_a_weekly_window_by_day_name_and_the_next_one() -> None:
    sundays = window(cron="0 2 * * SUN", duration="3h")
    now = at("2026-07-01T12:00:00")  # a Wednesday
    coming = maintenance.next_one([sundays], now)
    assert coming is not None
    start = datetime.fromtimestamp(coming.start, UTC)
    assert start.strftime("%A %H:%M") == "Sunday 02:00"
    assert timedelta(0) < start - datetime.fromtimestamp(now, UTC) <= timedelta(days=7)
    assert maintenance.active([sundays], now) == []
    assert maintenance.active([sundays], coming.start + 3600)[0].name == "w"


def test_one_off_windows_cover_their_replicas_and_the_fleet_only_when_over_all() -> None:
    some = window(start="2026-05-01T10:00:00Z", end="2026-05-01T11:00:00Z", replicas=["a"])
    every = Maintenance(name="all", start=some.start, end=some.end)
    inside = at("2026-05-01T10:30:00")
    assert maintenance.covering([some], "a", inside) is not None
    assert maintenance.covering([some], "b", inside) is None
    assert maintenance.covering([some], "", inside) is None  # the fleet: not all replicas
    assert maintenance.covering([every], "", inside) is not None
    assert maintenance.covering([some], "a", at("2026-05-01T11:00:00")) is None
    # A time zone in the config is honoured; none means UTC.
    shifted = window(start="2026-05-01T12:00:00+02:00", end="2026-05-01T13:00:00+02:00")
    assert maintenance.covering([shifted], "a", inside) is not None


def test_the_time_left_after_the_windows() -> None:
    cut = maintenance.merge([(30.0, 40.0), (10.0, 20.0), (15.0, 25.0), (40.0, 45.0)])
    assert cut == [(10.0, 25.0), (30.0, 45.0)]
    assert maintenance.remaining(0.0, 100.0, cut) == [(0.0, 10.0), (25.0, 30.0), (45.0, 100.0)]
    assert maintenance.remaining(12.0, 28.0, cut) == [(25.0, 28.0)]
    assert maintenance.remaining(0.0, 100.0, [(0.0, 100.0)]) == []


BAD_WINDOWS = {
    "an end before the start": (
        "{name: w, start: 2026-01-01T02:00:00Z, end: 2026-01-01T01:00:00Z}",
        "maintenance[0]: must end after it starts",
    ),
    "a one-off without an end": (
        "{name: w, start: 2026-01-01T02:00:00Z}",
        "maintenance[0]: a one-off window needs both start and end",
    ),
    "a cron without a duration": (
        "{name: w, cron: '0 2 * * SUN'}",
        "maintenance[0]: a recurring window needs both cron and duration",
    ),
    "both kinds at once": (
        "{name: w, cron: '0 2 * * SUN', duration: 1h, start: 2026-01-01T00:00:00Z, "
        "end: 2026-01-01T01:00:00Z}",
        "maintenance[0]: is either one-off (start, end) or recurring (cron, duration), not both",
    ),
    "neither kind": (
        "{name: w}",
        "maintenance[0]: needs start and end (one-off) or cron and duration (recurring)",
    ),
    "four cron fields": (
        "{name: w, cron: '0 2 * *', duration: 1h}",
        "maintenance[0].cron: cron '0 2 * *' must have five fields",
    ),
    "an hour past 23": (
        "{name: w, cron: '0 24 * * *', duration: 1h}",
        "maintenance[0].cron: cron '0 24 * * *' is not valid",
    ),
    "a numbered day of the week": (
        "{name: w, cron: '0 2 * * 0', duration: 1h}",
        "maintenance[0].cron: cron '0 2 * * 0' must name days of the week",
    ),
    "a zero duration": (
        "{name: w, cron: '0 2 * * SUN', duration: 0s}",
        "maintenance[0].duration: ",
    ),
    "an unknown replica": (
        "{name: w, cron: '0 2 * * SUN', duration: 1h, replicas: [nope]}",
        "maintenance[0].replicas names unknown replica 'nope'",
    ),
}


@pytest.mark.parametrize("case", BAD_WINDOWS, ids=list(BAD_WINDOWS))
def test_a_bad_window_is_one_clear_sentence(case: str) -> None:
    entry, expected = BAD_WINDOWS[case]
    text = (
        "targets: [{name: a, kind: vllm, url: 'http://127.0.0.1:9/metrics'}]\n"
        f"maintenance: [{entry}]\n"
    )
    with pytest.raises(ConfigError) as raised:
        parse_config(text)
    message = str(raised.value)
    assert message.startswith(f"kneepoint.yaml: {expected}")
    assert "\n" not in message and message.count(". ") == 0


# --- budgets over a store: an hour and a half, the last half hour burning ---------------

STEP = 300.0
BOUNDS_AT = 0.25  # the latency SLO's threshold, a bucket bound of vLLM's TTFT histogram


def burning_store(tmp_path: Path, now: float, extra: str = "") -> Path:
    """Two replicas scraped every five minutes for 90 minutes: b always has a few slow and
    failed requests (finish reason error), well within the objective; a has none for the
    first hour and a fifth of its requests in the last half hour (bad_from on)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    config_file = tmp_path / "kneepoint.yaml"
    config_file.write_text(f"""
database: sqlite:///{tmp_path / "k.db"}
targets:
  - {{name: a, kind: vllm, url: "http://127.0.0.1:9/a"}}
  - {{name: b, kind: vllm, url: "http://127.0.0.1:9/b"}}
channels: [{{name: hook, type: webhook, url: "http://127.0.0.1:9/hook"}}]
slos:
  - {{name: ttft, metric: ttft, threshold: {BOUNDS_AT}s, objective: 0.99, channels: [hook]}}
  - {{name: up, kind: availability, objective: 0.99, channels: [hook]}}
{extra}""")
    config = load_config(migrated(config_file))
    sessions = open_store(config.database)
    base = parse_vllm(read(VLLM_032))
    bounds = base.histograms["ttft"].bounds
    fast = bounds.index(BOUNDS_AT)
    with sessions.begin() as session:
        ids = ensure_targets(session, [(t.name, t.kind, t.url) for t in config.targets])
        for name in ("a", "b"):
            good = bad = 0.0
            for step in range(19):  # 0 .. 90 minutes
                ts = now - 90 * 60 + step * STEP
                if step > 0:
                    burning = name == "a" and ts > bad_from(now)
                    good += 80.0 if burning else 100.0
                    # b always fails a few, well within the objective; a burns at the end.
                    bad += 20.0 if burning else (0.25 if name == "b" else 0.0)
                sample = copy.deepcopy(base)
                finite = tuple(good if i >= fast else 0.0 for i in range(len(bounds) - 1))
                sample.histograms["ttft"] = Histogram(bounds, (*finite, good + bad), 0.1 * good)
                sample.gauges.update(requests_running=0.0, requests_waiting=0.0)
                sample.counters.update(
                    prompt_tokens=10 * (good + bad),
                    generation_tokens=50 * (good + bad),
                    requests_finished_stop=good,
                    requests_finished_length=0.0,
                    requests_finished_abort=0.0,
                    requests_finished_error=bad,
                    requests_finished_repetition=0.0,
                )
                record_replica(session, ids[name], ts, sample)
    return config_file


def bad_from(now: float) -> float:
    return now - 30 * 60


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat()


def test_a_window_over_the_burn_leaves_the_budget_untouched(tmp_path: Path) -> None:
    now = float(int(time.time()))
    plain = load_config(burning_store(tmp_path / "plain", now))
    # The window covers the burning half hour (and a little more) on every replica.
    over = f"maintenance: [{{name: fix, start: '{iso(bad_from(now) - 60)}', end: '{iso(now)}'}}]"
    covered = load_config(burning_store(tmp_path / "covered", now, over))
    # The same store cut off where the window starts: what the budget was before it.
    before = load_config(burning_store(tmp_path / "before", now))
    with open_store(plain.database)() as session:
        burnt = {r.slo.name: r for r in slo_reports(session, plain, now)}
    with open_store(covered.database)() as session:
        kept = {r.slo.name: r for r in slo_reports(session, covered, now)}
    with open_store(before.database)() as session:
        earlier = {r.slo.name: r for r in slo_reports(session, before, bad_from(now) - 60)}
    for name in ("ttft", "up"):
        spent, untouched = burnt[name].budget, kept[name].budget
        assert spent.budget_left is not None and untouched.budget_left is not None
        assert spent.budget_left < 0  # without the window: overspent
        assert 0 < untouched.budget_left < 1  # b's few failures before the window count
        # With it: exactly the budget as it stood when the window began.
        assert untouched.budget_left == pytest.approx(earlier[name].budget.budget_left)
        assert untouched.compliance == pytest.approx(earlier[name].budget.compliance)
        assert burnt[name].burning and not kept[name].burning
        # The short windows lie wholly in maintenance: nothing to judge, no burn rate.
        assert kept[name].rates[300.0] is None and burnt[name].rates[300.0] is not None


def test_a_window_over_one_replica_leaves_only_its_time_out(tmp_path: Path) -> None:
    now = float(int(time.time()))
    on_a = (
        f"maintenance: [{{name: fix-a, start: '{iso(bad_from(now) - 60)}', "
        f"end: '{iso(now)}', replicas: [a]}}]"
    )
    on_b = on_a.replace("fix-a", "fix-b").replace("[a]", "[b]")
    config_a = load_config(burning_store(tmp_path / "a", now, on_a))
    config_b = load_config(burning_store(tmp_path / "b", now, on_b))
    with open_store(config_a.database)() as session:
        (without_a,) = [r for r in slo_reports(session, config_a, now) if r.slo.name == "up"]
    with open_store(config_b.database)() as session:
        (without_b,) = [r for r in slo_reports(session, config_b, now) if r.slo.name == "up"]
    # Leaving a's burning half hour out keeps the budget; leaving b's out leaves it spent.
    left_a, left_b = without_a.budget.budget_left, without_b.budget.budget_left
    assert left_a is not None and left_b is not None
    assert left_b < 0 < left_a < 1


# --- muting -------------------------------------------------------------------------

WATCH = """
rules:
  - {name: kv-watch, metric: kv_cache_occupancy, op: ">=", threshold: 0, channels: [hook]}
"""


def rows_of(config_file: Path) -> list[tuple[str, str, str, str | None]]:
    config = load_config(config_file)
    with open_store(config.database)() as session:
        alerts = {a.fingerprint: a for a in session.scalars(select(AlertRow))}
        return [
            (alerts[n.fingerprint].rule, alerts[n.fingerprint].replica, n.state, n.last_error)
            for n in session.scalars(select(NotificationRow).order_by(NotificationRow.id))
        ]


def evaluate_at(config_file: Path, now: float) -> None:
    config = load_config(config_file)
    with open_store(config.database).begin() as session:
        evaluate_once(session, config, now)


def test_alerts_are_muted_while_a_window_lasts_and_sent_once_it_ends(tmp_path: Path) -> None:
    now = float(int(time.time()))
    start, end = now - 600, now + 30
    window_yaml = (
        f"maintenance: [{{name: upgrade, start: '{iso(start)}', end: '{iso(end)}', "
        "replicas: [a]}]\n"
    )
    config_file = burning_store(tmp_path, now, window_yaml + WATCH)
    evaluate_at(config_file, now)
    config = load_config(config_file)
    with open_store(config.database)() as session:
        states = {(a.rule, a.replica): a.state for a in session.scalars(select(AlertRow))}
    # Evaluated on both replicas: firing on a too (its state is kept and shown)...
    assert states[("kv-watch", "a")] == FIRING and states[("kv-watch", "b")] == FIRING
    sent = rows_of(config_file)
    # ... but only b's news goes out; a's is logged as muted, naming the window.
    assert ("kv-watch", "b", "pending", None) in sent
    (muted,) = [r for r in sent if r[:2] == ("kv-watch", "a")]
    assert muted[2] == "muted" and muted[3] is not None and "'upgrade'" in muted[3]
    # The fleet's burn alerts are not muted by a window over one replica only.
    fleet = [r for r in sent if r[1] == ""]
    assert fleet and all(r[2] == "pending" for r in fleet)

    evaluate_at(config_file, now + 10)  # still inside: nothing more for a
    assert [r for r in rows_of(config_file) if r[:2] == ("kv-watch", "a")] == [muted]

    evaluate_at(config_file, end + 1)  # the window is over: a's alert still fires, so it is sent
    after = [r for r in rows_of(config_file) if r[:2] == ("kv-watch", "a")]
    assert after == [muted, ("kv-watch", "a", "pending", None)]
    evaluate_at(config_file, end + 30)  # once
    assert [r for r in rows_of(config_file) if r[:2] == ("kv-watch", "a")] == after


def test_no_reminder_while_a_window_lasts_and_one_message_when_it_ends(tmp_path: Path) -> None:
    now = float(int(time.time()))
    end = now + 120
    window_yaml = (
        "repeat_interval: 20s\n"
        f"maintenance: [{{name: upgrade, start: '{iso(now - 600)}', end: '{iso(end)}', "
        "replicas: [a]}]\n"
    )
    config_file = burning_store(tmp_path, now, window_yaml + WATCH)
    for moment in (now, now + 30, now + 60):  # reminders fall due on b, and would on a
        evaluate_at(config_file, moment)
    on_a = [r for r in rows_of(config_file) if r[:2] == ("kv-watch", "a")]
    on_b = [r for r in rows_of(config_file) if r[:2] == ("kv-watch", "b")]
    assert [r[2] for r in on_a] == ["muted"]  # the firing, muted once; no muted reminders
    assert len(on_b) > 1  # b's reminders went out meanwhile
    for moment in (end + 1, end + 10):
        evaluate_at(config_file, moment)
    after = [r for r in rows_of(config_file) if r[:2] == ("kv-watch", "a")]
    assert [r[2] for r in after] == ["muted", "pending"]


def test_a_window_over_every_replica_mutes_the_fleet_burn_alerts(tmp_path: Path) -> None:
    now = float(int(time.time()))
    everything = f"maintenance: [{{name: all, start: '{iso(now - 60)}', end: '{iso(now + 60)}'}}]"
    config_file = burning_store(tmp_path, now, everything)
    evaluate_at(config_file, now)
    sent = rows_of(config_file)
    config = load_config(config_file)
    with open_store(config.database)() as session:
        firing = [a.rule for a in session.scalars(select(AlertRow)) if a.state == FIRING]
    # The last minute is left out, yet the burn before it still fires; it is only muted.
    assert any(rule.startswith("up-burn") for rule in firing)
    assert sent and all(state == "muted" for _, _, state, _ in sent)


def test_the_slos_page_shows_the_windows_and_says_budgets_leave_them_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from streamlit.testing.v1 import AppTest

    from app.registry import PAGES_DIR

    now = time.time()
    windows = (
        "maintenance:\n"
        f"  - {{name: upgrade, start: '{iso(now - 60)}', end: '{iso(now + 3600)}', "
        "replicas: [a]}\n"
        "  - {name: nightly, cron: '30 23 * * *', duration: 2h}\n"
    )
    config_file = burning_store(tmp_path, float(int(now)), windows)
    monkeypatch.setenv("KNEEPOINT_CONFIG", str(config_file))
    page = AppTest.from_file(str(PAGES_DIR / "slos.py"), default_timeout=60).run()
    assert not page.exception, [e.value for e in page.exception]
    headers = [h.value for h in page.subheader]
    assert "up: availability ≥ 99.00% over 30d" in headers
    assert "Maintenance windows" in headers
    assert "leave maintenance windows out" in page.caption[0].value
    assert any(
        "In maintenance now: upgrade" in w.value and "over a" in w.value for w in page.warning
    )
    # The next one to start is tonight's (or, right at 23:30, tomorrow's) nightly window.
    config = load_config(config_file)
    coming = maintenance.next_one(config.maintenance, now)
    assert coming is not None and coming.name == "nightly"
    assert any(
        f"Next: nightly from {datetime.fromtimestamp(coming.start, UTC):%Y-%m-%d %H:%M}" in i.value
        for i in page.info
    )
    table = page.dataframe[-1].value  # headers for people, yes/no (app/tables.py)
    assert list(table["Window"]) == ["upgrade", "nightly"]
    nightly_now = any(o.name == "nightly" for o in maintenance.active(config.maintenance, now))
    assert list(table["Now"]) == ["yes", "yes" if nightly_now else "no"]
    assert table["When"][1] == "cron 30 23 * * * (UTC) for 2h"
