"""Tables for people (app/tables.py) and the numbers in them (app/format.py): "–" for empty,
relative times with the exact time beside them, compact numbers, ratios with a unit, badges,
human headers; and the pages that show tables render none of None/NaN/NaT."""

from __future__ import annotations

import json
import math
import time
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

import alerts.evaluate  # noqa: F401  the package: AppTest puts app/screens (with alerts.py) first
from alerts.evaluate import evaluate_once
from app import format as fmt
from app import tables
from app.registry import PAGES_DIR
from kneepoint.config import load_config
from kneepoint.store.db import open_store
from tests.seed import seed

EMPTIES = [None, float("nan"), pd.NaT, pd.NA, "", "  "]


@pytest.mark.parametrize("value", EMPTIES, ids=repr)
def test_every_kind_of_empty_reads_as_a_dash(value: object) -> None:
    assert fmt.is_empty(value)
    assert fmt.text(value) == "–"
    assert fmt.yes_no(value) == "–"
    assert fmt.badge(value) == "–"
    if not isinstance(value, str):
        assert fmt.compact(value) == "–"  # type: ignore[arg-type]
        assert fmt.times(value) == "–"  # type: ignore[arg-type]
        assert fmt.ago(value, 1000.0) == "–"  # type: ignore[arg-type]
        assert fmt.utc(value) == "–"  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [0, 0.0, False, "0", "no"], ids=repr)
def test_zero_and_false_are_not_empty(value: object) -> None:
    assert not fmt.is_empty(value)
    assert fmt.text(value) == str(value)


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        (2, "just now"),
        (42, "42 s ago"),
        (12 * 60 + 30, "12 min ago"),
        (3600, "1 h ago"),
        (3600 + 20 * 60, "1 h 20 min ago"),
        (3 * 86400 + 4 * 3600 + 59, "3 d 4 h ago"),
        (-5 * 60, "in 5 min"),
    ],
)
def test_relative_time(seconds: float, expected: str) -> None:
    now = 1_800_000_000.0
    assert fmt.ago(now - seconds, now) == expected


def test_absolute_time_is_utc_and_says_so() -> None:
    moment = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
    assert fmt.utc(moment.timestamp()) == "2026-03-04 05:06:07 UTC"


@pytest.mark.parametrize(
    ("value", "unit", "expected"),
    [
        (459_088, "tokens", "459k tokens"),
        (1_234_567, "", "1.23M"),
        (1_200_000, "", "1.2M"),
        (999_950, "", "1M"),  # rounds up into the next unit, not "1000k"
        (12_345, "", "12.3k"),
        (3_400_000_000, "", "3.4B"),
        (-45_000, "", "-45k"),
        (999, "seqs", "999 seqs"),
        (12.345, "", "12.3"),
        (0, "", "0"),
    ],
)
def test_compact_numbers(value: float, unit: str, expected: str) -> None:
    assert fmt.compact(value, unit) == expected


@pytest.mark.parametrize("value", [459_088, 1_234_567_891, 98_765.4321, 7])
def test_compact_numbers_are_short_and_close(value: float) -> None:
    shown = fmt.compact(value)
    assert len(shown) <= 5
    scale = {"k": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}.get(shown[-1], 1.0)
    number = float(shown.rstrip("kMBT").replace(",", ""))
    assert math.isclose(number * scale, value, rel_tol=0.005)


def test_physical_quantities_take_an_si_prefix() -> None:
    assert fmt.si(3_400_000, "J") == "3.4 MJ"
    assert fmt.si(459_088, "W") == "459 kW"
    assert fmt.si(12.5, "J") == "12.5 J"
    assert fmt.si(None, "J") == "–"


def test_ratios_have_a_unit_and_are_rounded() -> None:
    assert fmt.times(2.1636, "budget") == "2.16× budget"
    assert fmt.times(1.0) == "1×"
    assert fmt.times(14.4) == "14.4×"
    # An SLO burn alert's value and threshold (issue 17: "2.1636 against a threshold of 1").
    unit = fmt.metric_unit("slo_burn:chat-latency:1h")
    assert fmt.metric_value(2.1636, unit) == "2.16× budget"
    assert fmt.metric_value(1.0, unit) == "1× budget"


