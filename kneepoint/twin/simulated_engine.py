"""One simulated vLLM engine: continuous batching over a paged KV cache, stepped in time.

Each step schedules running requests first, then waiting ones while slots, token budget and
KV blocks allow (chunked prefill); when a running request cannot get a block, the most
recently admitted one is preempted and later recomputed from scratch. The step takes as long
as its bytes moved and FLOPs need on the GPU: decode reads the weights and every sequence's
KV cache (memory-bound), prefill does 2 × parameters FLOPs per token (compute-bound).

What vLLM 0.32 adds, each off unless configured: queue limits (`max_num_queued_reqs`,
`max_num_queued_tokens`): an arrival past them is refused (`Rejected`, HTTP 503) and counted
by reason; sleep mode (`sleep(level)`: in-flight requests aborted, the prefix cache
discarded, no step until `wake_up()`); the estimated FLOPs and bytes each step moves
(`--enable-mfu-metrics`, counted always: see `Engine._estimate`); and a CPU offload tier
(`kv_offload_gib`): every computed prompt block is stored to host memory, and a prefix the
device cache evicted is loaded back from there instead of recomputed (`HostCache`).
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kneepoint.twin.kvcache import HostCache, KvCache, block_hashes
from kneepoint.twin.profiles import GIB, Gpu, Model
from kneepoint.twin.stats import Stats

# Fractions of the datasheet a real serving stack reaches, calibrated on the
# RTX 4000 Ada + Qwen3-4B workshop figures of docs/explanation/domain.md
# (tests/twin/test_calibration.py).
BANDWIDTH_EFFICIENCY = 0.92
COMPUTE_EFFICIENCY = 0.9
STEP_OVERHEAD_SECONDS = 0.0015  # scheduling, sampling and kernel launches per step
ACTIVATION_RESERVE_GIB = 1.0  # activations and CUDA graphs, outside the KV cache
# Host-to-GPU copies of offloaded KV blocks: a PCIe Gen4 x16 link's effective rate.
HOST_LINK_BYTES_PER_SECOND = 25e9

TokenSink = Callable[[int, bool, float], None]  # (new tokens, finished, engine time)
# Called after each step with its work (request, tokens scheduled) and duration.
StepObserver = Callable[[list[tuple["Request", int]], float], None]


@dataclass(frozen=True)
class StepCost:
    """What one engine step costs, as a sum of linear terms (seconds), so it can be fitted to
    a real replica (kneepoint/whatif/calibrate.py). The default (`StepCost.of(config)`) is
    the physics from the GPU and model profiles: a fixed launch/scheduling overhead, the
    weights read once per step, every scheduled token's 2 × parameters FLOPs, each context
    token's KV read, and a drafter's steps."""

    overhead_seconds: float = STEP_OVERHEAD_SECONDS  # per step with work (not memory-bound)
    weight_read_seconds: float = 0.0  # per step with work: the weights streamed once
    token_seconds: float = 0.0  # per scheduled token (prefill and decode): compute
    prefill_token_seconds: float = 0.0  # extra per prefill (chunk) token: compute
    context_token_seconds: float = 0.0  # per context token read per step: KV bytes moved
    sequence_seconds: float = 0.0  # per sequence in the step (sampling, metadata)
    draft_token_seconds: float = 0.0  # per drafted token, in a step that decodes
    # Latency outside the engine steps per request (API server, tokenization): added to TTFT
    # by the what-if predictions, never to the engine's own clock.
    request_overhead_seconds: float = 0.0

    @classmethod
    def of(cls, config: EngineConfig) -> StepCost:
        """The profile physics of `config` (what the twin has always used); with tensor
        parallelism the GPUs' bandwidth and FLOPs add up (ideal scaling)."""
        bandwidth = (
            config.gpu.bandwidth_gbs * 1e9 * BANDWIDTH_EFFICIENCY * config.tensor_parallel_size
        )
        weights = config.weight_bytes / bandwidth
        return cls(
            overhead_seconds=STEP_OVERHEAD_SECONDS,
            weight_read_seconds=weights,
            token_seconds=2
            * config.model.parameters
            / (config.peak_flops * config.tensor_parallel_size * COMPUTE_EFFICIENCY),
            context_token_seconds=config.kv_bytes_per_token / bandwidth,
            draft_token_seconds=config.spec_draft_cost * weights,
        )

    def scaled(self, memory: float = 1.0, compute: float = 1.0) -> StepCost:
        """The terms bound by memory bandwidth times `memory`, those bound by compute times
        `compute` (another GPU: the ratios of the two GPUs' bandwidth and FLOPs)."""
        return StepCost(
            overhead_seconds=self.overhead_seconds,
            weight_read_seconds=self.weight_read_seconds * memory,
            token_seconds=self.token_seconds * compute,
            prefill_token_seconds=self.prefill_token_seconds * compute,
            context_token_seconds=self.context_token_seconds * memory,
            sequence_seconds=self.sequence_seconds,
            draft_token_seconds=self.draft_token_seconds * memory,
            request_overhead_seconds=self.request_overhead_seconds,
        )


