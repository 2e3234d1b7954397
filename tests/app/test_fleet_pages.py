"""Pages at fleet size (app/fleet.py): above charts.FLEET_THRESHOLD replicas a page shows one
table worst first, a page of rows at a time, charts of the fleet's distribution, and tiles
only for the replicas chosen in the sidebar; a small fleet's pages are as they were."""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

import alerts.evaluate  # noqa: F401  the package: AppTest puts app/screens (with alerts.py) first
from app.registry import PAGES_DIR
from collectors.dcgm import parse_dcgm
from collectors.engines.vllm import parse_vllm
from dashboards.charts import CHANGES
from kneepoint.config import load_config
from kneepoint.distribution import MEDIAN, WORST
from kneepoint.store.db import open_store
from kneepoint.store.writer import ensure_targets, record_gpus, record_replica
from tests.conftest import DCGM_T4, VLLM_032, read
from tests.seed import seed

REPLICAS = 60  # over the threshold (8) and over a page of rows (50)
NODES = 12  # one GPU each: over the threshold too
ROWS = 50
# median, tail, the worst named, a chosen replica, the markers
MOST_TRACES = 2 + WORST + 1 + 1


def name(index: int) -> str:
    return f"replica-{index:02d}"


@pytest.fixture
def fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """60 vLLM replicas of 4 scrapes each: replica-59's KV cache the fullest, replica-00's
    prefix-cache hit rate the lowest; 12 GPU nodes, node-11 the hottest."""
    config = tmp_path / "kneepoint.yaml"
    targets = "".join(
        f'  - {{name: {name(i)}, kind: vllm, url: "http://127.0.0.1:9/{i}"}}\n'
        for i in range(REPLICAS)
    ) + "".join(
        f'  - {{name: node-{k}, kind: dcgm, url: "http://127.0.0.1:9/gpu{k}"}}\n'
        for k in range(NODES)
    )
    config.write_text(f"database: sqlite:///{tmp_path / 'k.db'}\nscrape_interval: 15s\ntargets:\n")
    config.write_text(config.read_text() + targets)
    settings = load_config(config)
    sessions = open_store(settings.database)
    base = parse_vllm(read(VLLM_032))
    (gpu,) = parse_dcgm(read(DCGM_T4), default_host="node")
    now = time.time()
    with sessions.begin() as session:
        ids = ensure_targets(session, [(t.name, t.kind, t.url) for t in settings.targets])
        for step in range(4):
            ts = now - 60 + step * 15
            for i in range(REPLICAS):
                sample = copy.deepcopy(base)
                share = i / REPLICAS
                sample.gauges["kv_cache_usage"] = share
                sample.counters["prefix_cache_queries"] = 1000.0 * (step + 1)
                sample.counters["prefix_cache_hits"] = 1000.0 * (step + 1) * share
                sample.counters["generation_tokens"] = 500.0 * step
                record_replica(session, ids[name(i)], ts, sample)
            for k in range(NODES):
                reading = dataclasses.replace(gpu, host=f"node-{k}", temperature_c=40.0 + k)
                record_gpus(session, ids[f"node-{k}"], ts, [reading])
    monkeypatch.setenv("KNEEPOINT_CONFIG", str(config))
    return config


def run(page: str, chosen: tuple[str, ...] = ()) -> AppTest:
    app = AppTest.from_file(str(PAGES_DIR / page), default_timeout=90)
    if chosen:
        app.query_params["replica"] = list(chosen)
    app.run()
    assert not app.exception, [e.value for e in app.exception]
    return app


def charts(app: AppTest) -> list[list[str]]:
    """Each chart's trace names."""
    return [
        [t.get("name") for t in json.loads(e.proto.spec)["data"]] for e in app.get("plotly_chart")
    ]


def table(app: AppTest, header: str) -> Any:
    """The one table with a column `header`, as sent to the browser."""
    (found,) = [d.value for d in app.dataframe if header in _frame(d.value).columns]
    return _frame(found)


def _frame(value: Any) -> Any:
    return getattr(value, "data", value)  # a Styler's frame


def captions(app: AppTest) -> list[str]:
    return [c.value for c in app.caption]


