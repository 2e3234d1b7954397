"""Time series for charts, from stored rows: gauges as stored, counters as per-interval
increases and rates, and ratios computed from the increases of each interval."""

from __future__ import annotations

import pandas as pd

# Chart column -> (stored column, is it a counter to turn into a per-second rate?)
SERIES = {
    "kv_cache_occupancy": ("kv_cache_usage", False),
    "requests_running": ("requests_running", False),
    "requests_waiting": ("requests_waiting", False),
    "requests_waiting_capacity": ("requests_waiting_capacity", False),
    "prompt_tokens_per_second": ("prompt_tokens", True),
    "generation_tokens_per_second": ("generation_tokens", True),
    "preemptions_per_second": ("preemptions", True),
    "computed_prompt_tokens_per_second": ("prompt_tokens_local_compute", True),
}
# Increases kept per interval, so ratios can be recomputed over any coarser interval.
INCREASES = (
    "prefix_cache_hits",
    "prefix_cache_queries",
    "spec_decode_accepted_tokens",
    "spec_decode_draft_tokens",
    "generation_tokens",
    "prompt_tokens",
    "prompt_tokens_local_compute",
    "preemptions",
)


# The stored columns the series need.
COLUMNS = tuple(dict.fromkeys([*(stored for stored, _ in SERIES.values()), *INCREASES]))


def interval_increase(values: pd.Series) -> pd.Series:
    """Increase since the previous sample; after a reset the new value is the increase (as
    in counters.increase), so a restart never shows as a negative dip."""
    delta = values.diff()
    return delta.where(delta >= 0, values)


def replica_series(frame: pd.DataFrame, names: dict[int, str]) -> pd.DataFrame:
    """Long-form rows (time, replica, one column per series) from replica_frame rows."""
    parts = []
    for target_id, rows in frame.groupby("target_id", sort=False):
        out = pd.DataFrame(
            {
                "time": pd.to_datetime(rows["ts"], unit="s", utc=True),
                "replica": names.get(int(target_id), str(target_id)),
                "seconds": rows["ts"].diff(),
            }
        )
        for column, (stored, is_counter) in SERIES.items():
            values = rows[stored].astype(float)
            out[column] = interval_increase(values) / out["seconds"] if is_counter else values
        for stored in INCREASES:
            out[f"d_{stored}"] = interval_increase(rows[stored].astype(float))
        out["hit_rate"] = _ratio(out["d_prefix_cache_hits"], out["d_prefix_cache_queries"])
        out["spec_acceptance"] = _ratio(
            out["d_spec_decode_accepted_tokens"], out["d_spec_decode_draft_tokens"]
        )
        parts.append(out)
    if not parts:
        columns = [
            "time",
            "replica",
            "seconds",
            *SERIES,
            *(f"d_{c}" for c in INCREASES),
            "hit_rate",
            "spec_acceptance",
        ]
        return pd.DataFrame(columns=columns)
    return pd.concat(parts, ignore_index=True)


def resample(series: pd.DataFrame, rule: str) -> pd.DataFrame:
    """Coarser intervals per replica: increases summed, ratios recomputed, gauges averaged."""
    if series.empty:
        return series
    parts = []
    for replica, rows in series.groupby("replica", sort=False):
        indexed = rows.set_index("time")
        sums = indexed[[f"d_{c}" for c in INCREASES] + ["seconds"]].resample(rule).sum()
        means = (
            indexed[["kv_cache_occupancy", "requests_running", "requests_waiting"]]
            .resample(rule)
            .mean()
        )
        out = pd.concat([sums, means], axis=1).reset_index()
        out["replica"] = replica
        out["hit_rate"] = _ratio(out["d_prefix_cache_hits"], out["d_prefix_cache_queries"])
        out["computed_prompt_tokens_per_second"] = _ratio(
            out["d_prompt_tokens_local_compute"], out["seconds"]
        )
        parts.append(out)
    return pd.concat(parts, ignore_index=True)


def gpu_series(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per GPU reading with a readable GPU name."""
    if frame.empty:
        return frame.assign(time=pd.Series(dtype="datetime64[ns, UTC]"), gpu=pd.Series(dtype=str))
    out = frame.copy()
    out["time"] = pd.to_datetime(out["ts"], unit="s", utc=True)
    out["gpu"] = out["host"].astype(str) + "/" + out["gpu_index"].astype(str)
    out["power_watts"] = out["power_watts"].astype(float)
    return out


def _ratio(part: pd.Series, whole: pd.Series) -> pd.Series:
    return (part / whole.where(whole > 0)).astype(float)
