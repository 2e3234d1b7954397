"""Agent traces: made the same from the same seed, prompts that extend one another from a
shared system prompt, lengths in their ranges, and a JSON file that reads back the same."""

from __future__ import annotations

import itertools

import pytest

from kneepoint.whatif.trace import AgentTrace, agent_trace


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
