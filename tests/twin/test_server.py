"""A twin replica and GPU node over real HTTP: the OpenAI API vLLM serves, /metrics, /health."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from collectors.dcgm import parse_dcgm
from collectors.engines.vllm import parse_vllm
from kneepoint.twin.fleet import Fleet, single_replica

MODEL = "Qwen/Qwen3-4B"


@pytest.fixture(scope="module")
def twin() -> Iterator[Fleet]:
    fleet = Fleet(single_replica("rtx4000ada", "qwen3-4b", 0, 0)).start()
    yield fleet
    fleet.stop()


@pytest.fixture
def url(twin: Fleet) -> str:
    return twin.url("qwen3-4b")


def test_health_and_models(url: str) -> None:
    assert httpx.get(f"{url}/health").status_code == 200
    [entry] = httpx.get(f"{url}/v1/models").json()["data"]
    assert entry["id"] == MODEL and entry["object"] == "model"


def test_a_completion_reports_usage(url: str) -> None:
    body = httpx.post(
        f"{url}/v1/completions",
        timeout=30,
        json={
            "model": MODEL,
            "prompt": list(range(100)),
            "max_tokens": 20,
            "ignore_eos": True,
        },
    ).json()
    assert body["object"] == "text_completion"
    assert body["usage"] == {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["choices"][0]["text"]


def test_without_ignore_eos_the_model_may_stop_early(url: str) -> None:
    body = httpx.post(
        f"{url}/v1/completions",
        timeout=60,
        json={"model": MODEL, "prompt": "the agent reads a file", "max_tokens": 1000},
    ).json()
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] < 1000


def test_chat_streams_server_sent_events_with_usage(url: str) -> None:
    events = []
    with httpx.stream(
        "POST",
        f"{url}/v1/chat/completions",
        timeout=30,
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "plan the next step"}],
            "max_tokens": 12,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ) as response:
        assert response.headers["content-type"] == "text/event-stream"
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert len(content.split()) == 12
    assert chunks[-1]["usage"]["completion_tokens"] == 12
    finished = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finished[-1] == "length"


def test_bad_requests_get_openai_errors(url: str) -> None:
    cases = [
        {"model": "other", "prompt": "x"},
        {"model": MODEL, "prompt": ""},
        {"model": MODEL, "prompt": "x", "max_tokens": 0},
        {"model": MODEL, "prompt": list(range(40_000)), "max_tokens": 10},
    ]
    for payload in cases:
        response = httpx.post(f"{url}/v1/completions", json=payload, timeout=10)
        assert response.status_code == 400, payload
        assert response.json()["error"]["message"]
    broken = httpx.post(f"{url}/v1/chat/completions", content=b"{not json", timeout=10)
    assert broken.status_code == 400
    assert httpx.get(f"{url}/nowhere").status_code == 404


def test_metrics_count_the_work_that_was_served(url: str, twin: Fleet) -> None:
    before = parse_vllm(httpx.get(f"{url}/metrics").text)
    httpx.post(
        f"{url}/v1/completions",
        timeout=30,
        json={"model": MODEL, "prompt": list(range(64)), "max_tokens": 10, "ignore_eos": True},
    )
    after = parse_vllm(httpx.get(f"{url}/metrics").text)
    assert (after.counters["generation_tokens"] or 0) - (
        before.counters["generation_tokens"] or 0
    ) == 10
    assert (after.counters["prompt_tokens"] or 0) - (before.counters["prompt_tokens"] or 0) == 64
    [gpu] = parse_dcgm(httpx.get(f"{twin.url('gpu-node')}/metrics").text, default_host="x")
    assert gpu.model == "NVIDIA RTX 4000 Ada Generation" and gpu.host == "gpu-node"


@pytest.mark.parametrize(
    ("version", "generation"), [("0.5", "v0"), ("0.8", "v1-0.8"), ("0.10", "v1-0.10")]
)
def test_older_generations_are_served_too(version: str, generation: str) -> None:
    fleet = Fleet(single_replica("l4", "qwen3-4b", 0, 0, vllm_version=version)).start()
    try:
        assert parse_vllm(httpx.get(f"{fleet.url('qwen3-4b')}/metrics").text).generation == (
            generation
        )
    finally:
        fleet.stop()