def test_alert_values_read_in_their_metric_s_unit() -> None:
    assert fmt.metric_unit("kv_cache_occupancy") == "%"
    assert fmt.metric_value(0.93, "%") == "93.0%"
    assert fmt.metric_unit("ttft_p99_seconds") == "s"
    assert fmt.metric_value(1.23456, "s") == "1.235 s"
    assert fmt.metric_unit("spec_expected_speedup") == "×"
    assert fmt.metric_unit("cost_per_million_tokens") == "$"
    assert fmt.metric_unit("prefix_cache_hit_rate_drop") == "points"
    assert fmt.metric_value(0.3, "points") == "30 points"
    assert fmt.metric_unit("preemptions_per_second") == "/s"
    assert fmt.metric_value(0.05, "/s") == "0.05/s"
    assert fmt.metric_unit("requests_waiting") == ""
    assert fmt.metric_value(3.0, "") == "3"


def test_badges_colour_states_and_severities() -> None:
    assert fmt.badge("firing") == "● firing"
    tones = {w: fmt.tone(w) for w in ("firing", "page", "down", "pending", "ticket", "stale")}
    assert tones == {
        "firing": "red",
        "page": "red",
        "down": "red",
        "pending": "orange",
        "ticket": "orange",
        "stale": "orange",
    }
    assert [fmt.tone(w) for w in ("resolved", "up", "done", "info")] == [
        "green",
        "green",
        "green",
        "blue",
    ]
    assert fmt.tone("something new") == fmt.tone(None) == "gray"
    assert fmt.tone(fmt.badge("Firing")) == "red"  # the badge's own text keeps its tone


def test_badge_columns_are_coloured_by_tone() -> None:
    shown, _ = tables.prepare(
        pd.DataFrame({"s": ["firing", "resolved", None], "n": ["x", "y", "z"]}),
        {"s": tables.badge("State"), "n": tables.text("Name")},
    )
    styler = tables.styled(shown, {"s": tables.badge("State"), "n": tables.text("Name")})
    styles = styler._compute().ctx  # (row, column) -> [(property, value)]
    assert styles[(0, 0)] == [("color", fmt.TONE_COLOURS["red"])]
    assert styles[(1, 0)] == [("color", fmt.TONE_COLOURS["green"])]
    assert (2, 0) not in styles and (0, 1) not in styles  # "–" and plain text: no colour
    plain, _ = tables.prepare(pd.DataFrame({"n": ["x"]}), {"n": tables.text("Name")})
    assert tables.styled(plain, {"n": tables.text("Name")}) is plain


def test_booleans_are_words() -> None:
    assert [fmt.yes_no(v) for v in (True, False, 1, 0)] == ["yes", "no", "yes", "no"]


def test_prepare_names_orders_and_fills_the_columns() -> None:
    now = time.time()
    frame = pd.DataFrame(
        {
            "fired_at": [now - 720, None],
            "state": ["firing", None],
            "failures in a row": [3, None],
            "stale": [True, None],
            "kv_cache_capacity_tokens": [459_088, None],
            "burn": [2.1636, None],
            "share": [0.93, None],
            "internal": ["x", "y"],
        }
    )
    shown, config = tables.prepare(
        frame,
        {
            "state": tables.badge("State"),
            "fired_at": tables.time("Fired"),
            "failures in a row": tables.number("Failures in a row", digits=0),
            "stale": tables.yes_no("Stale"),
            "kv_cache_capacity_tokens": tables.number("KV capacity", "tokens", compact=True),
            "burn": tables.ratio("Burn rate", "budget"),
            "share": tables.percent("Hit rate"),
        },
    )
    assert list(shown.columns) == [
        "State",
        "Fired",
        "Fired (UTC)",
        "Failures in a row",
        "Stale",
        "KV capacity (tokens)",
        "Burn rate (× budget)",
        "Hit rate",
    ]
    assert set(config) == set(shown.columns)
    assert list(shown["State"]) == ["● firing", "–"]
    assert list(shown["Stale"]) == ["yes", "–"]
    # Times and numbers keep their types (sortable); the placeholder shows their gaps.
    assert str(shown["Fired"].dtype).startswith("datetime64")
    assert shown["Fired"].iloc[0].timestamp() == pytest.approx(now - 720, abs=1e-3)
    assert shown["Hit rate"].iloc[0] == pytest.approx(93.0)
    assert config["Fired"]["type_config"]["format"] == "distance"
    assert config["Fired (UTC)"]["type_config"]["timezone"] == "UTC"
    assert config["KV capacity (tokens)"]["type_config"]["format"] == "compact"
    assert config["Burn rate (× budget)"]["type_config"]["format"] == "%.2f×"


