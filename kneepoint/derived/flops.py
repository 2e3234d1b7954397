"""Model FLOPs utilization (MFU) and memory-bandwidth utilization (MBU) of a replica over a
window, from vLLM's own estimate of the model's work (docs/reference/metrics.md, MFU and MBU).

vLLM (0.32 and later, `--enable-mfu-metrics`) counts, per engine, the FLOPs and the bytes
read and written by one GPU of that engine (vllm/v1/metrics/perf.py: the model's work for the
tokens it scheduled, divided by the engine's tensor- and pipeline-parallel sizes). The
replica's counters are those summed over its data-parallel engines, so

    MFU = Δestimated_flops ÷ (Δt × engines × peak FLOP/s of one GPU at the compute dtype)
    MBU = Δ(estimated_read_bytes + estimated_write_bytes) ÷ (Δt × engines × peak bytes/s)

is the mean over the engines of one GPU's utilization (every GPU of an engine carries the
same share). Null with its reason where it cannot be said."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kneepoint.gpu_peaks import GpuPeak

ABSENT = (
    "the engine does not count the model's FLOPs and bytes "
    "(vLLM 0.32 and later with --enable-mfu-metrics)"
)
OFF = "--enable-mfu-metrics is off: the FLOPs counter stayed at 0 while tokens were served"
UNKNOWN_SWITCH = (
    "no token served and the FLOPs counter still at 0: cannot tell whether "
    "--enable-mfu-metrics is on"
)
NO_WINDOW = "fewer than two samples in the window"
NO_ENGINES = "the number of engines behind the endpoint is unknown"
NO_GPU = (
    "no GPU mapped to the replica (dcgm-exporter's GPUs by the target's gpus: or pod, "
    "or the target's gpu_model)"
)


def no_peak(gpu: str) -> str:
    return f"no peak known for GPU {gpu}: add it under gpu_peaks in the config"


def no_dtype_peak(gpu: str, dtype: str) -> str:
    return f"no {dtype} peak known for GPU {gpu}: set compute_dtype, or add it under gpu_peaks"


def mixed_gpus(models: Sequence[str]) -> str:
    return f"the replica's GPUs are of different models ({', '.join(sorted(set(models)))})"


@dataclass(frozen=True)
class Utilization:
    """A replica's MFU and MBU (0..1) over a window, or None with the reason; also the
    numerator and denominator of each, which the fleet's figure sums."""

    mfu: float | None = None
    mbu: float | None = None
    mfu_unavailable: str | None = None
    mbu_unavailable: str | None = None
    flops: float = 0.0  # done in the window
    peak_flops: float = 0.0  # that the replica's GPUs could have done (× engines, × Δt)
    bytes: float = 0.0
    peak_bytes: float = 0.0


def gpu_model(models: Sequence[str | None], configured: str | None) -> tuple[str | None, str]:
    """The one GPU model of a replica: its DCGM GPUs' (all the same), else the target's
    `gpu_model`; or None with why."""
    known = [m for m in models if m]
    if known:
        if len(set(known)) > 1:
            return None, mixed_gpus(known)
        return known[0], ""
    if configured:
        return configured, ""
    return None, NO_GPU


def utilization(
    flops: float | None,
    read_bytes: float | None,
    write_bytes: float | None,
    flops_total: float | None,
    tokens: float | None,
    seconds: float | None,
    engines: int | None,
    gpu: str | None,
    peak: GpuPeak | None,
    dtype: str,
    no_gpu: str = NO_GPU,
) -> Utilization:
    """MFU and MBU from the window's counter increases (`flops`, `read_bytes`,
    `write_bytes`), the FLOPs counter's latest value (`flops_total`), the prompt and
    generated tokens served in the window, its length, the engines behind the replica, its
    GPU's model name and peaks (None: unknown) and the dtype FLOPs are judged at."""
    if flops is None:
        return Utilization(mfu_unavailable=ABSENT, mbu_unavailable=ABSENT)
    if flops == 0 and not flops_total:
        # vLLM 0.32 exports the counters without --enable-mfu-metrics, frozen at 0.
        why = OFF if tokens else UNKNOWN_SWITCH
        return Utilization(mfu_unavailable=why, mbu_unavailable=why)
    if not seconds or seconds <= 0:
        return Utilization(mfu_unavailable=NO_WINDOW, mbu_unavailable=NO_WINDOW)
    if not engines or engines < 1:
        return Utilization(mfu_unavailable=NO_ENGINES, mbu_unavailable=NO_ENGINES)
    if gpu is None:
        return Utilization(mfu_unavailable=no_gpu, mbu_unavailable=no_gpu)
    if peak is None:
        return Utilization(mfu_unavailable=no_peak(gpu), mbu_unavailable=no_peak(gpu))
    peak_flops = peak.flops(dtype)
    capacity = None if peak_flops is None else seconds * engines * peak_flops
    moved = None if read_bytes is None or write_bytes is None else read_bytes + write_bytes
    bandwidth = seconds * engines * peak.bandwidth
    return Utilization(
        mfu=None if capacity is None else flops / capacity,
        mbu=None if moved is None else moved / bandwidth,
        mfu_unavailable=no_dtype_peak(gpu, dtype) if capacity is None else None,
        mbu_unavailable=ABSENT if moved is None else None,
        flops=flops if capacity is not None else 0.0,
        peak_flops=capacity or 0.0,
        bytes=moved or 0.0,
        peak_bytes=bandwidth if moved is not None else 0.0,
    )


def fleet(parts: Sequence[Utilization]) -> Utilization:
    """The fleet's MFU and MBU: the FLOPs (bytes) its replicas did ÷ what their GPUs could
    have done, over the replicas whose figure is known; None, with each replica's reasons,
    where none is."""

    def reasons(key: str) -> str:
        found = sorted({getattr(p, key) for p in parts if getattr(p, key) is not None})
        return "; ".join(found) if found else "no replica"

    done, peak = sum(p.flops for p in parts), sum(p.peak_flops for p in parts)
    moved, bandwidth = sum(p.bytes for p in parts), sum(p.peak_bytes for p in parts)
    return Utilization(
        mfu=done / peak if peak > 0 else None,
        mbu=moved / bandwidth if bandwidth > 0 else None,
        mfu_unavailable=None if peak > 0 else reasons("mfu_unavailable"),
        mbu_unavailable=None if bandwidth > 0 else reasons("mbu_unavailable"),
        flops=done,
        peak_flops=peak,
        bytes=moved,
        peak_bytes=bandwidth,
    )
