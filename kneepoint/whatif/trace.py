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

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass

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
