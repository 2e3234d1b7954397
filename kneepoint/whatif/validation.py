"""How far to trust a what-if: the errors the validation bench published against real vLLM.

`bench/whatif_validation.py` runs a real vLLM (CPU build) under recorded agent traffic,
calibrates the twin on one configuration and predicts the others; it writes what it measured
and predicted to `validation.json` beside this module (its fields: docs/how-to/whatif.md,
"What-if against a real vLLM"). This module reads that file: the table the README and the
What-if page show (`summary`, `table`, `markdown`), and whether one change lies inside what
was validated (`judge`). Pure functions over the published document; nothing here measures.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PUBLISHED = Path(__file__).with_name("validation.json")

# The numbers the bench holds predictions to, with the aim each has (None: reported only).
METRICS: tuple[tuple[str, str], ...] = (
    ("throughput", "throughput"),
    ("ttft_p50", "TTFT p50"),
    ("ttft_p95", "TTFT p95"),
    ("itl_p50", "ITL p50"),
    ("itl_p95", "ITL p95"),
    ("waiting_mean", "waiting"),
    ("preemptions", "preemptions"),
)
AIMED = ("throughput", "ttft_p95", "itl_p95", "preemptions")

# What each validated change is called where people read it.
# (Short: the name leads the table on a phone and must show whole.)
CHANGES: dict[str, str] = {
    "num_gpu_blocks": "KV blocks",
    "max_num_seqs": "max seqs",
    "max_num_batched_tokens": "token budget",
    "enable_prefix_caching": "prefix caching",
    "num_speculative_tokens": "n-gram drafts",
    "replicas": "replicas",
}
# Keys that only modify another change: judged with it, never on their own.
MODIFIERS = ("spec_acceptance_rate", "routing")
# Changes no real run can validate here, and why (the CPU build, or no second GPU kind).
NEVER: dict[str, str] = {
    "kv_cache_dtype": "the fp8 KV cache was not validated against a real engine (its effect "
    "is modelled as twice the blocks and half the bytes read per context token)",
    "gpu_memory_utilization": "a memory share was not validated against a real engine (it "
    "is modelled as more or fewer KV blocks, which are)",
    "gpu": "another GPU was not validated against a real engine (there is no GPU here: "
    "its effect is the profiles' bandwidth and FLOPs ratios)",
    "growth": "traffic growth was not validated against a real engine",
    "max_model_len": "max_model_len was not validated against a real engine",
}


def load(path: Path = PUBLISHED) -> dict[str, Any] | None:
    """The published document, or None where the bench has not published one."""
    try:
        return dict(json.loads(path.read_text()))
    except FileNotFoundError:
        return None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def worst(entry: Mapping[str, Any], metric: str) -> float | None:
    """One row's miss for `metric`: |relative error|, or for preemptions the ratio measured
    vs predicted the other way round when it is below 1 (so 0.5 and 2 both read 2); None
    where the row has no such number."""
    if metric == "preemptions":
        ratio = _number(entry.get("ratio"))
        if ratio is None or ratio <= 0:
            return None
        return max(ratio, 1 / ratio)
    error = _number(entry.get("error"))
    return None if error is None else abs(error)


@dataclass(frozen=True)
class Summary:
    """One kind of change as validated: the settings tried, and per number the worst miss
    over its loads and how many of its aimed rows met the aim."""

    change: str
    label: str
    settings: tuple[str, ...]
    loads: tuple[float, ...]
    worst: dict[str, float | None] = field(default_factory=dict)
    met: dict[str, tuple[int, int]] = field(default_factory=dict)  # (met, judged)

    def all_met(self, metric: str) -> bool | None:
        met, judged = self.met.get(metric, (0, 0))
        return None if judged == 0 else met == judged


def _setting(row: Mapping[str, Any]) -> str:
    setting = row.get("setting") or {}
    calibrated = row.get("calibrated") or {}
    parts = []
    for key, value in setting.items():
        was = calibrated.get(key)
        text = str(value).lower() if isinstance(value, bool) else str(value)
        was_text = (
            "" if was is None else f" (was {str(was).lower() if isinstance(was, bool) else was})"
        )
        parts.append(f"{key}={text}{was_text}")
    return ", ".join(parts)


def summary(document: Mapping[str, Any]) -> list[Summary]:
    """Per validated change, in the order the rows list them."""
    grouped: dict[str, list[Mapping[str, Any]]] = {}
    for row in document.get("rows") or []:
        grouped.setdefault(str(row.get("change")), []).append(row)
    result = []
    for change, rows in grouped.items():
        worst_of: dict[str, float | None] = {}
        met: dict[str, tuple[int, int]] = {}
        for metric, _ in METRICS:
            entries = [(r.get("metrics") or {}).get(metric) or {} for r in rows]
            misses = [m for m in (worst(e, metric) for e in entries) if m is not None]
            worst_of[metric] = max(misses) if misses else None
            verdicts = [bool(e["met"]) for e in entries if isinstance(e.get("met"), bool)]
            met[metric] = (sum(verdicts), len(verdicts))
        result.append(
            Summary(
                change=change,
                label=CHANGES.get(change, change),
                settings=tuple(dict.fromkeys(_setting(r) for r in rows)),
                loads=tuple(sorted({float(r.get("load") or 0) for r in rows})),
                worst=worst_of,
                met=met,
            )
        )
    return result


def describe(metric: str, miss: float | None) -> str:
    """A worst miss as a table cell: "8 %" (relative) or "×1.3" (preemptions)."""
    if miss is None:
        return "–"
    return f"×{miss:.2f}" if metric == "preemptions" else f"{miss:.1%}"


def table(document: Mapping[str, Any]) -> list[dict[str, str]]:
    """The published table as people read it, one row per change: its settings and loads,
    and the worst miss of each aimed number over the loads tried, marked ✓ where every load
    met the aim and ✗ where one did not. The README and the What-if page show these rows."""
    rows = []
    for item in summary(document):
        row = {
            "change": item.label,
            "settings": "; ".join(item.settings),
            "loads": ", ".join(f"{x:g}" for x in item.loads),
        }
        for metric, label in METRICS:
            if metric in AIMED:
                met = item.all_met(metric)
                mark = "" if met is None else (" ✓" if met else " ✗")
                miss = item.worst.get(metric)
                # Preemptions met with no ratio: measured and predicted both ≤ 1 a minute.
                shown = "≤ 1/min" if metric == "preemptions" and miss is None and met else None
                row[label] = (shown or describe(metric, miss)) + mark
        rows.append(row)
    return rows


def aims_sentence(document: Mapping[str, Any]) -> str:
    aims = document.get("aims") or {}
    return (
        "Aims: throughput within {:.0%}, TTFT and ITL p95 within {:.0%}, preemptions within "
        "×{:g} (or both ≤ {:g} per minute).".format(
            float(aims.get("throughput", 0.10)),
            float(aims.get("ttft_p95", 0.25)),
            float(aims.get("preemptions_ratio", 1.5)),
            float(aims.get("preemptions_per_minute_floor", 1.0)),
        )
    )


def markdown(document: Mapping[str, Any]) -> str:
    """`table` as markdown, with the aims under it."""
    rows = table(document)
    head = ["change", "settings", "loads", *[label for key, label in METRICS if key in AIMED]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row[column] for column in head) + " |" for row in rows]
    return "\n".join([*lines, "", aims_sentence(document)])


@dataclass(frozen=True)
class Verdict:
    """Whether a change lies inside what the bench validated, and why not where it does not;
    `errors`: the worst published miss of each aimed number for the changes it makes."""

    validated: bool
    reasons: tuple[str, ...]
    errors: dict[str, float | None]


def _ratio_range(rows: list[Mapping[str, Any]], key: str) -> tuple[float, float] | None:
    ratios = []
    for row in rows:
        new = _number((row.get("setting") or {}).get(key))
        old = _number((row.get("calibrated") or {}).get(key))
        if new is not None and old:
            ratios.append(new / old)
    if not ratios:
        return None
    return min(1.0, *ratios), max(1.0, *ratios)


def judge(
    document: Mapping[str, Any] | None, change: Mapping[str, Any], shape: Mapping[str, Any]
) -> Verdict:
    """Is `change` (kneepoint.whatif.Change.as_dict()) applied to the calibrated engine
    `shape` (EngineShape.as_dict()) inside what the bench validated? Numeric settings are
    compared as a ratio to the calibrated value, against the ratios the bench tried (the
    calibrated value itself included); switches by the side tried; replicas up to the count
    tried. A document that is missing validates nothing."""
    if document is None:
        return Verdict(False, ("no validation against a real engine has been published",), {})
    rows_by: dict[str, list[Mapping[str, Any]]] = {}
    for row in document.get("rows") or []:
        rows_by.setdefault(str(row.get("change")), []).append(row)
    summaries = {item.change: item for item in summary(document)}
    reasons: list[str] = []
    errors: dict[str, float | None] = {}
    for key, setting in change.items():
        if key in MODIFIERS:
            continue
        if key in NEVER:
            reasons.append(NEVER[key])
            continue
        rows = rows_by.get(key)
        if not rows:
            reasons.append(f"{CHANGES.get(key, key)} was not validated against a real engine")
            continue
        for metric in AIMED:
            miss = summaries[key].worst.get(metric)
            if miss is not None:
                errors[metric] = max(miss, errors.get(metric) or 0.0)
        if key == "replicas":
            tried = max(int(_number((r.get("setting") or {}).get(key)) or 1) for r in rows)
            if int(setting) > tried:
                reasons.append(f"{setting} replicas: validated up to {tried}")
            if change.get("routing", "sticky") != "sticky":
                reasons.append("round-robin routing was not validated (sessions were sticky)")
            continue
        if isinstance(setting, bool) or key == "num_speculative_tokens":
            tried_values = {(r.get("setting") or {}).get(key) for r in rows}
            tried_values |= {(r.get("calibrated") or {}).get(key) for r in rows}
            if setting not in tried_values:
                reasons.append(
                    f"{CHANGES.get(key, key)} = {setting}: validated at "
                    + ", ".join(sorted(str(v) for v in tried_values if v is not None))
                )
            continue
        span = _ratio_range(rows, key)
        now = _number(shape.get(key))
        value = _number(setting)
        if span is None or not now or value is None:
            reasons.append(f"{CHANGES.get(key, key)}: no validated range to compare with")
            continue
        ratio = value / now
        low, high = span
        if not low - 1e-9 <= ratio <= high + 1e-9:
            reasons.append(
                f"{CHANGES.get(key, key)} at {ratio:.2g}× the calibrated value: validated "
                f"from {low:.2g}× to {high:.2g}×"
            )
    return Verdict(not reasons, tuple(reasons), errors)
