"""Agent traces: made the same from the same seed, prompts that extend one another from a
shared system prompt, lengths in their ranges, and a JSON file that reads back the same; and
the twin running one closed-loop (simulate_trace)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from kneepoint.twin.simulated_engine import EngineConfig, StepCost
from kneepoint.whatif import EngineShape
from kneepoint.whatif.sweep import coefficients, simulate_step
from kneepoint.whatif.trace import AgentTrace, agent_trace, simulate_trace


def make(seed: int, max_context: int = 400, vocabulary: int = 150_000) -> AgentTrace:
    """6 sessions of up to 5 turns: a 40-token system prompt, tool results of 8-30 tokens,
    answers of 4-20, half a second's thought."""
    return agent_trace(
        seed,
        sessions=6,
        turns=5,
        system_tokens=40,
        tool_tokens=(8, 30),
        output_tokens=(4, 20),
        think_seconds=0.5,
        max_context=max_context,
        vocabulary=vocabulary,
    )


def test_the_same_seed_makes_the_same_trace_and_another_seed_another() -> None:
    assert make(3) == make(3)
    assert make(3) != make(4)


def test_prompts_extend_the_previous_turn_and_share_the_system_prompt() -> None:
    trace = make(1)
    system = trace.sessions[0][0].prompt[:40]
    firsts = {session[0].prompt[40:] for session in trace.sessions}
    assert len(firsts) == len(trace.sessions)  # each session's first message is its own
    for session in trace.sessions:
        assert session
        assert session[0].prompt[:40] == system
        assert 8 <= len(session[0].prompt) - 40 <= 30
        for before, after in itertools.pairwise(session):
            assert after.prompt[: len(before.prompt)] == before.prompt
            added = len(after.prompt) - len(before.prompt) - before.max_tokens
            assert 8 <= added <= 30  # the tool result, after the answer's stand-in


def test_lengths_think_times_and_context_stay_in_range() -> None:
    trace = make(2)
    assert len(trace.sessions) == 6
    turns = [turn for session in trace.sessions for turn in session]
    assert trace.requests == len(turns)
    assert trace.max_tokens == sum(turn.max_tokens for turn in turns)
    assert all(4 <= turn.max_tokens <= 20 for turn in turns)
    assert all(len(turn.prompt) + turn.max_tokens <= 400 for turn in turns)
    assert all(0 <= token < 150_000 for turn in turns for token in turn.prompt)
    for session in trace.sessions:
        assert len(session) <= 5
        assert [turn.think_seconds for turn in session] == [0.5] * (len(session) - 1) + [0.0]
    # max_context cuts sessions short: 5 turns cannot fit in 120 tokens
    short = make(2, max_context=120)
    assert all(1 <= len(session) < 5 for session in short.sessions)


def test_a_small_vocabulary_bounds_the_token_ids() -> None:
    trace = make(5, vocabulary=512)
    tokens = {token for session in trace.sessions for turn in session for token in turn.prompt}
    assert max(tokens) < 512
    assert len(tokens) > 100


def test_json_reads_back_the_same_trace_and_stores_each_token_once() -> None:
    trace = make(7)
    text = trace.to_json()
    assert AgentTrace.from_json(text) == trace
    sent = sum(len(turn.prompt) for session in trace.sessions for turn in session)
    assert text.count(",") < sent  # prompts are stored as what they add, not repeated
    with pytest.raises(ValueError):
        AgentTrace.from_json('{"format": "other"}')


def test_a_first_turn_that_cannot_fit_is_refused() -> None:
    with pytest.raises(ValueError):
        make(1, max_context=60)


# --- The twin under a trace -------------------------------------------------------------

COST = StepCost(
    overhead_seconds=0.004,
    token_seconds=0.0008,
    context_token_seconds=2e-6,
    request_overhead_seconds=0.003,
)


def engine(blocks: int = 120, max_num_seqs: int = 8, caching: bool = True) -> EngineConfig:
    """An engine with no GPU or model profile: blocks and step cost given outright."""
    shape = EngineShape(
        num_gpu_blocks=blocks,
        block_size=16,
        max_num_seqs=max_num_seqs,
        max_model_len=1024,
        enable_prefix_caching=caching,
    )
    return shape.engine_config(COST)


def agents(think: float = 0.05) -> AgentTrace:
    return agent_trace(
        1,
        sessions=12,
        turns=4,
        system_tokens=64,
        tool_tokens=(16, 48),
        output_tokens=(8, 24),
        think_seconds=think,
        max_context=1024,
    )


