"""The product's chrome: the app starts with the viewer toolbar and kneepoint's light and
dark themes (as Streamlit itself reads the flags), and every page ends with a footer naming
the version, the config file and how old the data is."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

import alerts.evaluate  # noqa: F401  the package: AppTest puts app/screens (with alerts.py) first
import kneepoint
from app import chrome
from app.registry import DEFAULT_SECTION, PAGES, SECTIONS, section
from kneepoint import webapp
from kneepoint.config import load_config
from kneepoint.store.db import open_store
from kneepoint.store.models import TargetRow
from tests.conftest import migrated
from tests.seed import seed

ROOT = Path(__file__).resolve().parents[2]
MAIN = str(ROOT / "app" / "main.py")


def launch_command(config_file: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The command line `kneepoint app` (and the demo) starts Streamlit with."""
    started: list[list[str]] = []

    class Recorded:
        def __init__(self, command: list[str], **_: object) -> None:
            started.append(command)

    with monkeypatch.context() as patched:  # subprocess itself: undone before Streamlit runs
        patched.setattr(webapp.subprocess, "Popen", Recorded)
        webapp.app_process(load_config(config_file), config_file, "127.0.0.1", 8599)
    (command,) = started
    return command


def options(command: list[str]) -> list[tuple[str, str]]:
    """Streamlit's `--section.name value` and `--section.name=value` flags in `command`."""
    found, parts = [], iter(command[command.index("run") + 2 :])
    for part in parts:
        name, _, value = part.removeprefix("--").partition("=")
        found.append((name, value if "=" in part else next(parts)))
    return found


def luminance(colour: str) -> float:
    red, green, blue = (int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5))
    return 0.2126 * red + 0.7152 * green + 0.0722 * blue


def test_the_app_starts_with_the_viewer_toolbar_and_a_light_and_a_dark_theme(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    command = launch_command(seed(tmp_path, time.time(), minutes=1), monkeypatch)
    flags = [f"--{name}={value}" for name, value in options(command)]
    # What Streamlit makes of those flags, from a folder without a .streamlit/config.toml.
    shown = subprocess.run(
        [sys.executable, "-m", "streamlit", "config", "show", *flags],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    settings = tomllib.loads(shown.stdout[shown.stdout.index("\n[") :])  # after its preface
    assert settings["client"]["toolbarMode"] == "viewer"  # no "Deploy", a short menu
    assert settings["server"]["fileWatcherType"] == "none"  # no "File change: Rerun" prompt
    theme = settings["theme"]
    assert "base" not in theme  # a base would make Streamlit ignore the light and dark tables
    light, dark = theme["light"], theme["dark"]
    for table in (light, dark):
        assert {"primaryColor", "backgroundColor", "textColor"} <= set(table)
    assert luminance(light["backgroundColor"]) > luminance(light["textColor"])
    assert luminance(dark["backgroundColor"]) < luminance(dark["textColor"])
    assert light["primaryColor"] != dark["primaryColor"]


def footer(app: AppTest) -> str:
    (line,) = [c.value for c in app.caption if c.value.startswith("kneepoint ")]
    return line


def newest_scrape(config: Path) -> float:
    sessions = open_store(load_config(config).database)
    with sessions() as session:
        return max(r.last_success_at or 0.0 for r in session.query(TargetRow))


def test_the_footer_names_the_version_the_config_and_the_data_s_age(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = seed(tmp_path, time.time(), minutes=5)
    # Stale after 3 min rather than 15 s, however long a loaded machine takes to render.
    config.write_text(config.read_text().replace("scrape_interval: 5s", "scrape_interval: 60s"))
    sessions = open_store(load_config(config).database)
    with sessions.begin() as session:  # replica-a answered a scrape just now
        session.query(TargetRow).filter_by(name="replica-a").update(
            {"last_success_at": time.time()}
        )
    monkeypatch.setenv("KNEEPOINT_CONFIG", str(config))
    before = time.time() - newest_scrape(config)
    app = AppTest.from_file(MAIN, default_timeout=60).run()
    after = time.time() - newest_scrape(config)
    assert not app.exception, [e.value for e in app.exception]
    line = footer(app)
    assert f"kneepoint {kneepoint.__version__}" in line
    assert str(config) in line
    seconds = re.search(r"data (\d+) s old", line)
    assert seconds, line
    assert int(before) - 1 <= int(seconds.group(1)) <= after + 1
    assert ":orange[" not in line  # within the config's stale limit


def test_old_data_is_called_out_in_the_footer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hours = 3
    config = seed(tmp_path, time.time() - hours * 3600, minutes=5)
    monkeypatch.setenv("KNEEPOINT_CONFIG", str(config))
    app = AppTest.from_file(MAIN, default_timeout=60).run()
    assert not app.exception, [e.value for e in app.exception]
    line = footer(app)
    assert f":orange[data {chrome.age(time.time() - newest_scrape(config))} old]" in line
    assert f"{hours} h" in line


def test_a_store_without_scrapes_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "kneepoint.yaml"
    config.write_text(
        f"database: sqlite:///{tmp_path / 'k.db'}\n"
        "targets:\n  - {name: fresh, kind: vllm, url: 'http://127.0.0.1:9/metrics'}\n"
    )
    monkeypatch.setenv("KNEEPOINT_CONFIG", str(migrated(config)))
    app = AppTest.from_file(MAIN, default_timeout=60).run()
    assert not app.exception, [e.value for e in app.exception]
    assert "no data yet" in footer(app)


def test_every_page_carries_the_phone_styles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KNEEPOINT_CONFIG", str(seed(tmp_path, time.time(), minutes=2)))
    app = AppTest.from_file(MAIN, default_timeout=60).run()
    styles = [h.proto.body for h in app.get("html") if "<style>" in h.proto.body]
    assert styles == [chrome.STYLE.strip()]
    assert "@media (max-width: 640px)" in chrome.STYLE


def test_ages_read_in_the_largest_whole_unit() -> None:
    assert chrome.age(None) == "unknown"
    assert chrome.age(-3) == "0 s"  # a clock a little ahead of the collector's
    for seconds, unit in ((59, "s"), (60, "min"), (3599, "min"), (7200, "h"), (86400 * 3, "d")):
        assert chrome.age(seconds).endswith(f" {unit}"), seconds


def test_the_menu_s_sections_name_real_pages_once() -> None:
    paths = [spec.url_path for spec in PAGES]
    named = [path for listed in SECTIONS.values() for path in listed]
    assert sorted(set(named)) == sorted(named), "a page in two sections"
    assert set(named) <= set(paths), set(named) - set(paths)
    assert DEFAULT_SECTION in SECTIONS
    # The default page (the first) heads the menu's first section.
    assert section(PAGES[0]) == next(iter(SECTIONS))
