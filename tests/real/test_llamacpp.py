"""kneepoint against llama.cpp's real server (llama-server b11434, CPU build, tiny GGUF model
written at test time): what kneepoint stores and reports over a window equals what the
server's own counters say over the same window, for a target of kind `llamacpp` and of kind
`auto`; and `kneepoint sweep` runs a knee sweep against its OpenAI-compatible endpoint, each
step held against the server's counters."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from collectors.collect import collect_once
from collectors.engines import parse_replica
from collectors.engines.llamacpp import NO_KV
from kneepoint.config import Config, Target
from kneepoint.knee.sweep import SweepSettings, one_request
from kneepoint.status import build_status
from kneepoint.store import queries
from kneepoint.store.db import open_store
from tests.conftest import migrated
from tests.real.llamacpp_server import LlamaCpp, running_llamacpp

pytestmark = [pytest.mark.real, pytest.mark.timeout(600)]

SYSTEM = " ".join(["system prompt you are an agent with tools search read write plan"] * 8)
P = "llamacpp:"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaCpp]:
    with running_llamacpp(tmp_path_factory.mktemp("llamacpp")) as running:
        yield running


def server_counters(url: str) -> dict[str, float]:
    """The server's own numbers, read straight from its /metrics with prometheus_client."""
    values: dict[str, float] = {}
    text = httpx.get(f"{url}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


async def agent_sessions(url: str, sessions: int, steps: int) -> dict[str, int]:
    """Agent-like traffic: each session re-sends its growing transcript after a shared system
    prompt (llama.cpp reuses a slot's cached prefix). Totals of the responses' usage."""
    totals = dict.fromkeys(("requests", "prompt", "cached", "completion"), 0)

    async def session(client: httpx.AsyncClient, number: int) -> None:
        transcript = f"{SYSTEM} user {number} plan the file search"
        for step in range(steps):
            response = await client.post(
                f"{url}/v1/completions",
                json={
                    "model": "tiny",
                    "prompt": transcript,
                    "max_tokens": 12,
                    "ignore_eos": True,
                    "temperature": 0,
                },
            )
            assert response.status_code == 200, f"{url}: {response.text[:500]}"
            usage = response.json()["usage"]
            totals["requests"] += 1
            totals["prompt"] += usage["prompt_tokens"]
            totals["cached"] += usage["prompt_tokens_details"]["cached_tokens"]
            totals["completion"] += usage["completion_tokens"]
            transcript += f" assistant call tool {step} tool result {step} read the file"

    async with httpx.AsyncClient(timeout=120) as client:
        await asyncio.gather(*(session(client, n) for n in range(sessions)))
    return totals


@pytest.mark.parametrize("kind", ["llamacpp", "auto"])
def test_kneepoint_reports_what_llamacpp_counted_over_the_window(
    server: LlamaCpp, kind: str, tmp_path: Path
) -> None:
    config = Config(
        database=f"sqlite:///{tmp_path / 'k.db'}",
        targets=[Target(name="real-llamacpp", kind=kind, url=f"{server.url}/metrics")],
    )
    config_file = tmp_path / "kneepoint.yaml"
    config_file.write_text(f"database: sqlite:///{tmp_path / 'k.db'}\n")
    migrated(config_file)
    sessions = open_store(config.database)
    before = server_counters(server.url)
    [first] = collect_once(config, sessions, clock=lambda: 1000.0)
    assert first.ok, first.error

    usage = asyncio.run(agent_sessions(server.url, server.slots, 3))
    after = server_counters(server.url)  # every response is in: the slots released
    [second] = collect_once(config, sessions, clock=lambda: 1060.0)
    assert second.ok, second.error
    # Nothing ran between the collector's scrape and this read.
    assert (
        server_counters(server.url)[P + "tokens_predicted_total"]
        == (after[P + "tokens_predicted_total"])
    )

    def delta(name: str) -> float:
        return after[P + name] - before[P + name]

    with sessions() as session:
        status = build_status(session, config, now=1060.0, window=120.0)
        frame = queries.replica_frame(session, 0, 2000)
    replica = status["replicas"][0]
    assert replica["up"] is True, replica["last_error"]
    assert (replica["engine"], replica["engine_generation"]) == ("llamacpp", "cached-tokens")
    assert (replica["engines"], replica["model_names"]) == (1, [])

    # Generated tokens: kneepoint's rate over the 60 s between its scrapes, times 60, is the
    # server's own increase, which is what the responses' usage said.
    generated = replica["generation_tokens_per_second"] * 60
    assert generated == pytest.approx(delta("tokens_predicted_total")), "generation tokens"
    assert generated == pytest.approx(usage["completion"]), "generation tokens vs. usage"
    # Prompt tokens: llama.cpp's prompt_tokens_total leaves out the cached ones; all prompt
    # tokens are it plus prompt_tokens_cached_total, which is what the usage said.
    computed, cached = delta("prompt_tokens_total"), delta("prompt_tokens_cached_total")
    assert cached == usage["cached"] > 0, "agent steps re-send their prefix: some must be reused"
    prompt = replica["prompt_tokens_per_second"] * 60
    assert prompt == pytest.approx(computed + cached), "prompt tokens"
    assert prompt == pytest.approx(usage["prompt"]), "prompt tokens vs. usage"
    assert prompt > computed, "prompt_tokens_total alone is not all prompt tokens"
    numeric = frame.select_dtypes("number")
    stored = numeric.iloc[-1] - numeric.iloc[0]
    assert stored["prompt_tokens_local_compute"] == computed
    assert stored["prompt_tokens_local_cache_hit"] == cached
    assert stored["prefix_cache_hits"] == cached
    assert stored["prefix_cache_queries"] == computed + cached
    assert replica["prefix_cache_hit_rate"] == pytest.approx(cached / (computed + cached))
    # The work went through llama_decode(): at least one call per generated token per slot.
    assert delta("n_decode_total") * server.slots >= generated > 0

    # Running and waiting are the server's own gauges; idle now.
    assert replica["requests_running"] == after[P + "requests_processing"] == 0
    assert replica["requests_waiting"] == after[P + "requests_deferred"] == 0
    # What llama.cpp does not expose is null with its reason, never a zero.
    assert replica["kv_cache_occupancy"] is None
    assert replica["unavailable"]["kv_cache_occupancy"] == NO_KV
    assert "since its KV gauges were removed" in NO_KV
    for quantity, key in (
        ("ttft", "ttft_seconds"),
        ("itl", "itl_seconds"),
        ("e2e", "e2e_seconds"),
        ("preemptions", "preemptions"),
        ("kv_cache_capacity_tokens", "kv_cache_capacity_tokens"),
    ):
        assert replica[key] is None, key
        assert replica["unavailable"][quantity].startswith("not exposed by llama.cpp"), quantity
    assert not [name for name in after if name.startswith(P + "kv_cache")]


def test_the_throughput_gauges_reset_on_every_read_and_kneepoint_does_not_use_them(
    server: LlamaCpp,
) -> None:
    """Why kneepoint derives rates from counters: each read of /metrics starts a new window
    for llama.cpp's throughput gauges, so a second scraper (or a second read) sees zero."""
    asyncio.run(agent_sessions(server.url, 1, 1))
    first = server_counters(server.url)
    second = server_counters(server.url)
    assert first[P + "predicted_tokens_seconds"] > 0
    assert second[P + "predicted_tokens_seconds"] == 0
    assert second[P + "tokens_predicted_total"] == first[P + "tokens_predicted_total"]
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    sample = parse_replica("llamacpp", text)
    assert sample.counters["generation_tokens"] == second[P + "tokens_predicted_total"]
    assert not [v for v in sample.gauges.values() if v == first[P + "predicted_tokens_seconds"]]


def test_the_sweep_client_reads_llamacpps_stream(server: LlamaCpp) -> None:
    """One token per chunk (the tiny model's tokens are whole words), the closing chunk with
    the usage and an empty choice is no token, and a request on the connection the server
    closed after the previous stream is sent again, not failed."""
    output = 16
    settings = SweepSettings(url=server.url, model="tiny", output_tokens=output)

    async def three() -> list:  # type: ignore[type-arg]
        connector = aiohttp.TCPConnector(limit=1)  # one pooled connection: always reused
        async with aiohttp.ClientSession(connector=connector) as http:
            return [await one_request(http, settings, "the agent reads the file") for _ in "abc"]

    for outcome in asyncio.run(three()):
        assert outcome.error is None, outcome.error
        assert outcome.output_tokens == output
        assert outcome.ttft is not None
        assert len(outcome.gaps) == output - 1, "one gap between each two tokens, none more"
        assert outcome.prompt_tokens > 0


def test_kneepoint_sweep_runs_a_knee_sweep_against_llamacpp(
    server: LlamaCpp, tmp_path: Path
) -> None:
    """`kneepoint sweep` as a user runs it, against llama.cpp's /v1/completions streaming:
    every step's tokens and prompt tokens are the server's own increase over the step."""
    config = tmp_path / "kneepoint.yaml"
    config.write_text(f"database: sqlite:///{tmp_path / 'k.db'}\n")
    migrated(config)
    ladder = (1, 2, server.slots)
    output, words = 128, 48
    before = server_counters(server.url)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "kneepoint.cli",
            "sweep",
            "--url",
            server.url,
            "--model",
            "tiny",
            "--concurrency",
            ",".join(map(str, ladder)),
            "--input-tokens",
            str(words),
            "--output-tokens",
            str(output),
            "--duration",
            "2s",
            "--capture-metrics",
            "--label",
            "llamacpp-sweep",
            "--json",
            "--config",
            str(config),
        ],
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert done.returncode == 0, f"kneepoint sweep failed: {done.stderr[-2000:]}"
    after = server_counters(server.url)
    result = json.loads(done.stdout)
    points = result["points"]
    assert [p["concurrency"] for p in points] == list(ladder)
    for point in points:
        assert point["errors"] == 0, point["first_error"]
        # Every request got exactly `output` tokens (ignore_eos), one stream chunk each.
        tokens = point["output_tokens_per_second"] * point["duration_seconds"]
        assert tokens == pytest.approx(point["completed"] * output)
        assert point["itl_mean_seconds"] is not None and point["ttft_mean_seconds"] is not None
        # The server's own account of the step (its /metrics before and after it): all prompt
        # tokens (computed + reused) are the prompts' usage; nothing is invented for what
        # llama.cpp does not expose.
        server_seen = point["server"]
        assert server_seen["prefix_cache_queries"] == pytest.approx(
            point["completed"] * point["input_tokens_mean"]
        )
        assert server_seen["kv_cache_occupancy_peak"] is None
        assert server_seen["preemptions"] is None
        assert 0 <= server_seen["requests_running_peak"] <= point["concurrency"]
    # The capture read llama.cpp's own gauges while the steps ran (each 2 s, read every 1 s).
    assert max(p["server"]["requests_running_peak"] for p in points) >= 1
    # Over the whole sweep: tokens and prompt tokens equal the server's own increase.
    generated = after[P + "tokens_predicted_total"] - before[P + "tokens_predicted_total"]
    assert generated == sum(p["completed"] for p in points) * output
    prompt = sum(
        after[P + name] - before[P + name]
        for name in ("prompt_tokens_total", "prompt_tokens_cached_total")
    )
    assert prompt == pytest.approx(sum(p["completed"] * p["input_tokens_mean"] for p in points))
    # Random word order: the sweep's prompts share nothing past their first token or so.
    assert after[P + "prompt_tokens_cached_total"] - before[P + "prompt_tokens_cached_total"] <= (
        sum(p["completed"] for p in points) * 2
    )
    assert "knee_concurrency" in result and "recommended_concurrency" in result
    # The run was stored: `kneepoint knee` reads it back.
    knee = ["knee", "--run", "llamacpp-sweep", "--json", "--config", str(config)]
    stored = subprocess.run(
        [sys.executable, "-m", "kneepoint.cli", *knee],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert stored.returncode == 0, stored.stderr[-2000:]
    assert "llamacpp-sweep" in stored.stdout
