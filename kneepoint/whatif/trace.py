"""Agent-like traffic, recorded: sessions of turns whose prompts grow, replayed closed-loop.

An agent loop sends a prompt, waits for the whole answer, runs a tool (think time), and sends
the conversation so far plus the tool's result. So every session's prompts start with one
system prompt common to all sessions, and turn i+1's prompt is turn i's prompt + a stand-in
for turn i's answer (max_tokens tokens) + a tool result (fresh tokens): prefix reuse within a
session, and across sessions through the system prompt.

How a trace is run (the real client of bench/ and the twin's `simulate_trace` both follow
exactly this): load = the number of sessions running at once, closed loop. A client runs its
session's turns in order: send the turn's prompt with its max_tokens, wait for the whole
answer, wait the turn's think_seconds, then send the next turn; after a session's last turn
(and its think_seconds, 0 in traces agent_trace makes) the client starts the next unused
session, in the trace's order. The run ends when every session of the trace has been run
(no duration limit).

The recorded traffic is a JSON file (`AgentTrace.to_json`/`from_json`); prompts are stored
once each as the tokens they add to the previous turn's prompt, so a file is about as large
as the tokens the sessions add, not the tokens they send.
"""

from __future__ import annotations

import heapq
import json
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from kneepoint.twin.simulated_engine import EngineConfig, Request, StepCost
from kneepoint.whatif.sweep import TERMS, StepTerms, _Recorder, bounds

# Token ids are drawn below this unless agent_trace is told the model's vocabulary (vLLM's
# /v1/completions rejects an id the model does not have: the tests' tiny model has 512).
VOCABULARY = 150_000
FORMAT = "kneepoint-agent-trace"
VERSION = 1


@dataclass(frozen=True)
class Turn:
    """One request of a session: its whole prompt (token ids), the tokens it may generate,
    and the client's pause after its answer before the session's next turn."""

    prompt: tuple[int, ...]
    max_tokens: int
    think_seconds: float


# A session: its turns, in the order a client sends them.
Session = tuple[Turn, ...]