@dataclass(frozen=True)
class EngineConfig:
    gpu: Gpu
    model: Model
    fp8_weights: bool = False
    fp8_kv_cache: bool = False
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int = 32768
    block_size: int = 16
    enable_prefix_caching: bool = True
    num_speculative_tokens: int = 0
    spec_acceptance_rate: float = 0.0  # per drafted token, given the ones before it
    spec_draft_cost: float = 0.1  # a draft step's cost relative to a target decode step
    # What a step costs; None: the GPU and model profiles' physics (StepCost.of).
    step_cost: StepCost | None = None
    # vLLM's --num-gpu-blocks-override: the KV cache's blocks as measured, not from memory.
    num_gpu_blocks_override: int | None = None
    # vLLM's scheduler queue limits (None: unlimited): an arrival that would make more than
    # max_num_queued_reqs unfinished requests, or that finds the prompts still in prefill at
    # max_num_queued_tokens or more, is refused with HTTP 503.
    max_num_queued_reqs: int | None = None
    max_num_queued_tokens: int | None = None
    # GPUs the model is sharded over: the estimated FLOPs and bytes are per GPU.
    tensor_parallel_size: int = 1
    # vLLM's --kv-offloading-size (GiB of host memory for the native CPU offload tier; 0: off).
    kv_offload_gib: float = 0.0

    @property
    def weight_bytes(self) -> float:
        # FP8 checkpoints keep embeddings, norms and the LM head in 16 bits (~1.25 B/param).
        return self.model.parameters * (1.25 if self.fp8_weights else 2)

    @property
    def kv_bytes_per_token(self) -> float:
        return self.model.kv_bytes_per_token(1 if self.fp8_kv_cache else 2)

    @property
    def num_gpu_blocks(self) -> int:
        """What vLLM's memory profiling leaves for the KV cache, in blocks."""
        if self.num_gpu_blocks_override is not None:
            if self.num_gpu_blocks_override < 2:
                raise ValueError("num_gpu_blocks_override must be at least 2")
            return self.num_gpu_blocks_override
        budget = self.gpu.memory_gib * GIB * self.gpu_memory_utilization
        budget *= self.tensor_parallel_size
        free = budget - self.weight_bytes - ACTIVATION_RESERVE_GIB * GIB
        blocks = int(free // (self.block_size * self.kv_bytes_per_token))
        if blocks < 2:
            raise ValueError(
                f"{self.model.name} does not fit on {self.gpu.name} at "
                f"gpu_memory_utilization {self.gpu_memory_utilization}"
            )
        return blocks

    @property
    def kv_offload_blocks(self) -> int:
        """Blocks the CPU offload tier holds (0: no offload)."""
        return int(self.kv_offload_gib * GIB // (self.block_size * self.kv_bytes_per_token))

    @property
    def peak_flops(self) -> float:
        return (self.gpu.fp8_tflops if self.fp8_weights else self.gpu.bf16_tflops) * 1e12


@dataclass(eq=False)
class Request:
    tokens: Sequence[int]
    max_tokens: int
    arrival: float
    sink: TokenSink | None = None
    hashes: list[int] = field(default_factory=list)
    computed: int = 0
    generated: int = 0
    held_hashes: int = 0
    private_blocks: int = 0
    finish_reason: str = "length"
    first_scheduled: float | None = None
    first_token: float | None = None
    preemptions: int = 0
    cached: int = 0  # prompt tokens found in the prefix cache when first scheduled
    host_cached: int = 0  # of them, loaded from the CPU offload tier

    @property
    def prompt_len(self) -> int:
        return len(self.tokens)

    @property
    def prefill_target(self) -> int:
        """Tokens whose KV must exist before the next token can be sampled."""
        return self.prompt_len + max(self.generated - 1, 0)


class Rejected(Exception):
    """An arrival refused by a queue limit; `reason` is vLLM's label for it."""

    def __init__(self, reason: str) -> None:
        super().__init__(
            "The engine is currently busy and cannot accept new requests. "
            "Please try again later or on a different instance."
            if reason == "max_num_queued_reqs"
            else "The engine has reached its prefill token backlog limit. "
            "Please try again later or on a different instance."
        )
        self.reason = reason


class Engine:
    def __init__(self, config: EngineConfig, now: float = 0.0, seed: int = 0) -> None:
        self.config = config
        self.now = now
        self.kv = KvCache(config.num_gpu_blocks, config.block_size, config.enable_prefix_caching)
        self.stats = Stats(config.max_model_len, config.num_speculative_tokens)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.waiting_for_capacity = 0
        self.admitted: list[Request] = []  # requests scheduled for the first time this step
        self.observers: list[StepObserver] = []
        self._rng = random.Random(seed)
        self.cost = config.step_cost or StepCost.of(config)
        self.host = HostCache(config.kv_offload_blocks) if config.kv_offload_gib > 0 else None
        self.sleep_level = 0  # 0 awake; 1 weights offloaded; 2 weights and KV discarded
        self._host_load_bytes = 0.0  # loaded from the CPU tier in the step being scheduled

    @property
    def capacity_tokens(self) -> int:
        return self.kv.num_blocks * self.config.block_size

    def add(
        self,
        tokens: Sequence[int],
        max_tokens: int,
        sink: TokenSink | None = None,
        finish_reason: str = "length",
        max_tokens_param: int | None = None,
    ) -> Request:
        """Queue a request that generates `max_tokens` and then finishes for `finish_reason`;
        its prompt keeps its last tokens where it would not fit max_model_len. Raises
        `Rejected` (and counts it) when a queue limit refuses it."""
        self._check_admission()
        # A sequence longer than the whole cache could never run: vLLM refuses such a length.
        max_len = min(self.config.max_model_len, self.capacity_tokens - self.config.block_size)
        limit = max_len - max_tokens
        if limit < 1:
            raise ValueError(f"max_tokens {max_tokens} leaves no room in max_model_len")
        prompt = list(tokens[-limit:]) or [0]
        hashes = (
            block_hashes(prompt, self.config.block_size)
            if self.config.enable_prefix_caching
            else []
        )
        request = Request(prompt, max_tokens, self.now, sink, hashes, finish_reason=finish_reason)
        self.stats.observe("request_params_max_tokens", max_tokens_param or max_tokens)
        self.stats.observe("request_params_n", 1)
        self.waiting.append(request)
        return request

    def _check_admission(self) -> None:
        # vllm/v1/engine/async_llm.py check_admission: unfinished requests (waiting and
        # running) against max_num_queued_reqs, then the prompt tokens of the requests
        # still in prefill against max_num_queued_tokens.
        config = self.config
        reason = None
        limit = config.max_num_queued_reqs
        if limit is not None and len(self.waiting) + len(self.running) + 1 > limit:
            reason = "max_num_queued_reqs"
        elif config.max_num_queued_tokens is not None:
            queued = sum(r.prompt_len for r in self.waiting if r.first_token is None)
            queued += sum(r.prompt_len for r in self.running if r.first_token is None)
            if queued >= config.max_num_queued_tokens:
                reason = "max_num_queued_tokens"
        if reason is not None:
            self.stats.admission_rejections[reason] += 1
            raise Rejected(reason)

    def sleep(self, level: int = 1) -> None:
        """vLLM's POST /sleep?level= (mode abort): requests in flight are aborted, the KV
        cache (and with it the prefix cache) is discarded, and no step runs until
        wake_up(); level 1 offloads the weights to the host, level 2 discards them."""
        if level not in (1, 2):
            raise ValueError("sleep level must be 1 or 2")
        for request in [*self.running, *self.waiting]:
            if request in self.running:
                self._release(request)
                self.running.remove(request)
            request.finish_reason = "abort"
            self.stats.finished["abort"] += 1
            if request.sink is not None:
                request.sink(0, True, self.now)
        self.waiting.clear()
        self.waiting_for_capacity = 0
        config = self.config
        self.kv = KvCache(self.kv.num_blocks, config.block_size, config.enable_prefix_caching)
        self.sleep_level = level

    def wake_up(self) -> None:
        self.sleep_level = 0

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting

    def step(self) -> float:
        """Run one engine step; return its duration in seconds (0 when there is no work or
        the engine sleeps)."""
        if self.idle or self.sleep_level:
            return 0.0
        self.admitted = []
        budget = self.config.max_num_batched_tokens
        work: list[tuple[Request, int]] = []
        preempted_now = False
        for request in list(self.running):
            if request not in self.running:
                continue  # preempted earlier in this step
            tokens = min(self._wanted(request), budget)
            if tokens <= 0:
                continue
            while not self._grow(request, tokens):
                victim = self.running[-1]
                self._preempt(victim)
                preempted_now = True
                if victim is request:
                    break
            else:
                work.append((request, tokens))
                budget -= tokens
        self.waiting_for_capacity = 0
        if not preempted_now:
            budget = self._admit(budget, work)
        else:
            self.waiting_for_capacity = len(self.waiting)
        if not work:
            return self._stall()
        duration = self._duration(work)
        self.now += duration
        self._finish_step(work, duration)
        for observe in self.observers:
            observe(work, duration)
        return duration

    def _wanted(self, request: Request) -> int:
        remaining = request.prefill_target - request.computed
        if remaining > 0:
            return remaining
        return 1 + self.config.num_speculative_tokens

    def _grow(self, request: Request, tokens: int) -> bool:
        """Give `request` the blocks for `tokens` more tokens; False if the cache is full."""
        after = request.computed + tokens
        blocks = math.ceil(after / self.config.block_size)
        named = min(len(request.hashes), after // self.config.block_size)
        new_hashes = request.hashes[request.held_hashes : named]
        private = max(0, blocks - named) - request.private_blocks
        private = max(private, 0)
        if self.kv.cost(new_hashes, private) > self.kv.free:
            return False
        self.kv.acquire(new_hashes, private)
        request.held_hashes = max(request.held_hashes, named)
        request.private_blocks += private
        return True

    def _preempt(self, request: Request) -> None:
        self._release(request)
        self.running.remove(request)
        request.computed = 0
        request.preemptions += 1
        self.stats.preemptions += 1
        self.stats.preempted_prompt_tokens += request.prompt_len
        self.stats.preempted_output_tokens += request.generated
        self.waiting.appendleft(request)

    def _release(self, request: Request) -> None:
        self.kv.release(request.hashes[: request.held_hashes], request.private_blocks)
        request.held_hashes = request.private_blocks = 0

    def _admit(self, budget: int, work: list[tuple[Request, int]]) -> int:
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting[0]
            first_time = request.first_scheduled is None
            cached = self._cached_blocks(request)
            loaded = self._host_blocks(request, cached)
            hashes = request.hashes[: cached + loaded]
            if self.kv.cost(hashes, 0) > self.kv.free:
                self.waiting_for_capacity = len(self.waiting)
                break
            self.kv.acquire(hashes, 0)
            request.held_hashes = cached + loaded
            request.computed = (cached + loaded) * self.config.block_size
            tokens = min(request.prefill_target - request.computed, budget)
            if not self._grow(request, tokens):
                self._release(request)
                self.waiting_for_capacity = len(self.waiting)
                break
            self.waiting.popleft()
            self.running.append(request)
            work.append((request, tokens))
            budget -= tokens
            if loaded:
                self._load_from_host(request, cached, loaded)
            if first_time:
                request.host_cached = loaded * self.config.block_size
                self._count_first_schedule(request)
        return budget

    def _host_blocks(self, request: Request, cached: int) -> int:
        """Blocks past the device's cached prefix that the CPU offload tier holds."""
        if self.host is None:
            return 0
        limit = (request.prefill_target - 1) // self.config.block_size
        return self.host.cached_run(request.hashes[cached:limit])

    def _load_from_host(self, request: Request, cached: int, loaded: int) -> None:
        assert self.host is not None
        self.host.touch(request.hashes[cached : cached + loaded])
        self.stats.kv_offload_load_bytes += loaded * self._block_bytes
        self._host_load_bytes += loaded * self._block_bytes

    @property
    def _block_bytes(self) -> float:
        return self.config.block_size * self.config.kv_bytes_per_token

    def _store_to_host(self, request: Request) -> None:
        """Offload a request's computed prompt blocks (those the tier does not hold yet)."""
        assert self.host is not None
        stored = self.host.store(request.hashes)
        self.stats.kv_offload_store_bytes += stored * self._block_bytes

    def _cached_blocks(self, request: Request) -> int:
        # At least one prompt token is always computed, to sample from.
        limit = (request.prefill_target - 1) // self.config.block_size
        return min(self.kv.cached_prefix(request.hashes), limit)

    def _count_first_schedule(self, request: Request) -> None:
        stats = self.stats
        request.first_scheduled = self.now
        hit = request.cached = request.computed
        host = request.host_cached
        self.admitted.append(request)
        stats.prefix_cache_queries += request.prompt_len
        stats.prefix_cache_hits += hit - host
        stats.prompt_cache_hit += hit - host
        stats.prompt_local_compute += request.prompt_len - hit
        stats.prompt_tokens += request.prompt_len
        if self.host is not None:
            # The offloading connector is asked for what the device did not have.
            stats.external_prefix_cache_queries += request.prompt_len - (hit - host)
            stats.external_prefix_cache_hits += host
            stats.prompt_host_hit += host
        stats.observe("request_queue_time_seconds", self.now - request.arrival)
        stats.observe("request_prompt_tokens", request.prompt_len)
        stats.observe("request_prefill_kv_computed_tokens", request.prompt_len - hit)

    def _duration(self, work: list[tuple[Request, int]]) -> float:
        config, cost = self.config, self.cost
        self._estimate(work)
        tokens = sum(count for _, count in work)
        context = sum(request.computed + count for request, count in work)
        memory = cost.weight_read_seconds + context * cost.context_token_seconds
        prefill_tokens = sum(
            count for request, count in work if request.computed < request.prefill_target
        )
        compute = (
            tokens * cost.token_seconds
            + prefill_tokens * cost.prefill_token_seconds
            + len(work) * cost.sequence_seconds
        )
        decoding = any(request.computed >= request.prefill_target for request, _ in work)
        draft = 0.0
        if decoding and config.num_speculative_tokens:
            draft = cost.draft_token_seconds * config.num_speculative_tokens
        stats = self.stats
        stats.memory_seconds += memory
        stats.compute_seconds += compute
        stats.prefill_compute_seconds += compute * prefill_tokens / max(tokens, 1)
        duration = cost.overhead_seconds + memory + compute + draft
        # Blocks loaded from the CPU tier this step cross the host link first.
        duration += self._host_load_bytes / HOST_LINK_BYTES_PER_SECOND
        self._host_load_bytes = 0.0
        stats.busy_seconds += duration
        stats.observe("iteration_tokens_total", tokens)
        return duration

    def _estimate(self, work: list[tuple[Request, int]]) -> None:
        """vLLM's analytic FLOPs and bytes of a step (vllm/v1/metrics/perf.py), simplified:
        FLOPs = 2 × parameters × tokens (every linear layer, the embedding and LM head
        counted for every token) + the attention term 4 × layers × query heads × head dim ×
        Σ tokens × context; bytes read = the weights once + every context token's KV (no
        activations); bytes written = the new tokens' KV (no activations). Per GPU: divided
        by the tensor-parallel size."""
        config, stats = self.config, self.stats
        model = config.model
        tokens = sum(count for _, count in work)
        token_context = sum(count * (request.computed + count) for request, count in work)
        context = sum(request.computed + count for request, count in work)
        attention = 4 * model.layers * model.attention_heads * model.head_dim * token_context
        tp = config.tensor_parallel_size
        stats.estimated_flops += (2 * model.parameters * tokens + attention) / tp
        read = config.weight_bytes + context * config.kv_bytes_per_token
        stats.estimated_read_bytes += read / tp
        stats.estimated_write_bytes += tokens * config.kv_bytes_per_token / tp

    def _finish_step(self, work: list[tuple[Request, int]], duration: float) -> None:
        for request, tokens in work:
            if request.computed < request.prefill_target:
                request.computed += tokens
                if request.computed >= request.prompt_len and self.host is not None:
                    self._store_to_host(request)
                if request.computed < request.prefill_target:
                    continue  # a chunk of a longer prefill: nothing sampled yet
                emitted = 1
            else:
                emitted = 1 + self._accepted_drafts(request)
                request.computed += emitted
                self.stats.observe("inter_token_latency_seconds", duration)
            emitted = min(emitted, request.max_tokens - request.generated)
            request.generated += emitted
            self.stats.generation_tokens += emitted
            if request.first_token is None:
                request.first_token = self.now
                self.stats.observe("time_to_first_token_seconds", self.now - request.arrival)
            done = request.generated >= request.max_tokens
            if done:
                self._complete(request)
            if request.sink is not None:
                request.sink(emitted, done, self.now)

    def _accepted_drafts(self, request: Request) -> int:
        gamma = self.config.num_speculative_tokens
        if not gamma:
            return 0
        # The verifier accepts each drafted token with probability alpha, until the first
        # rejection; a seeded generator keeps runs repeatable.
        accepted = 0
        while accepted < gamma and self._rng.random() < self.config.spec_acceptance_rate:
            accepted += 1
        stats = self.stats
        stats.spec_drafts += 1
        stats.spec_draft_tokens += gamma
        stats.spec_accepted += accepted
        for position in range(accepted):
            stats.spec_accepted_per_position[position] += 1
        return accepted

    def _complete(self, request: Request) -> None:
        self._release(request)
        self.running.remove(request)
        stats = self.stats
        stats.finished[request.finish_reason] += 1
        first_scheduled = request.first_scheduled or request.arrival
        first_token = request.first_token or self.now
        stats.observe("e2e_request_latency_seconds", self.now - request.arrival)
        stats.observe("request_inference_time_seconds", self.now - first_scheduled)
        stats.observe("request_prefill_time_seconds", first_token - first_scheduled)
        stats.observe("request_decode_time_seconds", self.now - first_token)
        stats.observe("request_generation_tokens", request.generated)
        stats.observe("request_max_num_generation_tokens", request.max_tokens)
        stats.observe("request_num_preemptions", request.preemptions)
        if request.generated > 1:
            stats.observe(
                "request_time_per_output_token_seconds",
                (self.now - first_token) / (request.generated - 1),
            )

    def _stall(self) -> float:
        # Nothing could be scheduled (all waiting for KV): let time pass so callers progress.
        self.now += STEP_OVERHEAD_SECONDS
        return STEP_OVERHEAD_SECONDS
