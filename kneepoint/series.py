"""Time series for charts, from stored rows: gauges as stored, counters as per-interval rates."""

from __future__ import annotations

import pandas as pd

# Chart column -> (stored column, is it a counter to turn into a per-second rate?)
SERIES = {
    "kv_cache_occupancy": ("kv_cache_usage", False),
    "requests_running": ("requests_running", False),
    "requests_waiting": ("requests_waiting", False),
    "prompt_tokens_per_second": ("prompt_tokens", True),
    "generation_tokens_per_second": ("generation_tokens", True),
    "preemptions_per_second": ("preemptions", True),
}


def interval_rates(times: pd.Series, values: pd.Series) -> pd.Series:
    """Per-second rate between consecutive samples; after a reset the new value is the
    increase (as in counters.increase), so a restart never shows as a negative dip."""
    delta = values.diff()
    delta = delta.where(delta >= 0, values)
    return delta / times.diff()


def replica_series(frame: pd.DataFrame, names: dict[int, str]) -> pd.DataFrame:
    """Long-form rows (time, replica, one column per SERIES key) from replica_frame rows."""
    parts = []
    for target_id, rows in frame.groupby("target_id", sort=False):
        out = pd.DataFrame(
            {
                "time": pd.to_datetime(rows["ts"], unit="s", utc=True),
                "replica": names.get(int(target_id), str(target_id)),
            }
        )
        for column, (stored, is_counter) in SERIES.items():
            values = rows[stored].astype(float)
            out[column] = interval_rates(rows["ts"], values) if is_counter else values
        parts.append(out)
    if not parts:
        return pd.DataFrame(columns=["time", "replica", *SERIES])
    return pd.concat(parts, ignore_index=True)