def test_prepare_refuses_a_column_the_frame_does_not_have() -> None:
    with pytest.raises(KeyError, match="fired_at"):
        tables.prepare(pd.DataFrame({"state": ["firing"]}), {"fired_at": tables.time("Fired")})


def test_an_empty_frame_keeps_its_headers() -> None:
    shown, _ = tables.prepare(pd.DataFrame(), {"a": tables.text("A"), "t": tables.time("T")})
    assert list(shown.columns) == ["A", "T", "T (UTC)"] and shown.empty


# --- The pages ------------------------------------------------------------------------------

RAW = {"None", "nan", "NaN", "NaT", "<NA>", "True", "False", ""}


@pytest.fixture
def alerting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The seeded store after two real evaluation rounds 20 minutes apart: alerts pending and
    firing (a down replica, saturated KV), their history, scrape errors, a timeline."""
    now = time.time()
    config_path = seed(tmp_path, now)
    config = load_config(config_path)
    sessions = open_store(config.database)
    for at in (now - 1200, now - 30):
        with sessions.begin() as session:
            evaluate_once(session, config, at)
    monkeypatch.setenv("KNEEPOINT_CONFIG", str(config_path))
    return config_path


def readable(app: AppTest) -> list[pd.DataFrame]:
    """Every dataframe on the page, checked as people read it: human headers, "–" for a
    missing number or time (the placeholder), and no text cell None, NaN, NaT or blank."""
    assert not app.exception, [e.value for e in app.exception]
    shown = []
    for element in app.dataframe:
        assert element.proto.placeholder == "–"
        table = element.value
        for header in table.columns:
            assert "_" not in header and header == header.strip(), header
            assert header[0].isupper() or not header[0].isalpha(), header
            column = table[header]
            if pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column):
                continue  # a number: NaN shows the placeholder
            if pd.api.types.is_datetime64_any_dtype(column):
                continue  # a time: NaT shows the placeholder
            for cell in column:
                assert isinstance(cell, str) and cell.strip() not in RAW, (header, cell)
        shown.append(table)
    return shown


def test_the_alerts_page_reads_as_people_read_it(alerting: Path) -> None:
    app = AppTest.from_file(str(PAGES_DIR / "alerts.py"), default_timeout=120).run()
    current, history, *_ = readable(app)
    assert list(current.columns) == [
        "State",
        "Severity",
        "Rule",
        "Replica",
        "Value",
        "Threshold",
        "Since",
        "Since (UTC)",
    ]
    assert set(current["State"]) <= {"● firing", "● pending"} and len(current)
    assert "● firing" in set(current["State"])  # the down replica, for 20 minutes
    # A share reads as a percentage against its threshold, with the rule's operator.
    kv = current[current["Rule"] == "kv-cache-saturated"]
    assert len(kv) and all(v.endswith("%") for v in kv["Value"])
    assert set(kv["Threshold"]) == {"> 90.0%"}
    assert not current["Since"].isna().any()
    assert {"Time", "Rule", "Replica", "From", "To", "Value"} <= set(history.columns)
    assert "–" in set(history["From"])  # a new alert came from no state: a dash, not None


def test_the_collector_health_page_reads_as_people_read_it(alerting: Path) -> None:
    app = AppTest.from_file(str(PAGES_DIR / "health.py"), default_timeout=120).run()
    targets = next(t for t in readable(app) if "Target" in t and "State" in t)
    assert "Failures in a row" in targets.columns and "failures in a row" not in targets.columns
    down = targets[targets["Target"] == "replica-down"].iloc[0]
    # Down, or stale once two scrape intervals have passed since the seed (a slow machine).
    assert down["State"] in {"● down", "● stale"} and down["Failures in a row"] >= 1
    assert "connection refused" in down["Last error"]
    assert down["Engine"] == "–"  # never scraped: no engine, a dash


@pytest.mark.parametrize("page", ["capacity.py", "timeline.py"])
def test_more_pages_show_no_raw_cells(alerting: Path, page: str) -> None:
    app = AppTest.from_file(str(PAGES_DIR / page), default_timeout=120).run()
    assert readable(app), "the page shows at least one table"


def test_the_timeline_names_kinds_in_words(alerting: Path) -> None:
    app = AppTest.from_file(str(PAGES_DIR / "timeline.py"), default_timeout=120).run()
    (table,) = readable(app)
    kinds = set(table["Kind"])
    assert "alert firing" in kinds  # the down replica's alert, not "alert_firing"
    assert not any("_" in kind for kind in kinds)


def test_an_slo_burn_reads_in_multiples_of_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 17's example: a burn rate of 2.1636 against a threshold of 1 had no unit."""
    from tests.app.test_overview_landing import troubled_store  # a spent SLO budget

    monkeypatch.setenv("KNEEPOINT_CONFIG", str(troubled_store(tmp_path)))
    app = AppTest.from_file(str(PAGES_DIR / "alerts.py"), default_timeout=120).run()
    current = readable(app)[0]
    burns = current[current["Rule"].str.startswith("fast-ttft-burn-")]
    assert len(burns)
    for value, threshold in zip(burns["Value"], burns["Threshold"], strict=True):
        assert value.endswith("× budget") and threshold.startswith("> "), (value, threshold)
        assert threshold.endswith("× budget")
        assert len(value.split("×")[0].split(".")[-1]) <= 2  # rounded, not 2.1636
    slos = AppTest.from_file(str(PAGES_DIR / "slos.py"), default_timeout=120).run()
    (burn,) = readable(slos)
    assert list(burn.columns) == [
        "Window",
        "Severity",
        "Fires above (× budget)",
        "Long-window burn (× budget)",
        "Short-window burn (× budget)",
        "Firing",
    ]
    assert set(burn["Firing"]) <= {"yes", "no"} and "yes" in set(burn["Firing"])