def test_capacity_shows_one_paged_table_worst_first_not_a_tile_block_per_replica(
    fleet: Path,
) -> None:
    app = run("capacity.py")
    labels = [m.label for m in app.metric]
    assert "KV occupancy" not in labels and "Sequence slots left" not in labels
    replicas = table(app, "Time KV full")
    assert len(replicas) == ROWS
    assert replicas["Replica"].iloc[0] == name(REPLICAS - 1)  # the fullest KV cache first
    assert f"rows 1–{ROWS} of {REPLICAS}" in captions(app)
    drawn = charts(app)
    assert len(drawn) == 4
    for names in drawn:
        assert names[0] == MEDIAN and len(names) <= MOST_TRACES, names
        assert sum(1 for n in names if n != CHANGES) <= 2 + WORST

    # The next page, then a filter: still at most a page, and the caption says which rows.
    pager = app.number_input(key=_key(app, "-page", 0))
    pager.set_value(2).run()
    assert len(table(app, "Time KV full")) == REPLICAS - ROWS
    assert f"rows {ROWS + 1}–{REPLICAS} of {REPLICAS}" in captions(app)
    app.text_input(key=_key(app, "-filter", 0)).input("replica-07").run()
    assert list(table(app, "Time KV full")["Replica"]) == ["replica-07"]


def _key(app: AppTest, suffix: str, index: int) -> str:
    """The key of the `index`-th pager widget ending in `suffix` (the replicas' table is
    the page's first)."""
    keys = [w.key for w in [*app.number_input, *app.text_input] if (w.key or "").endswith(suffix)]
    return keys[index]


def test_capacity_tiles_and_lines_for_the_replicas_chosen_in_the_sidebar(fleet: Path) -> None:
    app = run("capacity.py", chosen=("replica-07",))
    assert [m.label for m in app.metric].count("KV occupancy") == 1
    assert len(table(app, "Time KV full")) == ROWS  # the fleet's table stays
    for names in charts(app):
        assert "replica-07" in names and names[0] == MEDIAN
        assert len(names) <= MOST_TRACES


def test_prefix_cache_lists_the_lowest_hit_rate_first(fleet: Path) -> None:
    app = run("prefix_cache.py")
    assert not any(m.label.endswith(": hit rate") for m in app.metric)
    rates = table(app, "Hit rate")
    assert len(rates) == ROWS
    assert rates["Replica"].iloc[0] == name(0)
    hit_rate, computed = charts(app)
    # Low is bad for a hit rate (p5, the lowest named); high for prompt tokens computed.
    assert hit_rate[:3] == [MEDIAN, "fleet p5", f"worst: {name(0)}"], hit_rate
    assert computed[:2] == [MEDIAN, "fleet p95"], computed
    assert len(hit_rate) <= MOST_TRACES and len(computed) <= MOST_TRACES


def test_gpus_show_one_table_hottest_first(fleet: Path) -> None:
    app = run("gpus.py")
    assert "GPU busy" not in [m.label for m in app.metric]
    gpus = table(app, "Temperature (°C)")
    assert len(gpus) == NODES
    assert gpus["GPU"].iloc[0] == f"node-{NODES - 1}/0"
    for names in charts(app):
        assert len(names) <= MOST_TRACES and names[0] == MEDIAN, names


def test_the_overview_lists_replicas_in_a_table_without_tiles(fleet: Path) -> None:
    app = run("overview.py")
    assert "KV occupancy" not in [m.label for m in app.metric]
    replicas = table(app, "State")
    assert len(replicas) == ROWS
    for names in charts(app):
        assert len(names) <= MOST_TRACES, names


def test_a_small_fleet_keeps_its_tiles_and_a_line_per_replica(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KNEEPOINT_CONFIG", str(seed(tmp_path, time.time(), minutes=10)))
    app = run("capacity.py")
    assert [m.label for m in app.metric].count("KV occupancy") == 3
    assert not [d for d in app.dataframe if "Time KV full" in _frame(d.value).columns]
    for names in charts(app):
        assert sorted(n for n in names if n != CHANGES) == ["replica-a", "replica-b"]


@pytest.mark.parametrize("page", ["overview.py", "capacity.py", "prefix_cache.py", "gpus.py"])
def test_a_fleet_page_run_never_charts_from_every_series(
    fleet: Path, monkeypatch: pytest.MonkeyPatch, page: str
) -> None:
    """At fleet size the database computes the charts (app/fleet_data.py): a page run
    computes no distribution or worst series in pandas and builds no every-replica series
    for them (the Overview's data.series)."""
    from app import data
    from dashboards import charts as kernel

    calls: Counter[str] = Counter()
    for module, name in ((kernel, "distribution"), (kernel, "worst"), (data, "replica_series")):
        original = getattr(module, name)

        def counted(*args: Any, _name: str = name, _original: Any = original, **kw: Any) -> Any:
            calls[_name] += 1
            return _original(*args, **kw)

        monkeypatch.setattr(module, name, counted)
    app = run(page)
    drawn = charts(app)
    assert drawn and all(names[0] == MEDIAN for names in drawn), drawn
    assert calls == Counter()
