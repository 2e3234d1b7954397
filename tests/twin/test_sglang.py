"""The fleet twin's SGLang replica: its exposition is SGLang's (the families, types, HELP texts,
labels and buckets of each generation's fixture, which SGLang's own metrics code produced),
kneepoint's SGLang normalizer reads the twin's engine state back from it, its history is what
its live scrapes say, and its OpenAI endpoints answer as SGLang's."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from collectors.engines import parse_replica
from collectors.engines.sglang import parse_sglang
from kneepoint.config import Config
from kneepoint.samples import ReplicaSample
from kneepoint.twin import sglang
from kneepoint.twin.backfill import History, profile
from kneepoint.twin.dcgm import GpuState
from kneepoint.twin.fleet import Fleet, single_replica
from kneepoint.twin.openai_api import EOS_TOKEN_IDS, tokenize
from kneepoint.twin.profiles import gpu, model
from kneepoint.twin.simulated_engine import Engine, EngineConfig, Request

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
MODEL = "Qwen/Qwen3-8B"  # the fixtures' served model name

# Per twin generation: the fixture SGLang's code produced for it, the labels that fixture has
# only because of the configuration it shows (a plain server has neither), and families one
# side has because of what was fed, with why.
REAL = {
    "0.4.0": ("sglang-0.4.0", set(), {}),
    "0.4.6": ("sglang-0.4.6", set(), {}),
    "0.5.4": ("sglang-0.5.4-dp2", {"dp_rank"}, {}),  # DP attention with two ranks
    "0.5.10": ("sglang-0.5.10-tp2-all-schedulers", set(), {}),
    "0.5.16": (
        "sglang-0.5.16-spec",
        set(),
        {"sglang:queue_time_seconds": "that fixture's scheduler was fed no queue time"},
    ),
    "0.5.23": ("sglang-0.5.23-priority", {"priority"}, {}),  # priority scheduling
}
# Verbatim captures of real servers (excerpts): each complete family must be the twin's.
CAPTURES = {
    "sglang-0.4-docs-capture": "0.4.0",
    "sglang-0.4.4-pr-4444": "0.4.6",
    "sglang-0.5.1-issue-13485": "0.5.4",
}
# The generation kneepoint's normalizer names for each twin generation.
GENERATION = {
    "0.4.0": "0.4.0",
    "0.4.6": "0.4.6",
    "0.5.4": "0.5.0",
    "0.5.10": "0.5.10",
    "0.5.16": "0.5.16",
    "0.5.23": "0.5.23",
}


@dataclass
class Sent:
    """A request as its client saw it: when each of its tokens arrived."""

    request: Request
    stream: bool
    arrivals: list[tuple[int, float]] = field(default_factory=list)  # (tokens so far, time)

    def time_of(self, tokens: int) -> float:
        return next(at for count, at in self.arrivals if count >= tokens)


@dataclass
class Served:
    engine: Engine
    metrics: sglang.SglangMetrics
    sent: list[Sent] = field(default_factory=list)

    def send(self, prompt: list[int], max_tokens: int, stream: bool) -> Sent:
        request = self.engine.add(prompt, max_tokens)
        sent = Sent(request, stream)

        def sink(count: int, _done: bool, at: float) -> None:
            total = (sent.arrivals[-1][0] if sent.arrivals else 0) + count
            sent.arrivals.append((total, at))

        request.sink = self.metrics.track(request, sink, stream)
        self.sent.append(sent)
        return sent

    def run(self, until: int | None = None) -> None:
        """Step until idle (or until `until` requests run at once)."""
        while not self.engine.idle:
            if until is not None and len(self.engine.running) >= until:
                return
            self.engine.step()

    def scrape(self) -> str:
        return sglang.render(self.metrics, MODEL).decode()


def fresh(version: str, speculative: int = 0, max_num_seqs: int = 256) -> Served:
    # A Qwen3-4B on an L4 with a small KV cache: the first wave cannot all fit.
    config = EngineConfig(
        gpu("l4"),
        model("qwen3-4b"),
        gpu_memory_utilization=0.4,
        max_num_seqs=max_num_seqs,
        num_speculative_tokens=speculative,
        spec_acceptance_rate=0.7,
    )
    engine = Engine(config)
    return Served(engine, sglang.SglangMetrics(engine, version))


SYSTEM = tokenize("the system prompt says plan the next step and call a tool " * 16)


def serve(version: str, speculative: int = 0) -> Served:
    """48 requests sharing a system prompt, half of them streamed (more KV than the cache
    holds: some are retracted), then 4 that find the prefix cached."""
    served = fresh(version, speculative)
    for i in range(48):
        served.send(SYSTEM + tokenize(f"task {i} " * 30), 200, stream=i % 2 == 0)
    served.run()
    for i in range(4):
        served.send(SYSTEM + tokenize(f"again {i}"), 60, stream=i % 2 == 0)
    served.run()
    assert served.engine.stats.preemptions > 0 and served.engine.stats.prefix_cache_hits > 0
    return served


def families(text: str) -> dict[str, tuple[str, str, frozenset[str], frozenset[str]]]:
    """name -> (type, HELP, label names, bucket bounds) of an exposition."""
    out = {}
    for family in text_string_to_metric_families(text):
        names: set[str] = set()
        bounds: set[str] = set()
        for sample in family.samples:
            names |= set(sample.labels) - ({"le"} if family.type == "histogram" else set())
            if family.type == "histogram" and "le" in sample.labels:
                bounds.add(sample.labels["le"])
        if family.samples:
            out[family.name] = (
                family.type,
                family.documentation,
                frozenset(names),
                frozenset(bounds),
            )
    return out


def test_every_generation_the_twin_speaks_has_its_real_fixture() -> None:
    assert set(sglang.VERSIONS) == set(REAL) == set(GENERATION)
    assert max(sglang.VERSIONS, key=lambda v: tuple(map(int, v.split(".")))) == sglang.NEWEST


@pytest.mark.parametrize("version", list(REAL))
def test_names_types_labels_and_buckets_are_the_real_engines(version: str) -> None:
    stem, configured, explained = REAL[version]
    served = serve(version, speculative=3 if version == "0.5.16" else 0)
    twin = families(served.scrape())
    real = families((FIXTURES / f"{stem}.prom").read_text())
    assert set(twin) ^ set(real) == set(explained), sorted(set(twin) ^ set(real))
    for name in set(twin) & set(real):
        kind, help_text, labels, bounds = twin[name]
        real_kind, real_help, real_labels, real_bounds = real[name]
        assert (kind, help_text) == (real_kind, real_help), name
        assert labels == real_labels - configured, name
        assert bounds == real_bounds, name


@pytest.mark.parametrize("stem", list(CAPTURES))
def test_real_captures_have_the_twins_families(stem: str) -> None:
    version = CAPTURES[stem]
    twin = families(serve(version).scrape())
    real = families((FIXTURES / f"{stem}.prom").read_text())
    # An excerpt may end inside a family: only the complete ones (a type, a value) count.
    complete = {name: f for name, f in real.items() if f[0] != "unknown"}
    assert complete
    for name, (kind, help_text, labels, bounds) in complete.items():
        assert name in twin, name
        assert twin[name][:3] == (kind, help_text, labels), name
        if bounds:
            assert twin[name][3] == bounds, name


def test_the_normalizer_reads_the_engine_while_it_runs() -> None:
    served = fresh(sglang.NEWEST, max_num_seqs=16)
    for i in range(40):
        served.send(SYSTEM + tokenize(f"task {i} " * 20), 100, stream=True)
    served.run(until=16)
    engine = served.engine
    sample = parse_sglang(served.scrape())
    assert sample.engine == "sglang" and sample.model_names == [MODEL]
    assert sample.gauges["requests_running"] == len(engine.running) > 0
    assert sample.gauges["requests_waiting"] == len(engine.waiting) > 0
    assert sample.gauges["kv_cache_usage"] == pytest.approx(engine.kv.usage)
    assert sample.cache.capacity_tokens == engine.kv.usable * engine.config.block_size


@pytest.mark.parametrize("version", list(REAL))
def test_the_normalizer_reads_back_what_the_engine_served(version: str) -> None:
    served = serve(version)
    engine, stats = served.engine, served.engine.stats
    sample = parse_sglang(served.scrape())
    assert (sample.engine, sample.generation) == ("sglang", GENERATION[version])
    counters, histograms = sample.counters, sample.histograms
    # Every request finished: SGLang's per-request counts are the engine's.
    assert counters["prompt_tokens"] == stats.prompt_tokens
    assert counters["generation_tokens"] == stats.generation_tokens
    requests = len(served.sent)
    assert histograms["ttft"].count == histograms["e2e"].count == requests
    e2e = sum(s.arrivals[-1][1] - s.request.arrival for s in served.sent)
    assert histograms["e2e"].total == pytest.approx(e2e)
    if version == "0.4.0":  # no cached-token counter yet: the last prefill's own hit rate
        assert counters.get("prefix_cache_hits") is None
        last = served.sent[-1].request
        assert sample.gauges["prefix_cache_hit_rate_gauge"] == pytest.approx(
            last.cached / last.prompt_len
        )
    else:
        assert counters["prefix_cache_hits"] == stats.prefix_cache_hits
        assert counters["prefix_cache_queries"] == stats.prefix_cache_queries
    if version in ("0.5.10", "0.5.16", "0.5.23"):
        assert counters["preemptions"] == stats.preemptions
        assert sample.cache.capacity_tokens == engine.kv.usable * engine.config.block_size
        assert "preemptions" not in sample.unavailable
    else:
        assert counters.get("preemptions") is None and "preemptions" in sample.unavailable
        assert "kv_cache_capacity_tokens" in sample.unavailable
    if version != "0.4.0":  # 0.4.x's queue: one per admitted request (scheduler side)
        queue = histograms.get("queue")
        if queue is not None:
            assert queue.count == requests
        itl = histograms["itl"]
        # A streamed request's gaps are every token after its first; a non-streamed one's,
        # its tokens after its first output (its 50th, or its last).
        expected = sum(
            s.arrivals[-1][0] - (1 if s.stream else min(50, s.arrivals[-1][0])) for s in served.sent
        )
        assert itl.count == expected


@pytest.mark.parametrize("version", ["0.5.16", "0.5.23"])
def test_a_non_streamed_requests_ttft_is_its_first_output_until_0_5_23(version: str) -> None:
    served = fresh(version)
    quiet = served.send(SYSTEM, 120, stream=False)
    served.run()
    streamed = served.send(SYSTEM + tokenize("more"), 120, stream=True)
    served.run()
    ttft = parse_sglang(served.scrape()).histograms["ttft"].total
    quiet_first, streamed_first = (s.time_of(1) - s.request.arrival for s in (quiet, streamed))
    if version == "0.5.23":  # the scheduler's first-token time, streamed or not
        assert ttft == pytest.approx(quiet_first + streamed_first)
    else:  # before: when the tokenizer got its first output, the 50th token
        fiftieth = quiet.time_of(50) - quiet.request.arrival
        assert fiftieth > quiet_first
        assert ttft == pytest.approx(fiftieth + streamed_first)


def test_a_fresh_server_shows_only_what_sglang_creates_at_start() -> None:
    served = fresh(sglang.NEWEST)
    idle = parse_sglang(served.scrape())
    assert idle.gauges["requests_running"] == 0
    assert idle.cache.capacity_tokens == served.engine.kv.usable * served.engine.config.block_size
    # Tokenizer series and the retraction counter appear at their first observation.
    assert idle.counters["prompt_tokens"] is None and idle.counters["preemptions"] is None
    assert not idle.histograms
    served.send(SYSTEM, 20, stream=True)
    served.run()
    after = parse_sglang(served.scrape())
    assert after.counters["prompt_tokens"] == len(SYSTEM)
    assert after.histograms["ttft"].count == 1
    assert "is_streaming" in served.scrape() and 'is_streaming="false"' not in served.scrape()


def test_speculative_decoding_shows_in_sglangs_own_gauges() -> None:
    served = serve("0.5.16", speculative=3)
    sample = parse_sglang(served.scrape())
    length = sample.gauges["spec_decode_acceptance_length_gauge"]
    rate = sample.gauges["spec_decode_acceptance_rate_gauge"]
    assert length is not None and 1 < length <= 4
    assert rate is not None and 0 < rate <= 1
    assert length == pytest.approx(1 + 3 * rate)  # accepted drafts + the bonus token
    verify = [
        line for line in served.scrape().splitlines() if line.startswith("sglang:spec_verify")
    ]
    steps = sum(len(s.arrivals) - 1 for s in served.sent)
    assert verify and float(verify[0].rsplit(" ", 1)[1]) == steps


def backfilled(sample_version: str) -> tuple[ReplicaSample, ReplicaSample]:
    spec = single_replica("l4", "qwen3-4b", 0, 0, engine="sglang", sglang_version=sample_version)
    fleet = Fleet(spec)
    replica = fleet.replicas["qwen3-4b"]
    assert replica.sglang is not None
    levels = profile(replica.engine.config, sglang_version=sample_version)
    live = fleet.nodes["gpu-node"].gpus[0]
    history = History(
        replica.engine.config,
        replica.served_name,
        levels,
        GpuState(0, live.profile),
        template=parse_sglang(sglang.render(replica.sglang, replica.served_name).decode()),
    )
    sample = None
    for _ in range(8):
        sample, _gpu = history.advance(12.0, 15.0)
    assert sample is not None
    served = serve(sample_version)
    return sample, parse_sglang(sglang.render(served.metrics, replica.served_name).decode())


@pytest.mark.parametrize("version", [sglang.NEWEST, "0.5.4"])
def test_backfilled_history_has_what_live_scrapes_have(version: str) -> None:
    history, live = backfilled(version)
    assert (history.engine, history.generation) == (live.engine, live.generation)
    assert history.unavailable == live.unavailable
    assert set(history.gauges) == set(live.gauges)
    assert set(history.counters) == {k for k, v in live.counters.items() if v is not None}
    assert {k: h.bounds for k, h in history.histograms.items()} == {
        k: h.bounds for k, h in live.histograms.items()
    }
    assert history.counters["generation_tokens"] and history.histograms["ttft"].count


# --- over HTTP -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def twin() -> Iterator[str]:
    spec = single_replica("h100-80gb", "qwen3-4b", 0, 0, engine="sglang")
    fleet = Fleet(spec.model_copy(update={"speed": 20.0})).start()
    target = fleet.targets()[0]
    assert target.kind == "sglang"
    Config.model_validate({"database": "sqlite://", "targets": [target.model_dump()]})
    yield fleet.url("qwen3-4b")
    fleet.stop()


def events(url: str, body: dict) -> list[str]:
    with httpx.stream("POST", url, json=body, timeout=60) as response:
        assert response.status_code == 200
        return [line[6:] for line in response.iter_lines() if line.startswith("data: ")]


def test_its_api_answers_as_sglangs(twin: str) -> None:
    prompt = "the agent calls a tool and reads the result " * 10
    plain = httpx.post(f"{twin}/v1/completions", json={"prompt": prompt, "max_tokens": 8})
    body = plain.json()
    assert body["model"] == "default"  # no model named: SGLang's default name, no error
    named = httpx.post(
        f"{twin}/v1/completions", json={"model": "anything", "prompt": prompt, "max_tokens": 4}
    ).json()
    assert named["model"] == "anything"
    assert set(body["usage"]) == {
        "prompt_tokens",
        "total_tokens",
        "completion_tokens",
        "prompt_tokens_details",
        "reasoning_tokens",
        "completion_tokens_details",
    }
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["choices"][0]["matched_stop"] is None
    assert b'": ' not in plain.content  # compact JSON, as ORJSONResponse writes it
    # Without ignore_eos the "model" stops by itself: SGLang names the token that stopped it.
    natural = httpx.post(
        f"{twin}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2000},
        timeout=60,
    ).json()
    choice = natural["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["matched_stop"] == EOS_TOKEN_IDS["Qwen/Qwen3-4B"]
    assert choice["message"]["reasoning_content"] is None

    chunks = [
        json.loads(e)
        for e in events(
            f"{twin}/v1/completions",
            {
                "prompt": prompt,
                "max_tokens": 5,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
        if e != "[DONE]"
    ]
    *tokens, usage = chunks
    assert all(c["usage"] is None and len(c["choices"]) == 1 for c in tokens)
    assert [c["choices"][0]["finish_reason"] for c in tokens][-1] == "length"
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 5
    assert "prompt_tokens_details" not in usage["usage"]  # that chunk drops its nulls

    chat = [
        json.loads(e)
        for e in events(
            f"{twin}/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": 3,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
        if e != "[DONE]"
    ]
    deltas = [c["choices"][0]["delta"] for c in chat if c["choices"]]
    assert deltas[0] == {"reasoning_content": None, "role": "assistant", "content": ""}
    assert deltas[-1] == {"reasoning_content": None}  # the finish chunk: no token
    assert [c["choices"][0]["finish_reason"] for c in chat if c["choices"]][-1] == "length"
    assert len([d for d in deltas if d.get("content")]) == 3
    assert chat[-1]["usage"]["completion_tokens"] == 3

    too_long = httpx.post(f"{twin}/v1/completions", json={"prompt": "x " * 40000})
    assert too_long.status_code == 400
    error = too_long.json()
    assert error["object"] == "error" and error["code"] == 400
    assert "longer than the model's context length" in error["message"]
    assert httpx.get(f"{twin}/v1/nothing").json() == {"detail": "Not Found"}
    card = httpx.get(f"{twin}/v1/models").json()["data"][0]
    assert card["owned_by"] == "sglang" and card["id"] == "Qwen/Qwen3-4B"


def test_its_metrics_count_what_its_clients_were_told(twin: str) -> None:
    before = parse_replica("auto", httpx.get(f"{twin}/metrics").text)
    told = {"prompt_tokens": 0, "completion_tokens": 0}
    for i in range(6):
        response = httpx.post(
            f"{twin}/v1/completions",
            json={"prompt": f"request {i} plans the next step", "max_tokens": 20 + i},
            timeout=60,
        ).json()
        for key in told:
            told[key] += response["usage"][key]
    # The engine step that finished a request counted it before its tokens went out.
    after = parse_replica("auto", httpx.get(f"{twin}/metrics").text)
    assert after.engine == "sglang" and after.generation == GENERATION[sglang.NEWEST]
    assert after.histograms["e2e"].count - _count(before) == 6
    assert _delta(after, before, "prompt_tokens") == told["prompt_tokens"]
    assert _delta(after, before, "generation_tokens") == told["completion_tokens"]


def _count(sample: ReplicaSample) -> float:
    e2e = sample.histograms.get("e2e")
    return e2e.count if e2e else 0.0


def _delta(after: ReplicaSample, before: ReplicaSample, name: str) -> float:
    return (after.counters[name] or 0.0) - (before.counters.get(name) or 0.0)


def test_the_catalog_is_what_its_generator_writes() -> None:
    """The catalog's families carry SGLang's counters' `_total` and histograms' bounds."""
    for version, catalog in sglang.FAMILIES.items():
        for family in catalog:
            assert family.name.startswith("sglang:"), (version, family.name)
            assert (family.type == "histogram") == (family.bounds is not None)
            if family.type == "counter":
                assert family.name.endswith("_total"), family.name
            if family.bounds:
                bounds = sglang.BOUNDS[family.bounds]
                assert list(bounds) == sorted(bounds) and math.inf not in bounds
