"""What a twin engine counts: vLLM's counters and histograms (with vLLM 0.32's buckets),
and the GPU activity DCGM would see."""

from __future__ import annotations

import operator
from bisect import bisect_left
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

# vLLM 0.32's bucket bounds (vllm/v1/metrics/loggers.py), as a real server exposes them.
TTFT = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
REQUEST_TIME = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
PREEMPTIONS = (1, 2, 3, 4, 5, 10, 20)
PARAMS_N = (1, 2, 5, 10, 20)
ITERATION_TOKENS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def one_two_five(limit: int) -> tuple[float, ...]:
    """vLLM's 1-2-5 token buckets up to max_model_len."""
    bounds: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > limit:
                return tuple(bounds)
            bounds.append(float(value))
        exponent += 1


@dataclass
class Histo:
    """A histogram with fixed upper bounds (the +Inf bucket implied)."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float, times: int = 1) -> None:
        self.counts[bisect_left(self.bounds, value)] += times
        self.total += value * times

    def observe_many(self, values: npt.NDArray[np.float64], times: int = 1) -> None:
        """Observe each of `values` `times` times (as many observe() calls, in bulk)."""
        if not len(values):
            return
        buckets = np.searchsorted(np.asarray(self.bounds), values, side="left")
        added = (np.bincount(buckets, minlength=len(self.counts)) * times).tolist()
        self.counts = list(map(operator.add, self.counts, added))
        self.total += float(values.sum()) * times

    def cumulative(self) -> list[int]:
        running, out = 0, []
        for count in self.counts:
            running += count
            out.append(running)
        return out


FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
ADMISSION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")


@dataclass
class Stats:
    """Cumulative since the engine started, as vLLM's counters are."""

    max_model_len: int
    num_speculative_tokens: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    preempted_prompt_tokens: int = 0  # prompt and output tokens of the requests preempted
    preempted_output_tokens: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    prompt_local_compute: int = 0
    prompt_cache_hit: int = 0  # device (GPU) prefix-cache hits
    prompt_host_hit: int = 0  # prefix hits loaded from the CPU offload tier
    external_prefix_cache_queries: int = 0
    external_prefix_cache_hits: int = 0
    admission_rejections: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(ADMISSION_REASONS, 0)
    )
    # vLLM's --enable-mfu-metrics estimates, per GPU
    estimated_flops: float = 0.0
    estimated_read_bytes: float = 0.0
    estimated_write_bytes: float = 0.0
    kv_offload_load_bytes: float = 0.0
    kv_offload_store_bytes: float = 0.0
    finished: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINISH_REASONS, 0))
    spec_drafts: int = 0
    spec_draft_tokens: int = 0
    spec_accepted: int = 0
    spec_accepted_per_position: list[int] = field(default_factory=list)
    # GPU activity, in seconds of engine time
    busy_seconds: float = 0.0
    compute_seconds: float = 0.0
    memory_seconds: float = 0.0
    prefill_compute_seconds: float = 0.0
    histograms: dict[str, Histo] = field(default_factory=dict)

    def __post_init__(self) -> None:
        tokens = one_two_five(self.max_model_len)
        self.spec_accepted_per_position = [0] * self.num_speculative_tokens
        self.histograms = {
            "time_to_first_token_seconds": Histo(TTFT),
            "inter_token_latency_seconds": Histo(ITL),
            "request_time_per_output_token_seconds": Histo(ITL),
            "e2e_request_latency_seconds": Histo(REQUEST_TIME),
            "request_queue_time_seconds": Histo(REQUEST_TIME),
            "request_inference_time_seconds": Histo(REQUEST_TIME),
            "request_prefill_time_seconds": Histo(REQUEST_TIME),
            "request_decode_time_seconds": Histo(REQUEST_TIME),
            "request_prompt_tokens": Histo(tokens),
            "request_generation_tokens": Histo(tokens),
            "request_max_num_generation_tokens": Histo(tokens),
            "request_params_max_tokens": Histo(tokens),
            "request_prefill_kv_computed_tokens": Histo(tokens),
            "request_params_n": Histo(PARAMS_N),
            "request_num_preemptions": Histo(PREEMPTIONS),
            "iteration_tokens_total": Histo(ITERATION_TOKENS),
        }

    def observe(self, name: str, value: float, times: int = 1) -> None:
        self.histograms[name].observe(value, times)

    def observe_many(self, name: str, values: npt.NDArray[np.float64], times: int = 1) -> None:
        self.histograms[name].observe_many(values, times)


class Counters(Stats):
    """Stats that keep the counters alone: observing a histogram does nothing (Engine's
    `counters_only`, for a caller that takes its latencies from its requests' own times)."""

    def observe(self, name: str, value: float, times: int = 1) -> None:
        pass

    def observe_many(self, name: str, values: npt.NDArray[np.float64], times: int = 1) -> None:
        pass