def test_a_run_sends_every_turn_in_order_after_the_last_answer_and_its_think_time() -> None:
    trace = agents(think=0.05)
    run = simulate_trace(engine(), trace, load=1)
    assert len(run.records) == trace.requests
    assert run.generated_tokens == trace.max_tokens
    assert sum(r.output_tokens for r in run.records) == trace.max_tokens
    # One session at a time: each turn goes out as the last answer ends plus its think time.
    ordered = sorted(run.records, key=lambda r: r.sent)
    assert [(r.session, r.turn) for r in ordered] == [
        (s, t) for s, session in enumerate(trace.sessions) for t in range(len(session))
    ]
    for before, after in itertools.pairwise(ordered):
        think = trace.sessions[before.session][before.turn].think_seconds
        assert after.sent == pytest.approx(before.finished + think)
        assert before.sent < before.first_token <= before.finished
    assert run.wall_seconds == pytest.approx(ordered[-1].finished)
    for record in run.records:
        assert record.ttft == pytest.approx(
            record.first_token - record.sent + COST.request_overhead_seconds
        )
        assert len(record.gaps) == record.output_tokens - 1  # one token per step, no drafter
    assert run.waiting_mean == 0.0  # nobody waits with one request at a time
    # Later turns find their session's earlier prompt (and the system prompt) cached.
    assert run.prefix_cache_hits > 0
    assert simulate_trace(engine(caching=False), trace, 1).prefix_cache_hits == 0


def test_each_measured_mean_is_its_terms_times_the_cost_on_the_schedule_taken() -> None:
    theta = coefficients(COST)
    for load, engines in ((1, 1), (4, 1), (8, 1), (8, 2)):
        run = simulate_trace(engine(), agents(), load, engines=engines)
        terms = run.terms
        assert float(terms.wall @ theta) + terms.wall_fixed == pytest.approx(run.wall_seconds)
        assert terms.ttft(theta) == pytest.approx(float(run.ttfts.mean()))
        assert terms.itl(theta) == pytest.approx(float(run.itls.mean()))
        assert terms.output_tokens == run.generated_tokens


def test_without_think_time_one_turn_sessions_are_a_closed_loop_sweep() -> None:
    """Sessions of one turn of fixed lengths, no shared prompt, no think time: the trace is
    `kneepoint sweep`'s closed loop, which sweep.simulate_step already models."""
    trace = agent_trace(
        3,
        sessions=24,
        turns=1,
        system_tokens=0,
        tool_tokens=(96, 96),
        output_tokens=(20, 20),
        think_seconds=0.0,
        max_context=1024,
    )
    config = engine(blocks=40)
    theta = coefficients(COST)
    for load in (1, 6, 12):
        run = simulate_trace(config, trace, load)
        step = simulate_step(config, load, 24, 96, 20)
        assert run.wall_seconds == pytest.approx(float(step.wall @ theta) + step.wall_fixed)
        assert float(run.ttfts.mean()) == pytest.approx(step.ttft(theta))
        assert float(run.itls.mean()) == pytest.approx(step.itl(theta))
        assert run.preemptions == step.preemptions
    assert simulate_trace(config, trace, 12).preemptions > 0  # the check covered preemption


def test_a_queue_waits_when_sessions_outnumber_the_seats() -> None:
    trace = agents(think=0.0)
    seated = simulate_trace(engine(blocks=400, max_num_seqs=8), trace, 8)
    crowded = simulate_trace(engine(blocks=400, max_num_seqs=2), trace, 8)
    assert seated.waiting_mean == 0.0
    assert 0 < crowded.waiting_mean <= 6  # at most the sessions without a seat
    assert crowded.ttft_quantile(0.95) > seated.ttft_quantile(0.95)


def test_replicas_keep_each_session_on_one_engine_and_share_the_load() -> None:
    trace = agents()
    config = engine(blocks=60)
    one = simulate_trace(config, trace, 12)
    two = simulate_trace(config, trace, 12, engines=2)
    assert {(r.session % 2, r.engine) for r in two.records} == {(0, 0), (1, 1)}
    assert len(two.records) == trace.requests
    served = [sum(1 for r in two.records if r.engine == e) for e in (0, 1)]
    assert served == [sum(len(s) for s in trace.sessions[e::2]) for e in (0, 1)]
    assert two.output_tokens_per_second > one.output_tokens_per_second


def test_a_turn_longer_than_the_model_or_the_cache_is_refused() -> None:
    with pytest.raises(ValueError, match="max_model_len"):
        simulate_trace(dataclasses.replace(engine(), max_model_len=100), agents(), 1)
    with pytest.raises(ValueError, match="KV cache"):
        simulate_trace(engine(blocks=12), agents(), 1)
