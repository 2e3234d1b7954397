"""The shapes of `kneepoint status --json` (docs/reference/json.md), declared once: the status
document, its replicas, its fleet, its GPUs and its gone targets, as kneepoint/status.py
builds them, the prefix-cache hit rates alert evaluation reads (status.hit_rates), and the
numbers per replica the pages add (kneepoint/views.py `View.rows`).

They are `TypedDict`s, not dataclasses: the JSON contract is published and must stay
byte-identical, and a TypedDict stays a plain dict at runtime, so `json.dumps`, pandas
(`pd.DataFrame(status["replicas"])`) and every `replica["key"]` reader keep working with
the keys in the order the builder writes them, while mypy checks every key and the type
of its value. A dataclass would need a `to_json()` that restates the key order and a
change to every reader at once.

In the status, `None` means no data (never 0 or NaN): a window without samples, a counter
the engine lacks, or a quantity the engine cannot give (its reason in `unavailable`)."""

from __future__ import annotations

from typing import TypedDict

from kneepoint.derived.saturation import Saturation
from kneepoint.samples import LoraAdapters

# A histogram's p50, p90 and p99 (kneepoint.derived.latency.quantiles); None: no
# observation in the window.
Quantiles = dict[str, float | None]


class Readings(TypedDict):
    """The numbers read from a target's row and its latest sample, and the window's
    counters per second: for a replica, and summed (never a fraction) for the fleet."""

    name: str
    up: bool | None  # None: never scraped; a stale target is down (False)
    stale: bool
    last_scrape_at: str | None  # ISO time
    last_error: str | None
    engine: str | None  # vllm, sglang, …; the fleet's "mixed" when several
    engine_generation: str | None  # vLLM's "v0"/"v1"; the fleet's "mixed" when several
    unavailable: dict[str, str]  # quantity -> why the engine cannot give it
    engines: int | None  # data-parallel engines behind the endpoint
    model_names: list[str]
    kv_cache_occupancy: float | None
    kv_cache_occupancy_mean: float | None
    kv_cache_capacity_tokens: int | None
    requests_running: float | None
    requests_waiting: float | None
    requests_waiting_capacity: float | None
    preemptions: float | None  # the counter's increase over the window
    preemptions_per_second: float | None
    prompt_tokens_per_second: float | None
    generation_tokens_per_second: float | None
    gpu_utilization: float | None  # mean busy share of its GPUs
    # Load shedding (vLLM 0.32+): requests refused at admission per second over the window.
    requests_refused_per_second: float | None


class Derived(TypedDict):
    """The windowed numbers derived from one window (status.derived)."""

    prefix_cache_hit_rate: float | None
    preemption_recompute_tokens: float | None
    preemption_recompute_is_estimate: bool | None
    spec_decode_acceptance_rate: float | None
    spec_decode_mean_acceptance_length: float | None
    spec_decode_per_position_acceptance: list[float] | None
    ttft_seconds: Quantiles | None
    itl_seconds: Quantiles | None
    e2e_seconds: Quantiles | None
    cost_per_million_generated_tokens: float | None
    cost_per_million_tokens: float | None
    # The share of prompt tokens served from each cache tier (kneepoint.derived.tiers.TIERS
    # -> 0..1, None for a tier the engine does not name); None: no tier counters.
    prefix_cache_tier_shares: dict[str, float | None] | None
    external_prefix_cache_hit_rate: float | None
    corrupted_requests: float | None  # the counter's increase over the window
    requests_refused_share: float | None  # refused ÷ (finished + refused) over the window


class ModelUtilization(TypedDict):
    """Model FLOPs and memory-bandwidth utilization over the window (0..1;
    kneepoint.derived.flops), and why each is null where it is (None when known)."""

    mfu: float | None
    mbu: float | None
    mfu_unavailable: str | None
    mbu_unavailable: str | None


class Numbers(Readings, Derived, ModelUtilization):
    """Every number of a replica but its stall: the fleet's block has exactly these keys."""


class FleetNumbers(Numbers):
    """`fleet`: the replicas' numbers aggregated, and how many replicas are saturated."""

    saturated_replicas: int | None  # None: no replica's saturation could be judged


class Stall(TypedDict):
    """A replica's stall (kneepoint.derived.stall); None: no data."""

    stalled: bool | None
    stalled_since: str | None  # ISO time, only while stalled
    stall_seconds: float | None


class Saturated(TypedDict):
    """A replica's saturation verdict over the window (kneepoint.derived.saturation)."""

    saturation: Saturation


