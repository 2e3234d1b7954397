"""SLO replay (alerts/slo_replay.py) over a seeded store, against a hand computation: six hours
of one replica's TTFT, a sample in the middle of every 5-minute bucket, each bucket's requests
split into fast (≤ 0.25 s), middle (0.25–0.5 s) and slow (> 0.5 s); an hour of them goes bad."""

from __future__ import annotations

import copy
import json
import math
import time
from pathlib import Path

import pytest

from alerts import slo_replay
from alerts.evaluate import advance_sums
from alerts.evaluate import slo_replay as replay_store
from collectors.engines.vllm import parse_vllm
from kneepoint.config import Slo, load_config
from kneepoint.samples import Histogram
from kneepoint.store.db import open_store
from kneepoint.store.writer import ensure_targets, record_replica
from tests.conftest import VLLM_032, read

STEP = 300.0
BUCKETS = 72  # buckets 1..72 carry traffic (bucket 0 holds the first sample, all zeros)
BAD = range(49, 61)  # twelve buckets: an hour
NORMAL = (990, 8, 2)  # fast, middle, slow per bucket
WORSE = (700, 100, 200)
HOUR, DAY = 3600.0, 86400.0


def traffic(k: int) -> tuple[int, int, int]:
    return (0, 0, 0) if k == 0 else WORSE if k in BAD else NORMAL


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float, float]:
    """The store, the window's start (bucket 0's) and end (the last bucket's end)."""
    tmp = tmp_path_factory.mktemp("replay")
    start = math.floor(time.time() / STEP) * STEP - (BUCKETS + 3) * STEP
    end = start + (BUCKETS + 1) * STEP
    config_file = tmp / "kneepoint.yaml"
    config_file.write_text(f"""
database: sqlite:///{tmp / "k.db"}
targets: [{{name: a, kind: vllm, url: "http://127.0.0.1:9/metrics"}}]
slos:
  - {{name: ttft-fast, metric: ttft, threshold: 0.5s, objective: 0.99}}
  - {{name: e2e, metric: e2e, threshold: 5s, objective: 0.99}}
""")
    config = load_config(config_file)
    sessions = open_store(config.database)
    base = parse_vllm(read(VLLM_032))
    bounds = base.histograms["ttft"].bounds
    low, high = bounds.index(0.25), bounds.index(0.5)
    fast = middle = slow = 0.0
    with sessions.begin() as session:
        ids = ensure_targets(session, [("a", "vllm", "http://127.0.0.1:9/metrics")])
        for k in range(BUCKETS + 1):
            f, m, s = traffic(k)
            fast, middle, slow = fast + f, middle + m, slow + s
            counts = tuple(
                0.0 if i < low else fast if i < high else fast + middle
                for i in range(len(bounds) - 1)
            )
            sample = copy.deepcopy(base)
            sample.histograms["ttft"] = Histogram(bounds, (*counts, fast + middle + slow), 0.0)
            record_replica(session, ids["a"], start + k * STEP + STEP / 2, sample)
    with sessions.begin() as session:
        while advance_sums(session, config, end + 120.0):
            pass
    return config_file, start, end


def run(store: tuple[Path, float, float], proposal: Slo) -> list[slo_replay.Replayed]:
    config_file, start, end = store
    config = load_config(config_file)
    with open_store(config.database)() as session:
        return replay_store(session, config, proposal, end, end - start)


# By hand, over the 72 buckets: requests, and those at or under each bound.
TOTAL = 60 * 1000 + 12 * 1000
AT_025 = 60 * 990 + 12 * 700
AT_050 = 60 * (990 + 8) + 12 * (700 + 100)