# --- On a phone -----------------------------------------------------------------------------

# Drawn widths (px) of the table font in Chromium (canvas measureText, 14 px Source Sans).
MEASURED = {
    "interactive-ttft-burn-3d": 134.49,
    "1.56× budget": 75.65,
    "2026-12-02 02:25:06": 115.89,
    "a few seconds ago": 105.77,
    "State": 29.93,
    "Severity": 47.49,
}


@pytest.mark.parametrize(("text", "drawn"), MEASURED.items())
def test_text_widths_are_never_less_than_drawn(text: str, drawn: float) -> None:
    # Never less (a column sized by it cuts nothing), at most 5% more (it stays compact).
    assert drawn <= tables.text_width(text) <= drawn * 1.05


def test_phone_layout_leads_with_the_name_pinned_then_what_matters() -> None:
    frame = pd.DataFrame(
        {
            "Detail": ["a long explanation that a phone scrolls to read " * 3],
            "Value": ["1.56× budget"],
            "Rule": ["interactive-ttft-burn-3d"],
            "Replica": ["qwen3-4b-sglang"],
        }
    )
    order, config = tables.phone_layout(
        frame, "Rule", ["Value"], {"Value": {"label": "Value", "help": "The number now."}}
    )
    assert order == ["Rule", "Value", "Detail", "Replica"]
    assert config["Rule"]["pinned"] is True
    assert "pinned" not in config["Value"] and config["Value"]["help"] == "The number now."
    # Each leading column holds its widest text and the grid's padding; the rest are left
    # to the grid (they scroll).
    assert config["Rule"]["width"] >= MEASURED["interactive-ttft-burn-3d"] + 16
    assert config["Value"]["width"] >= MEASURED["1.56× budget"] + 16
    assert config["Rule"]["width"] + config["Value"]["width"] <= tables.PHONE_WIDTH
    assert "Detail" not in config and "Replica" not in config