class EngineState(TypedDict):
    """A replica's latest engine state beyond the fleet's numbers: its LoRA adapters
    (None without LoRA) and its CPU offload tier's occupancy (None without one)."""

    lora_adapters: LoraAdapters | None
    kv_offload_usage: float | None


class Sleep(TypedDict):
    """Put to sleep on purpose (vLLM's sleep mode, kneepoint.derived.stall.asleep): never
    stalled. `sleep_state`: "awake", "weights offloaded" (level 1) or "everything
    discarded" (level 2); both None where the engine does not say (or the target is stale)."""

    asleep: bool | None
    sleep_state: str | None


class StallSleep(Stall, Sleep):
    """A replica's stall and sleep, as status._stall gives them."""


class ReplicaStatus(Numbers, Stall, Sleep, Saturated, EngineState):
    """One entry of `replicas`."""


class GpuStatus(TypedDict):
    """One entry of `gpus`: the GPU's latest DCGM sample, its replica and its energy."""

    host: str
    index: int
    model: str | None
    replica: str | None  # None: the GPU is not assigned to a replica
    utilization: float | None
    gr_engine_active: float | None
    sm_active: float | None
    tensor_active: float | None  # DCGM_FI_PROF_PIPE_TENSOR_ACTIVE
    dram_active: float | None
    power_watts: float | None
    energy_joules: float | None  # the energy counter's increase over the window
    temperature_c: float | None
    memory_temperature_c: float | None
    fb_used_mib: float | None
    xid_error: float | None
    pod: str | None


class GoneTarget(TypedDict):
    """One entry of `gone`: a target no longer configured nor scraped (status.gone_targets)."""

    name: str
    kind: str  # "replica" | "gpu_node"
    engine: str | None  # None for a GPU node
    state: str  # "gone"
    gone_since: str  # ISO time of its last scrape
    last_success_at: str | None


class Status(TypedDict):
    """The whole document `kneepoint status --json` prints."""

    generated_at: str  # ISO time of the window's end
    window_seconds: float  # an int when the window is whole seconds
    replicas: list[ReplicaStatus]
    fleet: FleetNumbers
    gpus: list[GpuStatus]
    gone: list[GoneTarget]


class WindowNumbers(TypedDict):
    """A replica's numbers from its window beyond its status (views._numbers): what the
    pages show and the alert rules read besides the status."""

    mean_context_tokens: float | None
    sequence_slots: float | None
    sequence_slots_left: float | None
    # Its peaks (views._peaks, or the database's: kneepoint/store/window_rows.py); NaN, as
    # pandas' max gives it, where the window has rows but none knows the value.
    time_saturated: float | None  # share of the window with the KV cache saturated
    peak_kv_occupancy: float | None
    peak_waiting: float | None
    peak_running: float | None
    queue_seconds: Quantiles | None
    requests_per_second: float | None
    finish_reasons: dict[str, float | None]  # finish reason -> requests finished so
    preemptions_per_request: float | None
    recompute_tokens_per_second: float | None
    recompute_share_of_prefill: float | None
    prefix_cross_check: float | None
    # Prefix cache, KV offload and multimodal cache (kneepoint.derived.tiers).
    prefill_computed_tokens_per_request: float | None
    mean_prompt_tokens: float | None
    kv_offload_load_bytes_per_second: float | None
    kv_offload_store_bytes_per_second: float | None
    mm_cache_hit_rate: float | None
    spec_expected_speedup: float | None
    spec_verdict: str | None
    energy_kwh: float | None
    joules_per_million_tokens: float | None
    idle_gpu_hours: float | None


class KneeCost(TypedDict, total=False):
    """A replica's cost against its knee: the fields of kneepoint.derived.cost.Economics.
    Only where pages are built (`build_view(pages=True)`): alert evaluation's rows lack it."""

    knee_run: str | None
    knee_output_tokens_per_second: float | None
    nominal_cost_per_million_generated_tokens: float | None
    utilization: float | None
    true_over_nominal: float | None
    api_cost_per_million_generated_tokens: float | None
    break_even_utilization: float | None


class PageNumbers(WindowNumbers, KneeCost):
    """One of `View.rows`: a replica's window numbers and, for pages, its cost at the knee."""


class HitRate(TypedDict):
    """A prefix-cache hit rate over a window: the fleet's; a replica's or the fleet's
    status block has it too."""

    prefix_cache_hit_rate: float | None


class ReplicaHitRate(HitRate):
    name: str


class HitRates(TypedDict):
    """status.hit_rates: the status's hit rates alone, in its shape."""

    replicas: list[ReplicaHitRate]
    fleet: HitRate