def expected_firings(
    bad_per_bucket: list[int], total_per_bucket: list[int], objective: float, window: float
) -> list[tuple[str, float, int, int | None]]:
    """The burn alerts by definition, from the seeded counts: at each bucket's end, per
    (long, short, budget share, severity) of the SRE workbook's scheme, both windows' bad
    share ÷ (1 − objective) above budget share × window ÷ long. (severity, long, first bucket
    firing, first bucket not firing again or None)."""
    scheme = [
        (1 * HOUR, 300.0, 0.02, "page"),
        (6 * HOUR, 1800.0, 0.05, "page"),
        (24 * HOUR, 2 * HOUR, 0.10, "ticket"),
        (72 * HOUR, 6 * HOUR, 0.10, "ticket"),
    ]
    out = []
    for long, short, share, severity in scheme:
        factor = share * window / long
        began: int | None = None
        for k in range(len(bad_per_bucket)):

            def burn(seconds: float, k: int = k) -> float | None:
                first = max(0, k + 1 - int(seconds // STEP))
                total = sum(total_per_bucket[first : k + 1])
                if total == 0:
                    return None
                return sum(bad_per_bucket[first : k + 1]) / total / (1 - objective)

            a, b = burn(long), burn(short)
            firing = a is not None and b is not None and a > factor and b > factor
            if firing and began is None:
                began = k
            elif not firing and began is not None:
                out.append((severity, long, began, k))
                began = None
        if began is not None:
            out.append((severity, long, began, None))
    return sorted(out, key=lambda f: (f[2], f[1]))


def as_tuples(
    firings: list[slo_replay.Firing], start: float
) -> list[tuple[str, float, int, int | None]]:
    """A replayed firing as (severity, long, bucket index of its first step, of its end)."""

    def index(ts: float) -> int:
        return round((ts - start) / STEP) - 1  # the step ending bucket k is at start+(k+1)·STEP

    return [
        (f.window.severity, f.window.long, index(f.start), None if f.end is None else index(f.end))
        for f in firings
    ]


def slow_at(bound: str) -> list[int]:
    return [(t[2] if bound == "0.5" else t[1] + t[2]) for t in map(traffic, range(BUCKETS + 1))]


TOTALS = [sum(traffic(k)) for k in range(BUCKETS + 1)]


def test_a_threshold_at_a_bound_is_exact(store: tuple[Path, float, float]) -> None:
    proposal = Slo(name="p", metric="ttft", threshold=0.5, objective=0.995, window=28 * DAY)
    proposed, configured = run(store, proposal)
    assert (proposed.role, configured.role, configured.slo.name) == (
        "proposed",
        "configured",
        "ttft-fast",  # the configured SLO on the same metric, not the e2e one
    )
    assert proposed.exact == pytest.approx(AT_050 / TOTAL)
    assert proposed.spent(proposed.exact) == pytest.approx((1 - AT_050 / TOTAL) / 0.005)
    assert proposed.interpolated_estimate is None and proposed.lower_bound is None
    assert proposed.firings is not None
    got = as_tuples(proposed.firings["exact"], store[1])
    assert got == expected_firings(slow_at("0.5"), TOTALS, 0.995, 28 * DAY)
    # The one-hour page, by hand: the 1h window holds j bad buckets of 200 slow in 1000 and
    # 12 − j of 2: (198 j + 24) / 12000 / 0.005 > 0.02 × 28 d / 1 h = 13.44 first at j = 4
    # (bucket 52); its 5-minute window falls to 0.4 at the first good bucket (61).
    assert ("page", HOUR, 52, 61) in got
    # The configured SLO over the same window: the same count, its own objective and factors.
    assert configured.exact == pytest.approx(AT_050 / TOTAL)
    assert configured.spent(configured.exact) == pytest.approx((1 - AT_050 / TOTAL) / 0.01)
    assert configured.firings is not None
    assert as_tuples(configured.firings["exact"], store[1]) == expected_firings(
        slow_at("0.5"), TOTALS, 0.99, 30 * DAY
    )


def test_a_threshold_between_bounds_is_a_range_and_a_labelled_estimate(
    store: tuple[Path, float, float],
) -> None:
    proposal = Slo(name="p", metric="ttft", threshold=0.3, objective=0.995, window=28 * DAY)
    proposed = run(store, proposal)[0]
    assert proposed.exact is None
    assert (proposed.lower_bound, proposed.upper_bound) == (0.25, 0.5)
    assert proposed.at_lower_bound == pytest.approx(AT_025 / TOTAL)
    assert proposed.at_upper_bound == pytest.approx(AT_050 / TOTAL)
    # Linear within the bucket: 0.3 s is a fifth of the way from 0.25 s to 0.5 s.
    estimate = (AT_025 + (AT_050 - AT_025) * (0.3 - 0.25) / (0.5 - 0.25)) / TOTAL
    assert proposed.interpolated_estimate == pytest.approx(estimate)
    assert proposed.firings is not None
    assert set(proposed.firings) == {"at_lower_bound", "at_upper_bound"}
    assert as_tuples(proposed.firings["at_lower_bound"], store[1]) == expected_firings(
        slow_at("0.25"), TOTALS, 0.995, 28 * DAY
    )
    assert as_tuples(proposed.firings["at_upper_bound"], store[1]) == expected_firings(
        slow_at("0.5"), TOTALS, 0.995, 28 * DAY
    )
    # At 0.25 s a good bucket's 1 % is slow: 2× the budget, above the 3-day ticket's factor
    # (0.1 × 28 / 3 ≈ 0.93) from the start; at 0.5 s (0.2 %, 0.4×) it never is in good times.
    assert as_tuples(proposed.firings["at_lower_bound"], store[1])[0][:3] == (
        "ticket",
        72 * HOUR,
        1,
    )
    shown = slo_replay.replayed_json(proposed)
    assert shown["compliance"]["exact"] is None
    assert shown["budget_spent"]["exact"] is None
    assert shown["compliance"]["interpolated_estimate"] == pytest.approx(estimate)
    assert shown["budget_spent"]["at_lower_bound"] == pytest.approx((1 - AT_025 / TOTAL) / 0.005)


def test_above_the_last_finite_bound_cannot_be_judged(store: tuple[Path, float, float]) -> None:
    proposal = Slo(name="p", metric="ttft", threshold=3000.0, objective=0.995)
    proposed = run(store, proposal)[0]
    assert proposed.problem is not None and "cannot be judged" in proposed.problem
    assert proposed.exact is None and proposed.interpolated_estimate is None
    assert proposed.at_upper_bound is None


def test_interpolated_estimate_below_the_first_bound_starts_at_zero() -> None:
    h = Histogram((0.1, 0.2, math.inf), (40.0, 80.0, 100.0), 0.0)
    assert slo_replay.interpolated_estimate(h, 0.05) == pytest.approx(20.0 / 100.0)
    assert slo_replay.bracket(0.05, h.bounds) == slo_replay.Bracket(False, 0.0, 0.1)
    assert slo_replay.bracket(0.2, h.bounds).exact


def test_the_cli_prints_the_range_and_labels_the_estimate(
    store: tuple[Path, float, float],
) -> None:
    from typer.testing import CliRunner

    from kneepoint.cli import app

    config_file, start, end = store
    args = ["slo", "replay", "--config", str(config_file), "--objective", "99.5"]
    args += ["--threshold", "300ms", "--window", f"{int(end - start)}s", "--end", str(end)]
    text = CliRunner().invoke(app, args)
    assert text.exit_code == 0, text.output
    assert "interpolated estimate" in text.output
    assert f"{AT_025 / TOTAL:.3%} (at 0.25 s, exact)" in text.output
    assert f"{AT_050 / TOTAL:.3%} (at 0.5 s, exact)" in text.output
    shown = CliRunner().invoke(app, [*args, "--json"])
    assert shown.exit_code == 0, shown.output
    proposed, configured = json.loads(shown.output)["replays"]
    assert proposed["compliance"]["exact"] is None
    assert proposed["compliance"]["at_upper_bound"] == pytest.approx(AT_050 / TOTAL)
    assert configured["compliance"]["exact"] == pytest.approx(AT_050 / TOTAL)
    bad = CliRunner().invoke(
        app, ["slo", "replay", "--config", str(config_file), "--objective", "99.5"]
    )
    assert bad.exit_code == 2 and "--threshold is required" in bad.output


def test_the_slos_page_replays_a_proposal(
    store: tuple[Path, float, float], monkeypatch: pytest.MonkeyPatch
) -> None:
    from streamlit.testing.v1 import AppTest

    from app.registry import PAGES_DIR

    monkeypatch.setenv("KNEEPOINT_CONFIG", str(store[0]))
    page = AppTest.from_file(str(PAGES_DIR / "slos.py"), default_timeout=60).run()
    assert not page.exception, [e.value for e in page.exception]
    page.text_input[0].set_value("300ms")
    page.text_input[1].set_value("7h")  # the seeded history, ending a few minutes ago
    page.button[0].click()
    page.run()
    assert not page.exception, [e.value for e in page.exception]
    shown = {m.label: m.value for m in page.metric}
    assert shown["Compliance at 0.25 s"] == f"{AT_025 / TOTAL:.3%}"
    assert shown["Compliance at 0.5 s"] == f"{AT_050 / TOTAL:.3%}"
    assert "Interpolated estimate" in shown
    assert any("interpolated estimate" in c.value for c in page.caption)
    assert any(m.value == "**proposed: proposed**" for m in page.markdown)
