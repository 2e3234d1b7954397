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
SERIES_COLUMNS = [
    "time",
    "replica",
    "seconds",
    *SERIES,
    *(f"d_{c}" for c in INCREASES),
    "hit_rate",
    "spec_acceptance",
]


def replica_series(frame: pd.DataFrame, names: dict[int, str]) -> pd.DataFrame:
    """Long-form rows (time, replica, one column per series) from replica_frame rows, for
    every replica at once (a per-replica loop costs more than the arithmetic)."""
    if frame.empty:
        return pd.DataFrame(columns=SERIES_COLUMNS)
    groups = frame["target_id"]
    stored = frame[list(COLUMNS)].astype(float)
    previous = stored.groupby(groups).shift()
    delta = stored - previous
    increases = delta.where(delta.isna() | (delta >= 0), stored)
    seconds = frame["ts"] - frame["ts"].groupby(groups).shift()
    # Each target's name looked up once, not once per row (241,000 rows an hour at 1,000).
    named = {t: names.get(int(t), str(t)) for t in pd.unique(groups)}
    out = pd.DataFrame(
        {
            "time": pd.to_datetime(frame["ts"], unit="s", utc=True),
            "replica": groups.map(named),
            "seconds": seconds,
        }
    )
    for column, (name, is_counter) in SERIES.items():
        out[column] = increases[name] / seconds if is_counter else stored[name]
    for name in INCREASES:
        out[f"d_{name}"] = increases[name]
    out["hit_rate"] = _ratio(out["d_prefix_cache_hits"], out["d_prefix_cache_queries"])
    out["spec_acceptance"] = _ratio(
        out["d_spec_decode_accepted_tokens"], out["d_spec_decode_draft_tokens"]
    )
    return out.reset_index(drop=True)


def resample(series: pd.DataFrame, rule: str) -> pd.DataFrame:
    """Coarser intervals per replica: increases summed, ratios recomputed, gauges averaged
    (intervals without a sample are left out: no data is not zero)."""
    if series.empty:
        return series
    grouped = series.groupby(["replica", pd.Grouper(key="time", freq=rule)], sort=False)
    sums = grouped[[f"d_{c}" for c in INCREASES] + ["seconds"]].sum()
    means = grouped[["kv_cache_occupancy", "requests_running", "requests_waiting"]].mean()
    out = pd.concat([sums, means], axis=1).reset_index().sort_values(["replica", "time"])
    out["hit_rate"] = _ratio(out["d_prefix_cache_hits"], out["d_prefix_cache_queries"])
    out["computed_prompt_tokens_per_second"] = _ratio(
        out["d_prompt_tokens_local_compute"], out["seconds"]
    )
    return out.reset_index(drop=True)


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
