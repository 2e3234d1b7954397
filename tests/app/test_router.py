"""app/main.py: a chat link (/?page=…) opens its page in one script run."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import streamlit
from streamlit.testing.v1 import AppTest

import alerts.evaluate  # noqa: F401  the package: AppTest puts app/screens (with alerts.py) first
from tests.seed import seed

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def switches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The store seeded, and every st.switch_page the app makes recorded (not made)."""
    monkeypatch.setenv("KNEEPOINT_CONFIG", str(seed(tmp_path, time.time())))
    made: list[object] = []
    monkeypatch.setattr(streamlit, "switch_page", lambda page, **_: made.append(page))
    return made


def test_a_chat_link_opens_its_page_without_switching_to_it(switches: list[object]) -> None:
    app = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=60)
    app.query_params["page"] = "health"
    app.query_params["range"] = "6h"
    app.run()
    assert not app.exception, [e.value for e in app.exception]
    assert app.title[0].value == "Collector health"
    assert switches == []  # st.switch_page would have run the whole script a second time
    assert app.query_params["page"] == "health"
    assert app.sidebar.selectbox[0].value == "6h"


def test_a_link_to_no_page_opens_the_overview(switches: list[object]) -> None:
    app = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=60)
    app.query_params["page"] = "nowhere"
    app.run()
    assert not app.exception, [e.value for e in app.exception]
    assert app.title[0].value == "Overview"
    assert switches == []
    assert app.query_params["page"] == "overview"
