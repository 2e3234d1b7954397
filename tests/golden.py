"""Golden outputs (tests/test_behaviour_golden.py): a stable text of each output, compared with
its file under tests/golden/, or written there when KNEEPOINT_REGEN_GOLDEN=1.

Stable means: object keys sorted, floats rounded to DIGITS significant digits (so the last
bits of a sum taken in another order on another platform cannot flip a golden), an object
or list on one line when it is short (LINE) or a list of plain values, otherwise one item per
line: a changed number shows as one changed line of the diff."""

from __future__ import annotations

import base64
import difflib
import hashlib
import json
import math
import os
import re
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from google.protobuf.json_format import MessageToDict
from streamlit.testing.v1 import AppTest

GOLDEN = Path(__file__).resolve().parent / "golden"
REGENERATE = os.environ.get("KNEEPOINT_REGEN_GOLDEN") == "1"
DIGITS = 9  # significant digits kept of every float
LINE = 100  # characters: an object or list this short is written on one line
DIFF_LINES = 120  # of a failing comparison's diff shown

# What a page element carries that is not what it shows, left out of its record:
# - "id": a widget's identity (a hash of its parameters and key), not shown to anyone;
# - "deferredFileId": a download button's file, a random id made anew on every run (its
#   content is the chart's or the table's data, recorded with that chart or table).
INVISIBLE = frozenset({"id", "deferredFileId"})
_ISO = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}")


def check(name: str, text: str) -> None:
    """Compare `text` with the golden file `name` (or write it when regenerating)."""
    path = GOLDEN / name
    if REGENERATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return
    if not path.exists():
        pytest.fail(f"no golden file {path}: run with KNEEPOINT_REGEN_GOLDEN=1 (see the docstring)")
    expected = path.read_text(encoding="utf-8")
    if text == expected:
        return
    diff = list(
        difflib.unified_diff(
            expected.splitlines(),
            text.splitlines(),
            f"tests/golden/{name} (golden)",
            f"{name} (now)",
            lineterm="",
            n=2,
        )
    )
    shown = "\n".join(diff[:DIFF_LINES])
    more = f"\n… {len(diff) - DIFF_LINES} more diff lines" if len(diff) > DIFF_LINES else ""
    pytest.fail(f"{name} differs from its golden file:\n{shown}{more}", pytrace=False)


def rounded(value: Any) -> Any:
    """`value` (JSON-like) with every float rounded to DIGITS significant digits."""
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return float(f"{value:.{DIGITS}g}") + 0.0  # + 0.0: no "-0.0"
    if isinstance(value, dict):
        return {str(k): rounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [rounded(v) for v in value]
    return value


def dumps(value: Any) -> str:
    """The stable text of a JSON-like value (see the module's docstring)."""
    return _text(rounded(value), "") + "\n"


def _text(value: Any, indent: str) -> str:
    inner = indent + " "
    short = json.dumps(value, ensure_ascii=False, sort_keys=True)
    if len(indent) + len(short) <= LINE:
        return short
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = [f"{inner}{json.dumps(k)}: {_text(value[k], inner)}" for k in sorted(value)]
        return "{\n" + ",\n".join(items) + f"\n{indent}}}"
    if isinstance(value, list):
        if all(not isinstance(v, dict | list) for v in value):
            return json.dumps(value, ensure_ascii=False)
        return "[\n" + ",\n".join(inner + _text(v, inner) for v in value) + f"\n{indent}]"
    return json.dumps(value, ensure_ascii=False)


def frame_csv(frame: pd.DataFrame) -> list[str]:
    """A table's contents as CSV lines, floats at DIGITS significant digits."""
    return frame.to_csv(float_format=f"%.{DIGITS}g", lineterminator="\n").splitlines()


def page_record(app: AppTest) -> list[Any]:
    """Every element of a page run, in the order shown: its type and what it carries (text,
    labels, help, values, options, layout), a table as CSV, a chart as its figure JSON."""
    return [_node(child) for child in app._tree.children.values()]


def _node(node: Any) -> dict[str, Any]:
    record: dict[str, Any] = {"type": node.type}
    proto = getattr(node, "proto", None)
    if proto is not None:
        fields = MessageToDict(proto)
        record |= {k: _parsed(v) for k, v in fields.items() if k not in INVISIBLE}
    if node.type == "download_button":
        # A hash of the file's bytes; the weekly review's HTML holds plotly's random div ids
        # (uuid4, plotly.io.to_html), new on every run. tests/test_behaviour_golden.py checks
        # that report's contents with those ids masked (test_the_weekly_report).
        record.pop("url", None)
    if node.type in ("dataframe", "table"):
        record.pop("arrowData", None)  # Arrow bytes: the table below says the same
        record["csv"] = frame_csv(node.value)
    children = getattr(node, "children", None)
    if children:
        record["children"] = [_node(child) for child in children.values()]
    return record


def _parsed(value: Any) -> Any:
    """A field holding JSON text (a chart's figure, a table's column settings) as JSON, its
    typed arrays as numbers and its evenly spaced times in short."""
    if isinstance(value, str) and value[:1] in ("{", "["):
        try:
            return _plain(json.loads(value))
        except ValueError:
            return value
    return value


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        if isinstance(value.get("bdata"), str) and "dtype" in value:
            return _typed_array(value)
        return {k: _digest(v) if k == "template" else _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return _times_in_short(value) or [_plain(v) for v in value]
    return value


def _digest(theme: Any) -> str:
    """A chart's theme (layout.template: plotly's colour scales and fonts, 9 KB a chart)
    as a digest of its JSON: another theme still shows as another digest."""
    text = json.dumps(rounded(theme), sort_keys=True)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _typed_array(value: dict[str, Any]) -> Any:
    """Plotly's typed array (base64 of the numbers' bytes) as the numbers: bytes of a float
    would keep its last bits, which rounding is there to drop."""
    numbers = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
    shape = value.get("shape")
    if shape:
        numbers = numbers.reshape([int(n) for n in str(shape).split(",")])
    return numbers.tolist()


def _times_in_short(values: list[Any]) -> str | None:
    """A chart's time axis, evenly spaced ISO times (most of the golden files' bytes), as
    "first … last every N s (count)": the same times, each one known from the four."""
    if len(values) < 3 or not all(isinstance(v, str) and _ISO.match(v) for v in values):
        return None
    moments = [datetime.fromisoformat(v) for v in values]
    steps = {(b - a).total_seconds() for a, b in pairwise(moments)}
    if len(steps) != 1:
        return None
    return f"{values[0]} … {values[-1]} every {steps.pop():g} s ({len(values)})"
