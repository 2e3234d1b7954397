"""MFU and MBU: the GPU peak table and its matching rule, the config's gpu_peaks, the
formulas against hand computations, and status's figures on real 0.32 captures."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from collectors.dcgm import parse_dcgm
from collectors.engines.vllm import parse_vllm
from kneepoint import gpu_peaks
from kneepoint.config import Config, ConfigError, parse_config
from kneepoint.derived import flops
from kneepoint.gpu_peaks import DTYPES, PEAKS, find
from kneepoint.status import build_status
from kneepoint.store.db import open_store
from kneepoint.store.writer import ensure_targets, record_gpus, record_replica
from tests.conftest import DCGM_T4, OWN_FIXTURES, VLLM_032, read

MFU_CAPTURE = OWN_FIXTURES / "vllm-0.32.0-cpu-mfu-shedding.prom"

# The names dcgm-exporter reports (DCGM's modelName) and the entry each must find.
DCGM_NAMES = {
    "NVIDIA H100 80GB HBM3": "H100 SXM",
    "NVIDIA H100 PCIe": "H100 PCIe",
    "NVIDIA H100 NVL": "H100 NVL",
    "NVIDIA H200": "H200 SXM",
    "NVIDIA H200 NVL": "H200 NVL",
    "NVIDIA GH200 480GB": "GH200 (96 GB HBM3)",
    "NVIDIA GH200 144G HBM3e": "GH200 (144 GB HBM3e)",
    "NVIDIA B200": "B200",
    "NVIDIA A100-SXM4-40GB": "A100 SXM 40GB",
    "NVIDIA A100-SXM4-80GB": "A100 SXM 80GB",
    "NVIDIA A100-PCIE-40GB": "A100 PCIe 40GB",
    "NVIDIA A100 80GB PCIe": "A100 PCIe 80GB",
    "NVIDIA L40S": "L40S",
    "NVIDIA L40": "L40",
    "NVIDIA L4": "L4",
    "NVIDIA A10": "A10",
    "NVIDIA A10G": "A10G",
    "Tesla T4": "T4",
    "Tesla V100-SXM2-32GB": "V100 SXM2",
    "Tesla V100-PCIE-16GB": "V100 PCIe",
    "AMD Instinct MI300X": "MI300X",
}


# --- the table and its matching rule ---------------------------------------------------


@pytest.mark.parametrize(("model_name", "entry"), DCGM_NAMES.items())
def test_each_dcgm_model_name_finds_its_own_entry(model_name: str, entry: str) -> None:
    found = find(model_name)
    assert found is not None and found.name == entry


def test_words_match_whole_so_a_shorter_name_never_takes_a_longer_one() -> None:
    assert gpu_peaks.words("NVIDIA A100-SXM4-80GB") == ("nvidia", "a100", "sxm4", "80gb")
    assert find("NVIDIA L40S").name != find("NVIDIA L40").name  # type: ignore[union-attr]
    assert find("NVIDIA A100") is None  # "A10" is not a word of it; which A100 is unknown
    assert find("NVIDIA RTX 4000 Ada Generation") is None


def test_every_entry_has_a_source_a_bandwidth_and_only_known_dtypes() -> None:
    for peak in PEAKS:
        assert peak.source and peak.bandwidth_gb_s > 0 and peak.match
        assert set(peak.tflops) <= set(DTYPES) and all(v > 0 for v in peak.tflops.values())
    # Dense figures: a tensor core does twice the FP8 (or INT8) work of BF16, and BF16 and
    # FP16 run at one rate, on every GPU that has them.
    for peak in PEAKS:
        t = peak.tflops
        if "bf16" in t and "fp16" in t:
            assert t["bf16"] == t["fp16"], peak.name
        if "fp8" in t and "bf16" in t:
            assert t["fp8"] == pytest.approx(2 * t["bf16"], rel=0.01), peak.name


def test_a_config_entry_is_tried_first_and_can_override_a_built_in_one() -> None:
    config = parse_config(
        "gpu_peaks:\n"
        "  - match: RTX 4000 Ada\n"
        "    tflops: {bf16: 26.7, fp8: 53.4}\n"
        "    bandwidth_gb_s: 360\n"
        "  - match: H100\n"
        "    tflops: {bf16: 500}\n"
        "    bandwidth_gb_s: 3000\n"
        "compute_dtype: fp8\n"
    )
    assert config.compute_dtype == "fp8"
    ada = find("NVIDIA RTX 4000 Ada Generation", config.peaks())
    assert ada is not None and ada.flops("fp8") == 53.4e12 and ada.bandwidth == 360e9
    h100 = find("NVIDIA H100 PCIe", config.peaks())
    assert h100 is not None and h100.source == "config" and h100.flops("bf16") == 500e12
    assert Config().compute_dtype == "bf16"


@pytest.mark.parametrize(
    ("yaml", "message"),
    [
        (
            "gpu_peaks:\n  - match: X1\n    tflops: {bf17: 1}\n    bandwidth_gb_s: 1\n",
            "gpu_peaks[0].tflops.bf17.[key]: Input should be 'fp32', 'tf32', 'bf16', 'fp16', "
            "'fp8' or 'int8'",
        ),
        (
            "gpu_peaks:\n  - match: X1\n    tflops: {}\n    bandwidth_gb_s: 1\n",
            "gpu_peaks[0].tflops: must give a peak for one data type at least",
        ),
        (
            "gpu_peaks:\n  - match: '--'\n    tflops: {bf16: 1}\n    bandwidth_gb_s: 1\n",
            "gpu_peaks[0].match: must hold a word of the GPU's name",
        ),
        (
            "gpu_peaks:\n  - match: X1\n    tflops: {bf16: -5}\n    bandwidth_gb_s: 1\n",
            "gpu_peaks[0].tflops.bf16: Input should be greater than 0",
        ),
        (
            "gpu_peaks:\n  - match: X1\n    tflops: {bf16: 5}\n",
            "gpu_peaks[0].bandwidth_gb_s: is required",
        ),
        ("compute_dtype: fp64\n", "compute_dtype: Input should be 'fp32'"),
        (
            "targets:\n  - {name: n, kind: dcgm, url: 'http://n/metrics', gpu_model: H100}\n",
            "targets[0]: gpu_model and compute_dtype are for engine targets, not dcgm",
        ),
    ],
)
def test_a_bad_gpu_peaks_entry_is_one_clear_config_error(yaml: str, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse_config(yaml)
    assert message in str(error.value)


# --- the formulas --------------------------------------------------------------------------

H100 = find("NVIDIA H100 80GB HBM3")


def test_mfu_and_mbu_are_the_work_over_what_the_engines_gpus_could_have_done() -> None:
    assert H100 is not None
    # 2 data-parallel engines, 60 s: 3e16 FLOPs and 1.2e14 + 0.3e14 bytes summed over them.
    used = flops.utilization(3e16, 1.2e14, 0.3e14, 5e16, 1e5, 60.0, 2, "H100", H100, "bf16")
    assert used.mfu == pytest.approx(3e16 / (60 * 2 * 989.5e12))
    assert used.mbu == pytest.approx(1.5e14 / (60 * 2 * 3350e9))
    assert used.mfu_unavailable is None and used.mbu_unavailable is None
    # The same work judged at fp8: half the MFU, the same MBU.
    at_fp8 = flops.utilization(3e16, 1.2e14, 0.3e14, 5e16, 1e5, 60.0, 2, "H100", H100, "fp8")
    assert at_fp8.mfu == pytest.approx(used.mfu / 2) and at_fp8.mbu == used.mbu


def test_an_idle_window_with_the_counters_on_is_zero_not_null() -> None:
    used = flops.utilization(0.0, 0.0, 0.0, 4e15, 0.0, 60.0, 1, "H100", H100, "bf16")
    assert (used.mfu, used.mbu) == (0.0, 0.0)


@pytest.mark.parametrize(
    ("args", "mfu_reason", "mbu_reason"),
    [
        ((None, None, None, None, 500.0, 60.0, 1, "H100"), flops.ABSENT, flops.ABSENT),
        ((0.0, 0.0, 0.0, 0.0, 500.0, 60.0, 1, "H100"), flops.OFF, flops.OFF),
        ((0.0, 0.0, 0.0, 0.0, 0.0, 60.0, 1, "H100"), flops.UNKNOWN_SWITCH, flops.UNKNOWN_SWITCH),
        ((1e12, 1e9, 1e9, 1e12, 5.0, None, 1, "H100"), flops.NO_WINDOW, flops.NO_WINDOW),
        ((1e12, 1e9, 1e9, 1e12, 5.0, 60.0, None, "H100"), flops.NO_ENGINES, flops.NO_ENGINES),
        ((1e12, 1e9, 1e9, 1e12, 5.0, 60.0, 1, None), flops.NO_GPU, flops.NO_GPU),
    ],
)
def test_null_with_its_reason(args: tuple, mfu_reason: str, mbu_reason: str) -> None:
    used = flops.utilization(*args, H100, "bf16")
    assert (used.mfu, used.mbu) == (None, None)
    assert (used.mfu_unavailable, used.mbu_unavailable) == (mfu_reason, mbu_reason)


def test_an_unknown_gpu_says_to_add_it_and_a_missing_dtype_leaves_mbu() -> None:
    name = "NVIDIA RTX 4000 Ada Generation"
    unknown = flops.utilization(1e12, 1e9, 1e9, 1e12, 5.0, 60.0, 1, name, find(name), "bf16")
    assert unknown.mfu is None and unknown.mbu is None
    assert unknown.mfu_unavailable == (
        "no peak known for GPU NVIDIA RTX 4000 Ada Generation: add it under gpu_peaks in the config"
    )
    t4 = find("Tesla T4")
    assert t4 is not None
    no_bf16 = flops.utilization(1e12, 1e9, 1e9, 1e12, 5.0, 60.0, 1, "Tesla T4", t4, "bf16")
    assert no_bf16.mfu is None and "no bf16 peak known for GPU Tesla T4" in str(
        no_bf16.mfu_unavailable
    )
    assert no_bf16.mbu == pytest.approx(2e9 / (60 * 320e9))


def test_the_gpu_of_a_replica_is_its_dcgm_gpus_else_its_configured_model() -> None:
    assert flops.gpu_model(["Tesla T4", "Tesla T4"], "NVIDIA L4") == ("Tesla T4", "")
    assert flops.gpu_model([None], "NVIDIA L4") == ("NVIDIA L4", "")
    assert flops.gpu_model([], None) == (None, flops.NO_GPU)
    model, why = flops.gpu_model(["Tesla T4", "NVIDIA L4"], None)
    assert model is None and why == flops.mixed_gpus(["NVIDIA L4", "Tesla T4"])


def test_the_fleet_is_all_work_over_all_capacity_of_the_replicas_that_know_theirs() -> None:
    assert H100 is not None
    a = flops.utilization(3e16, 1e14, 0.0, 3e16, 9.0, 60.0, 2, "H100", H100, "bf16")
    b = flops.utilization(1e16, 2e14, 0.0, 1e16, 9.0, 30.0, 1, "H100", H100, "bf16")
    off = flops.utilization(0.0, 0.0, 0.0, 0.0, 9.0, 30.0, 1, "H100", H100, "bf16")
    fleet = flops.fleet([a, b, off])
    assert fleet.mfu == pytest.approx(4e16 / ((60 * 2 + 30) * 989.5e12))
    assert fleet.mbu == pytest.approx(3e14 / ((60 * 2 + 30) * 3350e9))
    nothing = flops.fleet([off])
    assert nothing.mfu is None and nothing.mfu_unavailable == flops.OFF
    assert flops.fleet([]).mfu_unavailable == "no replica"


# --- status, on real 0.32 captures ---------------------------------------------------------


@pytest.fixture
def status(tmp_path: Path) -> dict:
    """Replica `t4` (DCGM's Tesla T4, judged at fp16) and `cfg` (no DCGM, its gpu_model an
    entry of gpu_peaks) serve the MFU capture's counters grown by hand; `frozen` serves the
    shared capture, whose counters stay at 0 (--enable-mfu-metrics off); `bf16` runs on the
    T4 too (by its gpu_model), at the default bf16, which the T4 lacks."""
    config = parse_config(
        f"database: sqlite:///{tmp_path / 's.db'}\n"
        "gpu_peaks:\n"
        "  - {match: test cpu, tflops: {bf16: 0.5}, bandwidth_gb_s: 20}\n"
        "targets:\n"
        "  - {name: t4, kind: vllm, url: 'http://a/metrics', gpus: [cp-bm14r7/0],"
        " compute_dtype: fp16}\n"
        "  - {name: cfg, kind: vllm, url: 'http://b/metrics', gpu_model: Test CPU}\n"
        "  - {name: frozen, kind: vllm, url: 'http://c/metrics', gpu_model: Test CPU}\n"
        "  - {name: bf16, kind: vllm, url: 'http://e/metrics', gpu_model: Tesla T4}\n"
        "  - {name: node, kind: dcgm, url: 'http://d/metrics'}\n"
    )
    sessions = open_store(config.database)
    first = parse_vllm(read(MFU_CAPTURE))
    assert first.counters["estimated_flops"]  # the capture counted FLOPs
    later = copy.deepcopy(first)
    for key, grown in (
        ("estimated_flops", 6e14),
        ("estimated_read_bytes", 4e11),
        ("estimated_write_bytes", 1e11),
        ("generation_tokens", 300.0),
    ):
        later.counters[key] = (first.counters[key] or 0.0) + grown
    frozen = parse_vllm(read(VLLM_032))
    frozen_later = copy.deepcopy(frozen)
    frozen_later.counters["generation_tokens"] = (frozen.counters["generation_tokens"] or 0) + 50
    with sessions.begin() as session:
        ids = ensure_targets(session, [(t.name, t.kind, t.url) for t in config.targets])
        for name in ("t4", "cfg", "bf16"):
            record_replica(session, ids[name], 1000.0, first)
            record_replica(session, ids[name], 1030.0, later)
        record_replica(session, ids["frozen"], 1000.0, frozen)
        record_replica(session, ids["frozen"], 1030.0, frozen_later)
        gpus = parse_dcgm(read(DCGM_T4), default_host="node")
        record_gpus(session, ids["node"], 1000.0, gpus)
        record_gpus(session, ids["node"], 1030.0, gpus)
    with sessions() as session:
        return build_status(session, config, now=1040.0, window=300.0)


def test_status_gives_each_replica_its_mfu_and_mbu_or_why_not(status: dict) -> None:
    replicas = {r["name"]: r for r in status["replicas"]}
    t4 = replicas["t4"]
    # 1 engine, 30 s, the T4's datasheet: 65 TFLOPS FP16, 320 GB/s.
    assert t4["engines"] == 1
    assert t4["mfu"] == pytest.approx(6e14 / (30 * 65e12))
    assert t4["mbu"] == pytest.approx(5e11 / (30 * 320e9))
    assert t4["mfu_unavailable"] is None and t4["mbu_unavailable"] is None
    cfg = replicas["cfg"]
    assert cfg["mfu"] == pytest.approx(6e14 / (30 * 0.5e12))
    assert cfg["mbu"] == pytest.approx(5e11 / (30 * 20e9))
    off = replicas["frozen"]
    assert off["mfu"] is None and off["mbu"] is None and off["mfu_unavailable"] == flops.OFF
    bf16 = replicas["bf16"]
    assert bf16["mfu"] is None and bf16["mbu"] == pytest.approx(t4["mbu"])
    assert bf16["mfu_unavailable"] == flops.no_dtype_peak("Tesla T4", "bf16")
    fleet = status["fleet"]
    assert fleet["mfu"] == pytest.approx(2 * 6e14 / (30 * 65e12 + 30 * 0.5e12))
    gpu = status["gpus"][0]
    assert gpu["tensor_active"] is None or 0.0 <= gpu["tensor_active"] <= 1.0
