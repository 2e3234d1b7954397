from __future__ import annotations

import pytest

from collectors.dcgm import parse_dcgm
from collectors.parse import ScrapeFormatError
from tests.conftest import DCGM_L4, DCGM_T4, read

LABELS = 'gpu="{gpu}",UUID="GPU-{gpu}",modelName="NVIDIA H100 80GB HBM3",{host}'


def line(
    field: str, value: str, gpu: int = 0, host: str = 'Hostname="node-7"', extra: str = ""
) -> str:
    return f"DCGM_FI_{field}{{{LABELS.format(gpu=gpu, host=host)}{extra}}} {value}\n"


def test_it_reads_the_real_idle_l4_capture() -> None:
    [gpu] = parse_dcgm(read(DCGM_L4), default_host="exporter")
    assert (gpu.host, gpu.index, gpu.model) == ("i-030791dc5a37cd257", 0, "NVIDIA L4")
    assert gpu.utilization == 0.0
    assert gpu.gr_engine_active == 0.0
    assert gpu.power_watts == pytest.approx(16.365)
    assert gpu.energy_mj == 4742776
    assert gpu.fb_used_mib == 0 and gpu.fb_free_mib == 22563
    assert gpu.temperature_c == 31
    # Not exported by this exporter: absent, not zero.
    assert gpu.sm_active is None
    # No XID_ERRORS series: no XID so far.
    assert gpu.xid_error is None
    # GDDR memory reports 0 °C, which means "no sensor".
    assert gpu.memory_temperature_c is None


def test_it_reads_the_real_loaded_t4_capture_without_help_lines() -> None:
    [gpu] = parse_dcgm(read(DCGM_T4), default_host="exporter")
    assert gpu.model == "Tesla T4"
    # The pitfall the capture shows: GPU_UTIL says busy, the engine is mostly idle.
    assert gpu.utilization == pytest.approx(0.91)
    assert gpu.gr_engine_active == pytest.approx(0.156205)
    assert gpu.dram_active == pytest.approx(0.092781)
    assert gpu.fb_used_mib == 5120


def test_it_drops_blank_sentinels() -> None:
    text = (
        line("DEV_GPU_TEMP", "55")
        + line("PROF_DRAM_ACTIVE", "9223372036854775794")
        + line("DEV_POWER_USAGE", "1.4e26")
    )
    [gpu] = parse_dcgm(text, default_host="x")
    assert gpu.temperature_c == 55
    assert gpu.dram_active is None
    assert gpu.power_watts is None


def test_it_accepts_lower_case_hostname_and_falls_back_to_the_target_name() -> None:
    text = line("DEV_GPU_TEMP", "50", gpu=0, host='hostname="node-8"') + line(
        "DEV_GPU_TEMP", "51", gpu=1, host='device="nvidia1"'
    )
    gpus = parse_dcgm(text, default_host="dcgm-target")
    assert [(g.host, g.index, g.temperature_c) for g in gpus] == [
        ("dcgm-target", 1, 51),
        ("node-8", 0, 50),
    ]


def test_it_reads_pods_directly_and_behind_prometheus() -> None:
    text = line("DEV_GPU_TEMP", "50", gpu=0, extra=',pod="vllm-0",namespace="llm"') + line(
        "DEV_GPU_TEMP", "50", gpu=1, extra=',exported_pod="vllm-1"'
    )
    gpus = parse_dcgm(text, default_host="x")
    assert [(g.pod, g.namespace) for g in gpus] == [("vllm-0", "llm"), ("vllm-1", None)]


def test_it_reports_an_xid_error() -> None:
    text = line("DEV_GPU_TEMP", "50") + line("DEV_XID_ERRORS", "79", extra=',err_code="79"')
    [gpu] = parse_dcgm(text, default_host="x")
    assert gpu.xid_error == 79


def test_it_keeps_gpus_apart() -> None:
    text = "".join(line("DEV_GPU_UTIL", str(10 * i), gpu=i) for i in range(4))
    gpus = parse_dcgm(text, default_host="x")
    assert [g.utilization for g in gpus] == [0.0, 0.1, 0.2, 0.3]


def test_it_refuses_a_body_without_dcgm_fields() -> None:
    with pytest.raises(ScrapeFormatError, match="DCGM"):
        parse_dcgm("vllm:num_requests_running 1\n", default_host="x")
