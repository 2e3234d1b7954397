"""One simulated vLLM engine: continuous batching over a paged KV cache, stepped in time.

Each step schedules as vLLM V1's scheduler does (docs/explanation/whatif.md "The scheduler"):
running requests first, then waiting ones while slots, token budget and KV blocks for their
whole sequence allow (chunked prefill); when a running request cannot get a block, the last
running one is preempted and later recomputed (its cached blocks, output ones included, hit
again where not evicted). `Engine.advance` runs pure-decode stretches in one go. The step
takes as long as its bytes moved and FLOPs need on the GPU: decode reads the weights and
every sequence's KV cache (memory-bound), prefill does 2 × parameters FLOPs per token
(compute-bound).

What vLLM 0.32 adds, each off unless configured: queue limits (`max_num_queued_reqs`,
`max_num_queued_tokens`): an arrival past them is refused (`Rejected`, HTTP 503) and counted
by reason; sleep mode (`sleep(level)`: in-flight requests aborted, the prefix cache
discarded, no step until `wake_up()`); the estimated FLOPs and bytes each step moves
(`--enable-mfu-metrics`, counted always: see `Engine._estimate`); and a CPU offload tier
(`kv_offload_gib`): every computed prompt block is stored to host memory, and a prefix the
device cache evicted is loaded back from there instead of recomputed (`HostCache`).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from kneepoint.twin.kvcache import HostCache, KvCache, block_hashes
from kneepoint.twin.profiles import GIB, Gpu, Model
from kneepoint.twin.stats import Counters, Stats

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
    # vLLM's --enable-chunked-prefill (on by default in V1): off, a prompt that does not fit
    # the step's remaining token budget waits for a later step instead of being split.
    enable_chunked_prefill: bool = True
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
    hashes: list[int] = field(default_factory=list)  # of its full blocks, output included
    computed: int = 0
    generated: int = 0
    # The KV blocks it holds, in order: a block's hash once it is full and named (cached),
    # None while it is not.
    blocks: list[int | None] = field(default_factory=list)
    named: int = 0  # leading blocks already offered a name
    serial: int = 0  # names the blocks of its output tokens (unique per request)
    finish_reason: str = "length"
    first_scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    preemptions: int = 0
    cached: int = 0  # prompt tokens found in the prefix cache when first scheduled
    host_cached: int = 0  # of them, loaded from the CPU offload tier
    # The prompt never changes: its length is a field, not a property (the scheduler reads
    # it for every running request at every step).
    prompt_len: int = field(init=False)

    def __post_init__(self) -> None:
        self.prompt_len = len(self.tokens)

    @property
    def num_tokens(self) -> int:
        """vLLM's request.num_tokens: prompt and output tokens so far."""
        return self.prompt_len + self.generated

    @property
    def prefill_target(self) -> int:
        """Tokens whose KV must exist before the next token can be sampled."""
        return self.prompt_len + max(self.generated - 1, 0)

    @property
    def decoding(self) -> bool:
        """Every token but the last output one has its KV: the next step computes one."""
        return self.generated > 0 and self.computed == self.prompt_len + self.generated - 1


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
    def __init__(
        self, config: EngineConfig, now: float = 0.0, seed: int = 0, counters_only: bool = False
    ) -> None:
        """`counters_only`: keep the counters alone, no histogram and no time or work sums
        (busy, memory and compute seconds; estimated FLOPs and bytes), for a caller that reads
        the counters and takes latencies from its requests' own times (the what-if replay):
        the same run, cheaper."""
        self.config = config
        self.now = now
        self.kv = KvCache(config.num_gpu_blocks, config.block_size, config.enable_prefix_caching)
        self.accounting = not counters_only
        self.stats = (Counters if counters_only else Stats)(
            config.max_model_len, config.num_speculative_tokens
        )
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
        self._requests = 0  # requests added: each one's serial
        self._finished = 0  # requests finished (advance stops after a step that finishes one)
        self.fast_forwarded = 0  # steps advance() ran in bulk

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
        known_hashes: Sequence[int] = (),
    ) -> Request:
        """Queue a request that generates `max_tokens` and then finishes for `finish_reason`;
        its prompt keeps its last tokens where it would not fit max_model_len. Raises
        `Rejected` (and counts it) when a queue limit refuses it. `known_hashes`: the block
        hashes of the prompt's first blocks where the caller kept them (block_hashes'
        `known`; unused where the prompt is cut)."""
        self._check_admission()
        # A sequence longer than the whole cache could never run: vLLM refuses such a length.
        max_len = min(self.config.max_model_len, self.capacity_tokens - self.config.block_size)
        limit = max_len - max_tokens
        if limit < 1:
            raise ValueError(f"max_tokens {max_tokens} leaves no room in max_model_len")
        prompt = list(tokens[-limit:]) or [0]
        if len(prompt) != len(tokens):
            known_hashes = ()  # cut: its blocks begin elsewhere
        hashes = (
            block_hashes(prompt, self.config.block_size, known_hashes)
            if self.config.enable_prefix_caching
            else []
        )
        self._requests += 1
        request = Request(
            prompt,
            max_tokens,
            self.now,
            sink,
            hashes,
            finish_reason=finish_reason,
            serial=self._requests,
        )
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
        # vllm/v1/core/sched/scheduler.py Scheduler.schedule: the running requests first, in
        # order, each with what it lacks up to the budget left; where its blocks cannot be
        # had, the lowest-priority running request (FCFS: the last) is preempted until they
        # can, or until it preempted itself (then the running ones after it wait too).
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            tokens = min(self._wanted(request), budget)
            scheduled = True
            while not self._grow(request, tokens):
                victim = self.running[-1]
                self._preempt(victim)
                preempted_now = True
                if victim is request:
                    scheduled = False
                    break
            if not scheduled:
                break
            work.append((request, tokens))
            budget -= tokens
            index += 1
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

    def advance(self, until: float) -> float:
        """Run engine steps until `now` reaches `until`, a request finished in the last step
        run, or the engine is idle (idle from the start, `now` becomes `until`); return
        `now`. Stretches of steps where every running request decodes and none finishes,
        preempts or lets a waiting one in are computed in one go (`_fast_forward`), with the
        counters, histograms and times step() one at a time gives (to float rounding); a
        request's sink hears once at a stretch's end, with the tokens of the stretch. With
        observers attached, speculative decoding on or a subclass's own `_duration` it steps
        one at a time."""
        if self.idle or self.sleep_level:
            self.now = max(self.now, until)
            return self.now
        while self.now < until and not self.idle:
            finished = self._finished
            if not self._fast_forward(until):
                self.step()
            if self._finished != finished:
                break
        return self.now

    # A stretch is at most this many steps (bounds the arrays of one fast-forward).
    FAST_FORWARD_STEPS = 4096

    def _fast_forward(self, until: float) -> bool:
        """Run in one go the pure-decode steps that step() would run next, up to the one
        that reaches `until`, stopping short of the step in which a request finishes or a
        block cannot be had; False (nothing run) where fewer than two such steps are next."""
        config, cost, kv, running = self.config, self.cost, self.kv, self.running
        n = len(running)
        if self.observers or config.num_speculative_tokens or not n:
            return False
        if type(self)._duration is not Engine._duration:
            return False  # a subclass that notes each step (kneepoint/whatif/sweep.py)
        if n > config.max_num_batched_tokens:
            return False
        # Every running request decodes (Request.decoding, inlined: this is asked before
        # every step), and the fewest tokens any has left bounds the stretch.
        left = self.FAST_FORWARD_STEPS + 1
        for r in running:
            generated = r.generated
            if not generated or r.computed != r.prompt_len + generated - 1:
                return False
            left = min(left, r.max_tokens - generated)
        waiting_for_capacity = self._admission_blocked(config.max_num_batched_tokens - n)
        if waiting_for_capacity is None:
            return False
        steps = left - 1
        if steps < 2:
            return False
        size = config.block_size
        # Past the tokens its blocks still hold (its room), a request lacks one more block
        # every `size` steps: after k steps, ceil((k - room) / size). The stretch ends
        # before the free blocks run out (what it lacks only grows with k).
        rooms = [len(r.blocks) * size - r.computed for r in running]
        free = kv.free

        def lacking(k: int) -> list[int]:
            return [-(-(k - room) // size) if k > room else 0 for room in rooms]

        if sum(lacking(steps)) > free:
            covered, short = 0, steps  # lacking(covered) fits, lacking(short) does not
            while short - covered > 1:
                middle = (covered + short) // 2
                if sum(lacking(middle)) <= free:
                    covered = middle
                else:
                    short = middle
            steps = covered
            if steps < 2:
                return False
        # Each step's end, its duration term by term as _duration adds them and the ends
        # added left to right as step() adds them (the same floats), up to the one that
        # reaches `until`.
        overhead, weights, per_context = (
            cost.overhead_seconds,
            cost.weight_read_seconds,
            cost.context_token_seconds,
        )
        compute = (
            n * cost.token_seconds + 0 * cost.prefill_token_seconds + n * cost.sequence_seconds
        )
        context = sum(r.computed for r in running) + n
        ends: list[float] = []
        end = self.now
        for _ in range(steps):
            end += overhead + (weights + context * per_context) + compute
            ends.append(end)
            context += n
            if end >= until:
                break
        steps = len(ends)
        if steps < 2:
            return False
        stats = self.stats
        if self.accounting:
            contexts = sum(r.computed for r in running) + n + n * np.arange(steps, dtype=np.int64)
            memory = weights + contexts * per_context
            self._account_stretch(n, compute, memory, overhead + memory + compute, contexts)
            stats.observe_many(
                "inter_token_latency_seconds",
                np.array([ends[0] - (r.last_token or self.now) for r in running]),
            )
            stats.observe_many("inter_token_latency_seconds", np.diff(ends), n)
        # Every request decodes one token a step: blocks, counters, latencies.
        lacks = lacking(steps)
        kv.allocate(sum(lacks))
        for request, lack in zip(running, lacks, strict=True):
            request.blocks.extend([None] * lack)
            request.computed += steps
            request.generated += steps
            if request.computed // size > request.named:
                self._name_blocks(request, request.computed // size)
            request.last_token = end
        stats.generation_tokens += n * steps
        self.now = end
        self.fast_forwarded += steps
        self.admitted = []
        self.waiting_for_capacity = waiting_for_capacity
        for request in running:
            if request.sink is not None:
                request.sink(steps, False, end)
        return True

    def _account_stretch(
        self,
        n: int,
        compute: float,
        memory: np.ndarray,
        durations: np.ndarray,
        context: np.ndarray,
    ) -> None:
        """A fast-forwarded stretch's time and work sums, as its steps' _duration would add
        them (to float rounding)."""
        config, stats, model = self.config, self.stats, self.config.model
        steps = len(durations)
        stats.memory_seconds += float(memory.sum())
        stats.compute_seconds += compute * steps
        stats.busy_seconds += float(durations.sum())
        stats.observe("iteration_tokens_total", n, steps)
        tp = config.tensor_parallel_size
        attention = 4 * model.layers * model.attention_heads * model.head_dim
        stats.estimated_flops += float(
            ((2 * model.parameters * n + attention * context) / tp).sum()
        )
        stats.estimated_read_bytes += float(
            ((config.weight_bytes + context * config.kv_bytes_per_token) / tp).sum()
        )
        stats.estimated_write_bytes += n * config.kv_bytes_per_token / tp * steps

    def _admission_blocked(self, budget: int) -> int | None:
        """What step() would leave in waiting_for_capacity where no waiting request can be
        admitted with `budget` tokens left now, nor in any pure-decode step after (the
        budget stays, free blocks only shrink, a waiting request's cost only grows); None
        where one could be."""
        config = self.config
        if not self.waiting or budget <= 0 or len(self.running) >= config.max_num_seqs:
            return 0
        request = self.waiting[0]
        cached = self._cached_blocks(request)
        loaded = self._host_blocks(request, cached)
        wanted = request.num_tokens - (cached + loaded) * config.block_size
        if not config.enable_chunked_prefill and wanted > budget:
            return 0
        whole = -(-request.num_tokens // config.block_size)
        if self.kv.cost(request.hashes[:cached], whole - cached) > self.kv.free:
            return len(self.waiting)
        return None

    def _wanted(self, request: Request) -> int:
        # num_tokens_with_spec - num_computed_tokens: the drafts ride along a decode.
        if request.decoding:
            return 1 + self.config.num_speculative_tokens
        return request.num_tokens - request.computed

    def _grow(self, request: Request, tokens: int) -> bool:
        """Give `request` the blocks for `tokens` more tokens (vLLM's allocate_slots for a
        running request: new blocks only, no cache lookup); False if the cache is full.
        The blocks its computed tokens fill are named then (cache_blocks, up to num_tokens:
        drafts are not)."""
        after = request.computed + tokens
        size = self.config.block_size
        need = -(-after // size) - len(request.blocks)
        if need > 0:  # most steps a running request stays within its last block
            if need > self.kv.free:
                return False
            self.kv.allocate(need)
            request.blocks.extend([None] * need)
        full = min(after, request.num_tokens) // size
        if full > request.named:
            self._name_blocks(request, full)
        return True

    def _name_blocks(self, request: Request, full: int) -> None:
        if not self.config.enable_prefix_caching or full <= request.named:
            request.named = max(request.named, full)
            return
        self._extend_hashes(request, full)
        self.kv.name_blocks(request.blocks, request.hashes, request.named, full)
        request.named = full

    def _extend_hashes(self, request: Request, count: int) -> None:
        """Hashes of `request`'s first `count` full blocks: past its prompt they cover its
        output tokens, which the twin does not know; they are named by the request's serial
        (no two requests' outputs share a block; vLLM hashes the real tokens)."""
        size = self.config.block_size
        hashes = request.hashes
        while len(hashes) < count:
            index = len(hashes)
            start = index * size
            prompt_part = tuple(request.tokens[start : min(start + size, request.prompt_len)])
            previous = hashes[-1] if hashes else 0
            hashes.append(hash((previous, prompt_part, -1, request.serial, index)))

    def _preempt(self, request: Request) -> None:
        # _preempt_request: its blocks freed (tail first), num_computed_tokens = 0, and back
        # at the head of the waiting queue.
        self._release(request)
        self.running.remove(request)
        request.computed = 0
        request.preemptions += 1
        self.stats.preemptions += 1
        self.stats.preempted_prompt_tokens += request.prompt_len
        self.stats.preempted_output_tokens += request.generated
        self.waiting.appendleft(request)

    def _release(self, request: Request) -> None:
        self.kv.release_blocks(request.blocks)
        request.blocks = []
        request.named = 0

    def _admit(self, budget: int, work: list[tuple[Request, int]]) -> int:
        # The waiting requests, in order, while the budget and max_num_seqs allow: each with
        # its prefix-cache hit (get_computed_blocks), admitted only if its whole sequence
        # fits the free blocks (allocate_slots with scheduler_reserve_full_isl, on by
        # default), the first chunk of the rest scheduled now.
        config = self.config
        while self.waiting and budget > 0 and len(self.running) < config.max_num_seqs:
            request = self.waiting[0]
            first_time = request.first_scheduled is None
            cached = self._cached_blocks(request)
            loaded = self._host_blocks(request, cached)
            hit = request.hashes[:cached]
            computed = (cached + loaded) * config.block_size
            wanted = request.num_tokens - computed
            if not config.enable_chunked_prefill and wanted > budget:
                break
            tokens = min(wanted, budget)
            whole = -(-request.num_tokens // config.block_size)
            if self.kv.cost(hit, whole - cached) > self.kv.free:
                self.waiting_for_capacity = len(self.waiting)
                break
            self.kv.acquire(hit, 0)
            request.blocks = list(hit)
            request.named = cached
            request.computed = computed
            self._grow(request, tokens)  # fits: the whole sequence did
            self.waiting.popleft()
            self.running.append(request)
            work.append((request, tokens))
            budget -= tokens
            if loaded:
                self._load_from_host(request, cached, loaded)
            if first_time:
                request.host_cached = loaded * config.block_size
                self._count_first_schedule(request)
        return budget

    def _host_blocks(self, request: Request, cached: int) -> int:
        """Blocks past the device's cached prefix that the CPU offload tier holds."""
        if self.host is None:
            return 0
        limit = (request.num_tokens - 1) // self.config.block_size
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
        # At least one token is always computed, to sample from: a hit of at most
        # num_tokens - 1 tokens, in full blocks (those of a preempted request's output too).
        if not self.config.enable_prefix_caching:
            return 0
        limit = (request.num_tokens - 1) // self.config.block_size
        self._extend_hashes(request, limit)
        return self.kv.cached_prefix(request.hashes[:limit])

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
        if self.accounting:
            self._estimate(work)
        tokens = sum(count for _, count in work)
        context = sum(request.computed + count for request, count in work)
        memory = cost.weight_read_seconds + context * cost.context_token_seconds
        prefill_tokens = sum(count for request, count in work if not request.decoding)
        compute = (
            tokens * cost.token_seconds
            + prefill_tokens * cost.prefill_token_seconds
            + len(work) * cost.sequence_seconds
        )
        decoding = any(request.decoding for request, _ in work)
        draft = 0.0
        if decoding and config.num_speculative_tokens:
            draft = cost.draft_token_seconds * config.num_speculative_tokens
        duration = cost.overhead_seconds + memory + compute + draft
        # Blocks loaded from the CPU tier this step cross the host link first.
        duration += self._host_load_bytes / HOST_LINK_BYTES_PER_SECOND
        self._host_load_bytes = 0.0
        if self.accounting:
            stats = self.stats
            stats.memory_seconds += memory
            stats.compute_seconds += compute
            stats.prefill_compute_seconds += compute * prefill_tokens / max(tokens, 1)
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
            if request.decoding:
                emitted = 1 + self._accepted_drafts(request)
                request.computed += emitted
            else:
                request.computed += tokens
                if request.computed >= request.prompt_len and self.host is not None:
                    self._store_to_host(request)
                if request.computed < request.num_tokens:
                    continue  # a chunk of a longer prefill: nothing sampled yet
                emitted = 1
            emitted = min(emitted, request.max_tokens - request.generated)
            request.generated += emitted
            self.stats.generation_tokens += emitted
            if request.first_token is None:
                request.first_token = self.now
                self.stats.observe("time_to_first_token_seconds", self.now - request.arrival)
            else:
                # Since the request's last token: a step, or more where it waited (preempted).
                last = request.last_token if request.last_token is not None else self.now
                self.stats.observe("inter_token_latency_seconds", self.now - last)
            request.last_token = self.now
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
        self._finished += 1
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
