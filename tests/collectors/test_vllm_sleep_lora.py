"""vLLM 0.32's sleep state and LoRA adapters, read from the real capture's own lines with the
states a GPU server would show (the CPU build cannot sleep or serve adapters cheaply)."""

from __future__ import annotations

import re

import pytest

from collectors.engines.vllm import parse_vllm
from tests.conftest import VLLM_032, read

AWAKE = (
    'vllm:engine_sleep_state{engine="0",model_name="tiny",sleep_state="awake"} 1.0\n'
    'vllm:engine_sleep_state{engine="0",model_name="tiny",sleep_state="weights_offloaded"} 0.0\n'
    'vllm:engine_sleep_state{engine="0",model_name="tiny",sleep_state="discard_all"} 0.0\n'
)


def _with_sleep(awake: float, offloaded: float, discarded: float) -> str:
    text = read(VLLM_032)
    assert AWAKE in text  # the capture's own lines, replaced below
    return text.replace(
        AWAKE,
        AWAKE.replace('"awake"} 1.0', f'"awake"}} {awake}')
        .replace('"weights_offloaded"} 0.0', f'"weights_offloaded"}} {offloaded}')
        .replace('"discard_all"} 0.0', f'"discard_all"}} {discarded}'),
    )


@pytest.mark.parametrize(
    ("states", "level"), [((1.0, 0.0, 0.0), 0.0), ((0.0, 1.0, 0.0), 1.0), ((0.0, 0.0, 1.0), 2.0)]
)
def test_the_sleep_level_is_read_from_the_state_that_is_set(
    states: tuple[float, float, float], level: float
) -> None:
    assert parse_vllm(_with_sleep(*states)).gauges["sleep_level"] == level


def test_a_release_without_the_sleep_family_gives_none() -> None:
    text = re.sub(r"^vllm:engine_sleep_state.*\n", "", read(VLLM_032), flags=re.M)
    assert parse_vllm(text).gauges["sleep_level"] is None


def test_lora_adapters_come_from_the_newest_label_set() -> None:
    # prometheus_client keeps every label set the gauge was ever given; its value is the
    # time it was set, so the newest one is now.
    lines = (
        "# TYPE vllm:lora_requests_info gauge\n"
        'vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql",'
        'waiting_lora_adapters=""} 1.7e9\n'
        'vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql,chat",'
        'waiting_lora_adapters="code"} 1.8e9\n'
    )
    sample = parse_vllm(read(VLLM_032) + lines)
    assert sample.lora == {"running": ["sql", "chat"], "waiting": ["code"], "max_lora": 4}
    assert sample.gauges["lora_adapters_running"] == 2
    assert sample.gauges["lora_adapters_waiting"] == 1
    without = parse_vllm(read(VLLM_032))
    assert without.lora is None and without.gauges["lora_adapters_running"] is None
