"""Every page of the app, found by itself, renders on a seeded store without an exception."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

import alerts.evaluate  # noqa: F401  the package: AppTest puts app/screens (with alerts.py) first
from app.registry import PAGES, PAGES_DIR
from tests.seed import seed

ROOT = Path(__file__).resolve().parents[2]
PAGE_FILES = sorted(PAGES_DIR.glob("*.py"))


@pytest.fixture
def seeded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    config = seed(tmp_path, time.time())
    monkeypatch.setenv("KNEEPOINT_CONFIG", str(config))
    return config


def test_every_page_file_is_in_the_menu() -> None:
    assert {spec.file for spec in PAGES} == {path.name for path in PAGE_FILES}


@pytest.mark.parametrize("page", PAGE_FILES, ids=lambda path: path.stem)
def test_the_page_renders_without_errors(seeded: Path, page: Path) -> None:
    app = AppTest.from_file(str(page), default_timeout=60).run()
    assert not app.exception, [e.value for e in app.exception]
    assert not app.error, [e.value for e in app.error]
    assert app.title, "every page has a title"


def test_the_router_opens_the_overview_with_a_tile_per_replica(seeded: Path) -> None:
    app = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=60).run()
    assert not app.exception and not app.error
    assert app.title[0].value == "Overview"
    labels = [m.label for m in app.metric]
    assert labels.count("KV occupancy") == 3
    assert any("replica-down" in md.value for md in app.markdown)
    assert any("connection refused" in c.value for c in app.caption)


def test_the_query_string_keeps_range_and_replica(seeded: Path) -> None:
    app = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=60)
    app.query_params["range"] = "6h"
    app.query_params["replica"] = "replica-b"
    app.run()
    assert not app.exception
    assert app.sidebar.selectbox[0].value == "6h"
    assert app.sidebar.multiselect[0].value == ["replica-b"]
    assert [m.label for m in app.metric].count("KV occupancy") == 1
    assert app.query_params["range"] == "6h"
    assert app.query_params["page"] == "overview"


def test_an_unknown_range_falls_back_to_the_default(seeded: Path) -> None:
    app = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=60)
    app.query_params["range"] = "soon"
    app.run()
    assert not app.exception
    assert app.sidebar.selectbox[0].value == "1h"


def test_a_broken_config_is_shown_as_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("targets: [{name: a, kind: vllm}]\n")
    monkeypatch.setenv("KNEEPOINT_CONFIG", str(bad))
    app = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=60).run()
    assert not app.exception
    assert "targets[0].url: is required" in app.error[0].value


def test_the_pages_and_the_cli_show_the_same_numbers(seeded: Path) -> None:
    """One computation: the page's value is the CLI's, formatted, for the same window."""
    import json
    import subprocess
    import sys

    from app.format import show

    def cli(window: str) -> dict:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "kneepoint.cli",
                "status",
                "--json",
                "--window",
                window,
                "--config",
                str(seeded),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return json.loads(result.stdout)

    overview = AppTest.from_file(str(PAGES_DIR / "overview.py"), default_timeout=60).run()
    five_minutes = {r["name"]: r for r in cli("5m")["replicas"]}
    tiles = [m.value for m in overview.metric if m.label == "Gen tok/s"]
    assert tiles == [
        "–"
        if five_minutes[name]["generation_tokens_per_second"] is None
        else f"{five_minutes[name]['generation_tokens_per_second']:.0f}"
        for name in ("replica-a", "replica-b", "replica-down")
    ]
    cost = AppTest.from_file(str(PAGES_DIR / "cost.py"), default_timeout=60).run()
    hour = cli("1h")
    shown = {m.label: m.value for m in cost.metric}
    assert shown["Fleet $ / 1M tokens"] == show(hour["fleet"]["cost_per_million_tokens"], "$")
    assert shown["Fleet $ / 1M tokens"] != "–"
    capacity = AppTest.from_file(str(PAGES_DIR / "capacity.py"), default_timeout=60).run()
    occupancy = [m.value for m in capacity.metric if m.label == "KV occupancy"]
    assert occupancy == [show(r["kv_cache_occupancy"], "%") for r in hour["replicas"]]