def test_what_matters_shares_a_phone_when_it_is_too_wide() -> None:
    frame = pd.DataFrame({name: ["x" * 80] for name in ("A", "B", "C", "D")})
    order, config = tables.phone_layout(frame, "C", ["A", "B"])
    assert order == ["C", "A", "B", "D"]
    widths = [config[name]["width"] for name in ("C", "A", "B")]
    assert sum(widths) <= tables.PHONE_WIDTH and min(widths) >= tables.MIN_WIDTH
    assert len(set(widths)) == 1  # each gave up the same share


def test_phone_layout_sizes_numbers_and_times_as_the_grid_writes_them() -> None:
    shown, config = tables.prepare(
        pd.DataFrame({"at": [time.time()], "burn": [2.1636], "kv": [459_088.0], "who": ["x"]}),
        {
            "who": tables.text("Who"),
            "at": tables.time("Fired"),
            "burn": tables.ratio("Burn", "budget"),
            "kv": tables.number("KV", compact=True),
        },
    )
    assert tables.cell_texts(shown["Burn (× budget)"], config["Burn (× budget)"]) == ["2.16×"]
    assert tables.cell_texts(shown["KV"], config["KV"]) == ["459K"]
    assert tables.cell_texts(shown["Fired"], config["Fired"]) == list(tables.DISTANCE_TEXTS)
    _, laid = tables.phone_layout(shown, "Who", ["Fired"], config)
    assert laid["Fired"]["width"] >= MEASURED["a few seconds ago"] + 16
    with pytest.raises(KeyError, match="Nope"):
        tables.phone_layout(shown, "Who", ["Nope"], config)


def test_a_short_header_says_what_it_stands_for() -> None:
    shown, config = tables.prepare(
        pd.DataFrame({"c": [4]}), {"c": tables.number("Concurrency", "requests", short="Conc.")}
    )
    assert list(shown.columns) == ["Concurrency (requests)"]  # the frame keeps its header
    assert config["Concurrency (requests)"]["label"] == "Conc."
    assert config["Concurrency (requests)"]["help"] == "Concurrency (requests)."


@pytest.mark.parametrize(
    ("page", "least"),
    [
        ("alerts.py", 2),
        ("health.py", 2),
        ("capacity.py", 2),
        ("timeline.py", 1),
        ("slos.py", 0),
        ("prefix_cache.py", 0),
        ("audit.py", 0),
    ],
)
def test_every_table_leads_with_its_name_pinned_and_what_matters_fits_a_phone(
    alerting: Path, page: str, least: int
) -> None:
    app = AppTest.from_file(str(PAGES_DIR / page), default_timeout=120).run()
    assert not app.exception, [e.value for e in app.exception]
    assert len(app.dataframe) >= least
    for element in app.dataframe:
        order = list(element.proto.column_order)
        config = json.loads(element.proto.columns)
        shown = element.value
        assert sorted(order) == sorted(shown.columns)  # every column, in a phone's order
        pinned = [name for name in order if config.get(name, {}).get("pinned")]
        assert pinned == order[:1], (page, order, pinned)
        # The columns sized to fit (the name and what matters) come first, at least one
        # besides the name, and fit a phone's table together.
        sized = [name for name in order if "width" in config.get(name, {})]
        assert len(sized) >= 2 and sized == order[: len(sized)], (page, order, sized)
        total = sum(config[name]["width"] for name in sized)
        assert total <= tables.PHONE_WIDTH, (page, sized, total)
        for name in sized:
            label = config[name].get("label") or name
            widest = max(tables.text_width(t) for t in [label, *map(str, shown[name])])
            if pd.api.types.is_object_dtype(shown[name]):  # text: as it is drawn
                assert config[name]["width"] >= widest + 16, (page, name)