@dataclass(frozen=True)
class AgentTrace:
    """Sessions of turns, in the order clients take them up."""

    sessions: tuple[Session, ...]

    @property
    def requests(self) -> int:
        """The turns of every session: the requests a run of the trace sends."""
        return sum(len(session) for session in self.sessions)

    @property
    def max_tokens(self) -> int:
        """The tokens a run may generate (every turn's max_tokens)."""
        return sum(turn.max_tokens for session in self.sessions for turn in session)

    def with_think(self, seconds: float) -> AgentTrace:
        """The same prompts with every turn's think time `seconds` (a session's last turn's
        kept at 0): with 0, a closed-loop run's schedule no longer depends on the step times,
        which is what an exact calibration needs (kneepoint.whatif.calibrate_trace)."""
        return AgentTrace(
            tuple(
                tuple(
                    Turn(turn.prompt, turn.max_tokens, seconds if i < len(session) - 1 else 0.0)
                    for i, turn in enumerate(session)
                )
                for session in self.sessions
            )
        )

    def to_json(self) -> str:
        """The trace as JSON: the system prompt once (the prefix every session's first prompt
        shares), then per turn how many tokens of the previous prompt it keeps (`keep`, of the
        system prompt for a first turn) and the tokens it adds."""
        firsts = [session[0].prompt for session in self.sessions if session]
        common = _common_prefix(firsts) if firsts else ()
        sessions = []
        for session in self.sessions:
            base: Sequence[int] = common
            turns = []
            for turn in session:
                keep = len(_common_prefix([tuple(base), turn.prompt]))
                turns.append(
                    {
                        "keep": keep,
                        "add": list(turn.prompt[keep:]),
                        "max_tokens": turn.max_tokens,
                        "think_seconds": turn.think_seconds,
                    }
                )
                base = turn.prompt
            sessions.append(turns)
        return json.dumps(
            {"format": FORMAT, "version": VERSION, "system": list(common), "sessions": sessions},
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> AgentTrace:
        """The trace `to_json` wrote (ValueError for another file)."""
        data = json.loads(text)
        if data.get("format") != FORMAT or data.get("version") != VERSION:
            raise ValueError(f"not a {FORMAT} version {VERSION} file")
        common = tuple(int(t) for t in data["system"])
        sessions = []
        for turns in data["sessions"]:
            base = common
            session = []
            for item in turns:
                prompt = base[: int(item["keep"])] + tuple(int(t) for t in item["add"])
                session.append(Turn(prompt, int(item["max_tokens"]), float(item["think_seconds"])))
                base = prompt
            sessions.append(tuple(session))
        return cls(tuple(sessions))


def _common_prefix(prompts: Sequence[Sequence[int]]) -> tuple[int, ...]:
    first = prompts[0]
    length = min(len(p) for p in prompts)
    for i in range(length):
        token = first[i]
        if any(p[i] != token for p in prompts):
            return tuple(first[:i])
    return tuple(first[:length])


def agent_trace(
    seed: int,
    sessions: int,
    turns: int,
    system_tokens: int,
    tool_tokens: tuple[int, int],
    output_tokens: tuple[int, int],
    think_seconds: float,
    max_context: int,
    vocabulary: int = VOCABULARY,
) -> AgentTrace:
    """`sessions` sessions of at most `turns` turns, the same for the same arguments.

    Every prompt starts with one system prompt of `system_tokens` tokens; a first turn adds
    a user/tool message, every later turn its previous turn's answer stand-in (max_tokens
    tokens) and a tool result. Message lengths are drawn per turn uniformly in `tool_tokens`
    and max_tokens in `output_tokens` (both inclusive); tokens uniformly below `vocabulary`.
    Every turn waits `think_seconds` after its answer, a session's last turn 0. A session
    stops before a turn whose prompt + max_tokens would pass `max_context`; ValueError if even
    a first turn could (every session has a turn)."""
    if sessions < 1 or turns < 1:
        raise ValueError("a trace needs at least one session of one turn")
    if not (0 < tool_tokens[0] <= tool_tokens[1]) or not (0 < output_tokens[0] <= output_tokens[1]):
        raise ValueError("token ranges must be (low, high) with 0 < low <= high")
    if system_tokens + tool_tokens[1] + output_tokens[1] > max_context:
        raise ValueError("a first turn could pass max_context")
    if think_seconds < 0:
        raise ValueError("think_seconds must not be negative")
    rng = random.Random(seed)

    def fresh(count: int) -> tuple[int, ...]:
        return tuple(rng.randrange(vocabulary) for _ in range(count))

    system = fresh(system_tokens)
    made: list[Session] = []
    for _ in range(sessions):
        drafted: list[tuple[tuple[int, ...], int]] = []
        prompt = system
        for _turn in range(turns):
            prompt = prompt + fresh(rng.randint(*tool_tokens))
            max_tokens = rng.randint(*output_tokens)
            if len(prompt) + max_tokens > max_context:
                break
            drafted.append((prompt, max_tokens))
            prompt = prompt + fresh(max_tokens)  # the answer's stand-in
        made.append(
            tuple(
                Turn(p, m, think_seconds if i < len(drafted) - 1 else 0.0)
                for i, (p, m) in enumerate(drafted)
            )
        )
    return AgentTrace(tuple(made))


# ---------------------------------------------------------------------------------------
# The twin under a trace.


@dataclass(frozen=True)
class RequestRecord:
    """One turn as the twin ran it (seconds from the run's start)."""

    session: int  # the session's index in the trace
    turn: int
    engine: int  # which engine served it (session index modulo the engines)
    sent: float  # the client sent it; the engine has it from then on
    first_token: float  # the engine's step that made the first token ended
    finished: float  # …and the last
    ttft: float  # first_token - sent + the cost's request_overhead_seconds (TTFT only)
    output_tokens: int
    gaps: tuple[float, ...]  # between consecutive outputs (one per engine step that emitted)


@dataclass(frozen=True)
class TraceRun:
    """A closed-loop run of a trace by the twin: what a client would measure, what the
    engines' gauges and counters say, and, for calibration, each measured mean as terms ×
    cost plus a fixed part (`terms`, as sweep.StepTerms: exact for the schedule this run
    took, which with think times depends on the cost it ran with)."""

    load: int
    engines: int
    records: tuple[RequestRecord, ...]
    wall_seconds: float  # from the first send to the last answer's end
    generated_tokens: int
    waiting_mean: float  # requests waiting in the engines' queues (all engines), time-averaged
    preemptions: int
    prompt_tokens: int
    prefix_cache_hits: int  # prompt tokens found in the prefix cache
    terms: StepTerms

    @property
    def output_tokens_per_second(self) -> float:
        return self.generated_tokens / self.wall_seconds if self.wall_seconds > 0 else 0.0

    @property
    def ttfts(self) -> np.ndarray:
        return np.asarray([r.ttft for r in self.records])

    @property
    def itls(self) -> np.ndarray:
        """Every request's gaps between outputs, pooled."""
        return np.asarray([gap for r in self.records for gap in r.gaps])

    def ttft_quantile(self, q: float) -> float:
        """np.percentile's linear interpolation, q in [0, 1]."""
        return float(np.percentile(self.ttfts, 100 * q))

    def itl_quantile(self, q: float) -> float | None:
        """None when no request made two outputs."""
        itls = self.itls
        return float(np.percentile(itls, 100 * q)) if itls.size else None


class _Clocked(_Recorder):
    """An engine whose clock is also kept as a linear form over the cost's terms:
    form[:-1] · coefficients(cost) + form[-1] == now, for the schedule taken."""

    def __init__(self, config: EngineConfig, seed: int) -> None:
        super().__init__(config, seed=seed)
        self.form = np.zeros(len(TERMS) + 1)
        self.waiting_area = 0.0  # Σ requests waiting × step duration

    def _duration(self, work: list[tuple[Request, int]]) -> float:
        duration = super()._duration(work)
        self.form = self.form + np.append(self.rows[-1], 0.0)
        self.waiting_area += len(self.waiting) * duration
        return duration

    def _stall(self) -> float:
        duration = super()._stall()
        self.form = self.form.copy()
        self.form[-1] += duration
        self.waiting_area += len(self.waiting) * duration
        return duration


@dataclass
class _InFlight:
    """A turn from its send to its last output (the sink the engine calls)."""

    run: _Run
    session: int
    turn: int
    server: _Clocked
    sent: float
    sent_form: np.ndarray
    first: float | None = None
    last: float = 0.0
    last_form: np.ndarray | None = None
    tokens: int = 0

    def __post_init__(self) -> None:
        self.gaps: list[float] = []

    def __call__(self, count: int, done: bool, at: float) -> None:
        run, form = self.run, self.server.form
        self.tokens += count
        if self.first is None:
            self.first = at
            run.ttft_sum += form - self.sent_form + run.overhead_form
        else:
            assert self.last_form is not None
            self.gaps.append(at - self.last)
            run.gap_sum += form - self.last_form
            run.gap_count += 1
        self.last, self.last_form = at, form
        if done:
            run.finished(self, at, form)


class _Run:
    """A closed-loop run of a trace: clients, arrivals in time order, the engines."""

    def __init__(self, config: EngineConfig, trace: AgentTrace, engines: int, seed: int) -> None:
        self.trace = trace
        cost = config.step_cost or StepCost.of(config)
        self.overhead = cost.request_overhead_seconds
        self.overhead_form = np.zeros(len(TERMS) + 1)
        self.overhead_form[TERMS.index("request_overhead_seconds")] = 1.0
        self.servers = [
            _Clocked(config, seed if engines == 1 else seed * 1000 + e) for e in range(engines)
        ]
        # (sent at, send order, the turn in flight)
        self.arrivals: list[tuple[float, int, _InFlight]] = []
        self.records: list[RequestRecord] = []
        self.ttft_sum = np.zeros(len(TERMS) + 1)
        self.gap_sum = np.zeros(len(TERMS) + 1)
        self.gap_count = 0
        self.end = 0.0
        self.end_form = np.zeros(len(TERMS) + 1)
        self.sends = 0
        self.next_session = 0

    def send(self, session: int, turn: int, at: float, form: np.ndarray) -> None:
        server = self.servers[session % len(self.servers)]
        flight = _InFlight(self, session, turn, server, at, form)
        self.sends += 1
        heapq.heappush(self.arrivals, (at, self.sends, flight))

    def start_next(self, at: float, form: np.ndarray) -> None:
        if self.next_session < len(self.trace.sessions):
            self.next_session += 1
            self.send(self.next_session - 1, 0, at, form)

    def finished(self, flight: _InFlight, at: float, form: np.ndarray) -> None:
        assert flight.first is not None
        self.records.append(
            RequestRecord(
                session=flight.session,
                turn=flight.turn,
                engine=flight.session % len(self.servers),
                sent=flight.sent,
                first_token=flight.first,
                finished=at,
                ttft=flight.first - flight.sent + self.overhead,
                output_tokens=flight.tokens,
                gaps=tuple(flight.gaps),
            )
        )
        if at >= self.end:
            self.end, self.end_form = at, form
        session = self.trace.sessions[flight.session]
        think = session[flight.turn].think_seconds
        after = form.copy()
        after[-1] += think
        if flight.turn + 1 < len(session):
            self.send(flight.session, flight.turn + 1, at + think, after)
        else:
            self.start_next(at + think, after)

    def run(self, load: int) -> None:
        zero = np.zeros(len(TERMS) + 1)
        for _ in range(min(load, len(self.trace.sessions))):
            self.start_next(0.0, zero)
        servers, arrivals = self.servers, self.arrivals
        while True:
            soonest: _Clocked | None = None
            for server in servers:
                if not server.idle and (soonest is None or server.now < soonest.now):
                    soonest = server
            if arrivals and (soonest is None or arrivals[0][0] <= soonest.now):
                at, _, flight = heapq.heappop(arrivals)
                server = flight.server
                if server.idle and at > server.now:  # it waited for this request
                    server.now, server.form = at, flight.sent_form
                turn = self.trace.sessions[flight.session][flight.turn]
                server.add(turn.prompt, turn.max_tokens, flight)
            elif soonest is not None:
                soonest.step()
            else:
                return


def simulate_trace(
    config: EngineConfig, trace: AgentTrace, load: int, seed: int = 0, engines: int = 1
) -> TraceRun:
    """The twin (`config`, its step_cost the cost) runs `trace` closed-loop at `load`
    sessions at once, as the module's docstring says, in virtual time.

    With `engines` > 1 that many engines, each with its own KV cache, serve it; session i
    goes to engine i modulo `engines` (sticky: all its turns there). A request joins its
    engine's next step (one sent while a step runs waits for the step's end; one sent as a
    step ends joins the next); the cost's request_overhead_seconds is added to its TTFT
    only, as StepCost says, never to the engine's clock. Every turn generates its
    max_tokens (the real client must ask for exactly that: ignore_eos). `seed` seeds the
    speculative verifier's acceptances. ValueError for a turn longer than max_model_len or
    than the KV cache holds (less a block)."""
    if load < 1 or engines < 1:
        raise ValueError("load and engines must be at least 1")
    # The twin would keep a longer prompt's last tokens; vLLM refuses the request (past
    # max_model_len) or the configuration (a cache that cannot hold one sequence).
    cache = (config.num_gpu_blocks - 1) * config.block_size
    for session in trace.sessions:
        for turn in session:
            length = len(turn.prompt) + turn.max_tokens
            if length > config.max_model_len:
                raise ValueError(
                    f"a turn of {len(turn.prompt)} prompt + {turn.max_tokens} tokens passes "
                    f"max_model_len {config.max_model_len}"
                )
            if length > cache:
                raise ValueError(
                    f"a turn of {length} tokens does not fit a KV cache of "
                    f"{config.num_gpu_blocks} blocks of {config.block_size}"
                )
    run = _Run(config, trace, engines, seed)
    run.run(load)
    servers = run.servers
    count = len(run.records)
    wall = run.end
    stats = [server.stats for server in servers]
    ttft = run.ttft_sum / max(count, 1)
    itl = run.gap_sum / run.gap_count if run.gap_count else None
    terms = StepTerms(
        concurrency=load,
        requests=count,
        output_tokens=sum(s.generation_tokens for s in stats),
        wall=run.end_form[:-1],
        wall_fixed=float(run.end_form[-1]),
        ttft_mean=ttft[:-1],
        ttft_fixed=float(ttft[-1]),
        itl_mean=None if itl is None else itl[:-1],
        itl_fixed=0.0 if itl is None else float(itl[-1]),
        preemptions=sum(s.preemptions for s in stats),
        preempted_prompt_tokens=sum(s.preempted_prompt_tokens for s in stats),
        preempted_output_tokens=sum(s.preempted_output_tokens for s in stats),
    )
    records = sorted(run.records, key=lambda r: (r.session, r.turn))
    return TraceRun(
        load=load,
        engines=engines,
        records=tuple(records),
        wall_seconds=wall,
        generated_tokens=terms.output_tokens,
        waiting_mean=sum(s.waiting_area for s in servers) / wall if wall > 0 else 0.0,
        preemptions=terms.preemptions,
        prompt_tokens=sum(s.prompt_tokens for s in stats),
        prefix_cache_hits=sum(s.prefix_cache_hits for s in stats),
        terms=terms,
    )


@dataclass(frozen=True)
class TracePrediction:
    """A closed-loop run of a trace predicted at one load (seconds, tokens), with the
    throughput's and TTFT's bounds from the calibration's RMS relative error (± one RMS)."""

    load: int
    engines: int
    requests: int
    wall_seconds: float
    output_tokens_per_second: float
    output_tokens_per_second_bounds: tuple[float, float]
    ttft_mean: float
    ttft_mean_bounds: tuple[float, float]
    ttft_p50: float
    ttft_p95: float
    itl_mean: float | None  # None: no request made two outputs
    itl_p50: float | None
    itl_p95: float | None
    waiting_mean: float
    preemptions: int
    prefix_cache_hit_rate: float | None  # None: no prompt tokens

    @classmethod
    def of(
        cls, run: TraceRun, throughput_error: float | None, ttft_error: float | None
    ) -> TracePrediction:
        itls = run.itls
        ttft = float(run.ttfts.mean())
        throughput = run.output_tokens_per_second
        return cls(
            load=run.load,
            engines=run.engines,
            requests=len(run.records),
            wall_seconds=run.wall_seconds,
            output_tokens_per_second=throughput,
            output_tokens_per_second_bounds=bounds(throughput, throughput_error),
            ttft_mean=ttft,
            ttft_mean_bounds=bounds(ttft, ttft_error),
            ttft_p50=run.ttft_quantile(0.5),
            ttft_p95=run.ttft_quantile(0.95),
            itl_mean=float(itls.mean()) if itls.size else None,
            itl_p50=run.itl_quantile(0.5),
            itl_p95=run.itl_quantile(0.95),
            waiting_mean=run.waiting_mean,
            preemptions=run.preemptions,
            prefix_cache_hit_rate=(
                run.prefix_cache_hits / run.prompt_tokens if run.prompt_tokens else None
            ),
        )

    def as_dict(self) -> dict[str, object]:
        out = asdict(self)
        out["output_tokens_per_second_bounds"] = list(self.output_tokens_per_second_bounds)
        out["ttft_mean_bounds"] = list(self.ttft_mean_bounds)
        return out
