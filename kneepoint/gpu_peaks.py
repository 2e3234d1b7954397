"""The peaks a GPU's model FLOPs and memory-bandwidth utilization are judged against: dense
(never "with sparsity") peak FLOPs per data type and peak memory bandwidth for the common
data-centre GPUs, and the rule that finds a GPU's entry from DCGM's `modelName`
(docs/reference/metrics.md, MFU and MBU).

Matching: a name is read as its words (letters and digits, case ignored: "NVIDIA
A100-SXM4-80GB" is a100, sxm4, 80gb). An entry matches when every one of its `match` words is
one of the name's words, whole ("L40" never matches "L40S", "A10" never "A100"). Entries from
the config's `gpu_peaks:` are tried first, in order, and the first that matches wins; else the
built-in entry that matches with the most words wins ("H100 PCIe" over "H100"). No match: no
peak, and so no MFU or MBU (null with its reason, never a guess).

Every figure is the vendor's datasheet, cited beside it. NVIDIA prints its tensor figures
"with sparsity": those are halved here. TFLOPS are 10^12 operations per second (TOPS for
int8); bandwidth is GB/s, 10^9 bytes per second."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

# The data types a peak is given for: fp32 (CUDA cores), tf32, bf16, fp16, fp8 and int8
# (tensor cores). vLLM's FLOPs estimate does not say the data type it ran at.
DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8")
DEFAULT_DTYPE = "bf16"

_WORD = re.compile(r"[a-z0-9]+")


def words(text: str) -> tuple[str, ...]:
    """The words of a GPU name as matching reads them: lower case, letters and digits."""
    return tuple(_WORD.findall(text.casefold()))


@dataclass(frozen=True)
class GpuPeak:
    """One GPU's dense peaks: `tflops` per data type (absent: the GPU has no such peak) and
    its memory bandwidth in GB/s."""

    name: str
    match: tuple[str, ...]  # the words a DCGM modelName must hold (words())
    tflops: Mapping[str, float] = field(hash=False)
    bandwidth_gb_s: float
    source: str = ""

    def flops(self, dtype: str) -> float | None:
        """Peak FLOP/s at `dtype`, or None when the GPU has no peak for it."""
        tflops = self.tflops.get(dtype)
        return None if tflops is None else tflops * 1e12

    @property
    def bandwidth(self) -> float:
        """Peak memory bandwidth, bytes/s."""
        return self.bandwidth_gb_s * 1e9

    def matches(self, model_name: str) -> bool:
        found = set(words(model_name))
        return bool(self.match) and all(word in found for word in self.match)


def _peak(name: str, match: str, bandwidth_gb_s: float, source: str, **tflops: float) -> GpuPeak:
    return GpuPeak(name, words(match), tflops, bandwidth_gb_s, source)


def _hopper(name: str, match: str, bandwidth: float, source: str) -> GpuPeak:
    # H100 SXM5 datasheet: FP32 67, TF32 989*, BF16/FP16 1,979*, FP8/INT8 3,958* (* sparsity).
    return _peak(
        name,
        match,
        bandwidth,
        source,
        fp32=67,
        tf32=494.5,
        bf16=989.5,
        fp16=989.5,
        fp8=1979,
        int8=1979,
    )


def _hopper_nvl(name: str, match: str, bandwidth: float, source: str) -> GpuPeak:
    # H100 NVL / H200 NVL datasheets: FP32 60, TF32 835*, BF16/FP16 1,671*, FP8/INT8 3,341*.
    return _peak(
        name,
        match,
        bandwidth,
        source,
        fp32=60,
        tf32=417.5,
        bf16=835.5,
        fp16=835.5,
        fp8=1670.5,
        int8=1670.5,
    )


def _a100(name: str, match: str, bandwidth: float) -> GpuPeak:
    # NVIDIA A100 datasheet: FP32 19.5, TF32 156, BF16/FP16 312, INT8 624 (dense; no FP8).
    return _peak(
        name,
        match,
        bandwidth,
        "NVIDIA A100 Tensor Core GPU datasheet",
        fp32=19.5,
        tf32=156,
        bf16=312,
        fp16=312,
        int8=624,
    )


H100_SOURCE = "NVIDIA H100 Tensor Core GPU datasheet"
H200_SOURCE = "NVIDIA H200 Tensor Core GPU datasheet"

PEAKS: tuple[GpuPeak, ...] = (
    # DCGM: "NVIDIA H100 80GB HBM3" (SXM5, 3.35 TB/s); "NVIDIA H100 PCIe" (2.0 TB/s: FP32 51,
    # TF32 756*, BF16/FP16 1,513*, FP8/INT8 3,026*); "NVIDIA H100 NVL" (3.9 TB/s).
    _hopper("H100 SXM", "H100", 3350, H100_SOURCE),
    _peak(
        "H100 PCIe",
        "H100 PCIe",
        2000,
        H100_SOURCE,
        fp32=51,
        tf32=378,
        bf16=756.5,
        fp16=756.5,
        fp8=1513,
        int8=1513,
    ),
    _hopper_nvl("H100 NVL", "H100 NVL", 3900, H100_SOURCE),
    # H200 SXM: H100 SXM's compute, 4.8 TB/s HBM3e; H200 NVL: H100 NVL's compute, 4.8 TB/s.
    _hopper("H200 SXM", "H200", 4800, H200_SOURCE),
    _hopper_nvl("H200 NVL", "H200 NVL", 4800, H200_SOURCE),
    # GH200 Grace Hopper Superchip datasheet: the H100's compute; 4 TB/s with 96 GB HBM3
    # (DCGM: "NVIDIA GH200 480GB"), 4.9 TB/s with 144 GB HBM3e ("NVIDIA GH200 144G HBM3e").
    _hopper("GH200 (96 GB HBM3)", "GH200", 4000, "NVIDIA GH200 Grace Hopper Superchip datasheet"),
    _hopper(
        "GH200 (144 GB HBM3e)", "GH200 HBM3e", 4900, "NVIDIA GH200 Grace Hopper Superchip datasheet"
    ),
    # NVIDIA Blackwell datasheet, HGX B200 per GPU (1,000 W): FP32 75, TF32 2.2 P*, BF16/FP16
    # 4.5 P*, FP8/INT8 9 P*; 180 GB HBM3e at 7.7 TB/s.
    _peak(
        "B200",
        "B200",
        7700,
        "NVIDIA Blackwell (HGX B200) datasheet",
        fp32=75,
        tf32=1100,
        bf16=2250,
        fp16=2250,
        fp8=4500,
        int8=4500,
    ),
    # DCGM: "NVIDIA A100-SXM4-40GB" (1,555 GB/s), "NVIDIA A100-SXM4-80GB" (2,039 GB/s),
    # "NVIDIA A100-PCIE-40GB" (1,555 GB/s), "NVIDIA A100 80GB PCIe" (1,935 GB/s).
    _a100("A100 SXM 40GB", "A100 SXM4 40GB", 1555),
    _a100("A100 SXM 80GB", "A100 SXM4 80GB", 2039),
    _a100("A100 PCIe 40GB", "A100 PCIe 40GB", 1555),
    _a100("A100 PCIe 80GB", "A100 PCIe 80GB", 1935),
    # NVIDIA L40S datasheet: FP32 91.6, TF32 366*, BF16/FP16 733*, FP8/INT8 1,466*; 864 GB/s.
    _peak(
        "L40S",
        "L40S",
        864,
        "NVIDIA L40S datasheet",
        fp32=91.6,
        tf32=183,
        bf16=366.5,
        fp16=366.5,
        fp8=733,
        int8=733,
    ),
    # NVIDIA L40 datasheet: FP32 90.5, TF32 181*, BF16/FP16 362*, FP8/INT8 724*; 864 GB/s.
    _peak(
        "L40",
        "L40",
        864,
        "NVIDIA L40 datasheet",
        fp32=90.5,
        tf32=90.5,
        bf16=181,
        fp16=181,
        fp8=362,
        int8=362,
    ),
    # NVIDIA L4 datasheet: FP32 30.3, TF32 120*, BF16/FP16 242*, FP8/INT8 485*; 300 GB/s.
    _peak(
        "L4",
        "L4",
        300,
        "NVIDIA L4 Tensor Core GPU datasheet",
        fp32=30.3,
        tf32=60,
        bf16=121,
        fp16=121,
        fp8=242.5,
        int8=242.5,
    ),
    # NVIDIA A10 datasheet: FP32 31.2, TF32 62.5, BF16/FP16 125, INT8 250 (dense); 600 GB/s.
    _peak(
        "A10",
        "A10",
        600,
        "NVIDIA A10 Tensor Core GPU datasheet",
        fp32=31.2,
        tf32=62.5,
        bf16=125,
        fp16=125,
        int8=250,
    ),
    # A10G (AWS G5): neither NVIDIA nor AWS publishes a datasheet. The figures NVIDIA gave AWS
    # as quoted by Baseten ("NVIDIA A10 vs A10G for ML model inference", 2023): FP32 35, TF32
    # 35, BF16/FP16 70, INT8 140; 600 GB/s. Override under gpu_peaks if you know better.
    _peak(
        "A10G",
        "A10G",
        600,
        "Baseten, NVIDIA A10 vs A10G (no public datasheet)",
        fp32=35,
        tf32=35,
        bf16=70,
        fp16=70,
        int8=140,
    ),
    # NVIDIA T4 datasheet: FP32 8.1, FP16 (mixed) 65, INT8 130 (Turing: no sparsity, no BF16,
    # no TF32); 320 GB/s. DCGM: "Tesla T4".
    _peak("T4", "T4", 320, "NVIDIA T4 datasheet", fp32=8.1, fp16=65, int8=130),
    # NVIDIA V100 datasheet: SXM2 FP32 15.7, tensor (FP16) 125; PCIe FP32 14, tensor 112;
    # 900 GB/s. No BF16, TF32, FP8 nor INT8 tensor. DCGM: "Tesla V100-SXM2-32GB".
    _peak("V100 SXM2", "V100 SXM2", 900, "NVIDIA V100 datasheet", fp32=15.7, fp16=125),
    _peak("V100 PCIe", "V100 PCIe", 900, "NVIDIA V100 datasheet", fp32=14, fp16=112),
    # AMD Instinct MI300X data sheet (dense figures printed beside the sparse ones): FP32
    # 163.4, TF32 653.7, BF16/FP16 1,307.4, FP8/INT8 2,614.9; 5.3 TB/s.
    _peak(
        "MI300X",
        "MI300X",
        5300,
        "AMD Instinct MI300X data sheet",
        fp32=163.4,
        tf32=653.7,
        bf16=1307.4,
        fp16=1307.4,
        fp8=2614.9,
        int8=2614.9,
    ),
)


def find(
    model_name: str, overrides: Iterable[GpuPeak] = (), builtin: Iterable[GpuPeak] = PEAKS
) -> GpuPeak | None:
    """The peaks for a GPU named `model_name` (DCGM's modelName): the first of `overrides`
    (the config's gpu_peaks) that matches, else the built-in entry matching with the most
    words (the first of those on a tie); None when nothing matches."""
    for peak in overrides:
        if peak.matches(model_name):
            return peak
    best: GpuPeak | None = None
    for peak in builtin:
        if peak.matches(model_name) and (best is None or len(peak.match) > len(best.match)):
            best = peak
    return best
