"""Write kneepoint/twin/sglang_catalog.py: every metric family a plain SGLang server exposes,
per release generation, as SGLang's own metrics code defines it.

For each release, the metrics collector module of its PyPI wheel is run unchanged (with the
stand-ins of tests/fixtures/sglang-generate.py for the rest of SGLang) in the configuration of
a plain single-GPU server: one scheduler (tp_rank 0, no data parallelism, no priority
scheduling, no extra labels), one tokenizer. Two expositions are taken, as SGLang's /metrics
renders them (prometheus_client in multiprocess mode):

* idle: the scheduler has logged its stats and emitted its constants once, nothing has been
  served. Every series present then is `eager`: a real server shows it from its first scrape.
* served: a streamed and a non-streamed request have finished (with prefix-cache hits), a
  request was retracted and queue times were observed. Series that appear only then are
  `lazy`: SGLang creates them at their first observation.

The catalog keeps each family's name, type, HELP text, label names, histogram bucket bounds
and the series it has (their labels, and for eager ones the value SGLang's code left):
the twin (kneepoint/twin/sglang.py) renders exactly those, with the engine's numbers where it
models the quantity. tests/twin/test_sglang.py checks the twin's output against the fixtures
tests/fixtures/sglang-*.prom (produced the same way by another script, with other inputs).

Run:  .venv/bin/python tests/twin/make_sglang_catalog.py [--wheels DIR]
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import multiprocessing
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "kneepoint" / "twin" / "sglang_catalog.py"
MODEL = "Qwen/Qwen3-8B"  # the fixture generator's served model name (replaced when rendered)
VERSIONS = ("0.5.23", "0.5.16", "0.5.10", "0.5.4", "0.4.6", "0.4.0")


def generator() -> Any:
    """tests/fixtures/sglang-generate.py, for its stand-ins and its scheduler/tokenizer runs."""
    path = ROOT / "tests" / "fixtures" / "sglang-generate.py"
    spec = importlib.util.spec_from_file_location("sglang_generate", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def scheduler_labels(version: str) -> dict[str, Any]:
    """The scheduler's labels on a plain server (metrics_collector / scheduler code of each
    release): model_name; engine_type from 0.4.6; tp_rank and pp_rank from 0.5.0; moe_ep_rank
    from 0.5.10. dp_rank only with data parallelism, priority only with priority scheduling."""
    labels: dict[str, Any] = {"model_name": MODEL}
    if version != "0.4.0":
        labels["engine_type"] = "unified"
    if version not in ("0.4.0", "0.4.6"):
        labels |= {"tp_rank": 0, "pp_rank": 0}
    if version in ("0.5.10", "0.5.16", "0.5.23"):
        labels["moe_ep_rank"] = 0
    return labels


def tokenizer_labels(version: str) -> dict[str, Any]:
    labels: dict[str, Any] = {"model_name": MODEL}
    if version in ("0.5.16", "0.5.23"):
        labels["engine_type"] = "unified"
    return labels


def scheduler_feed(version: str, served: bool) -> dict[str, Any]:
    stats: dict[str, Any] = {
        "num_running_reqs": 0,
        "num_used_tokens": 0,
        "token_usage": 0.0,
        "gen_throughput": 0.0,
        "num_queue_reqs": 0,
        "cache_hit_rate": 0.0,
    }
    if version != "0.4.0":
        stats["spec_accept_length"] = 0.0
    if version.startswith("0.5"):
        stats |= {"spec_accept_rate": 0.0, "num_retracted_reqs": 0}
    if version in ("0.5.10", "0.5.16", "0.5.23"):
        stats["full_token_usage"] = 0.0
    if version == "0.5.10":
        stats["max_total_num_tokens"] = 100000
    if version in ("0.5.16", "0.5.23"):
        stats |= {"kv_used_tokens": 0, "kv_available_tokens": 100000, "kv_evictable_tokens": 0}
    feed: dict[str, Any] = {"stats": stats}
    if version == "0.5.10":
        feed["cache_config_info"] = {"page_size": 1, "num_pages": 100000}
    constants: dict[str, Any] = {
        "max_total_num_tokens": 100000,
        "max_running_requests_under_SLO": None,
        "page_size": 1,
        "num_pages": 100000,
        "context_len": 40960,
        "startup_available_gpu_memory_gb": 70.0,
    }
    if version == "0.5.16":
        feed["constants"] = constants | {
            "engine_startup_time": 40.0,
            "engine_load_weights_time": 10.0,
        }
    if version == "0.5.23":
        feed["constants"] = constants | {
            "max_total_num_tokens_swa": None,
            "weight_memory_usage_gb": 15.0,
            "kv_cache_memory_usage_gb": 40.0,
            "graph_memory_usage_gb": {},
        }
    if served and version in ("0.5.10", "0.5.16", "0.5.23"):
        feed["retracted"] = {
            "num_retracted_reqs": 1,
            "num_retracted_input_tokens": 100,
            "num_retracted_output_tokens": 10,
        }
    if served and version not in ("0.4.0", "0.4.6"):
        feed["queue_times"] = [0.05]
    return feed


def tokenizer_feed(version: str) -> dict[str, Any]:
    requests = []
    for stream in (True, False):
        request: dict[str, Any] = {
            "prompt_tokens": 300,
            "generation_tokens": 40,
            "cached_tokens": 128,
            "ttft": 0.2,
            "e2e": 1.0,
            "itl": [0.02, 0.02],
            "stream": stream,
            "tpot": 0.02,
            "retractions": 1,
            "spec_verify_ct": 10,
        }
        if version in ("0.5.10", "0.5.16", "0.5.23"):
            # What a real scheduler sends (its output streamer's fallback): device hits.
            request["cached_tokens_details"] = {"device": 128, "host": 0}
        requests.append(request)
    return {"requests": requests}


def expose(gen: Any, version: str, root: Path, served: bool) -> str:
    with tempfile.TemporaryDirectory() as directory:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
        forked = multiprocessing.get_context("fork")
        feeds = [
            (gen.run_scheduler, scheduler_labels(version), scheduler_feed(version, served)),
            (
                gen.run_tokenizer,
                tokenizer_labels(version),
                tokenizer_feed(version) if served else {"requests": []},
            ),
        ]
        for target, labels, feed in feeds:
            job = forked.Process(target=target, args=(version, str(root), labels, feed))
            job.start()
            job.join()
            if job.exitcode != 0:
                raise SystemExit(f"{version}: a process failed ({job.exitcode})")
        text: str = gen.render(directory)
        return text


def families(text: str) -> dict[str, dict[str, Any]]:
    # Imported here: prometheus_client picks its multiprocess mode at import, which must
    # happen in each forked SGLang process after PROMETHEUS_MULTIPROC_DIR is set.
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[str, Any]] = {}
    for family in text_string_to_metric_families(text):
        series: dict[tuple[tuple[str, str], ...], float] = {}
        labelnames: list[str] = []
        bounds: list[float] = []
        for sample in family.samples:
            histogram = family.type == "histogram"
            labels = {k: v for k, v in sample.labels.items() if k != "le" or not histogram}
            for key in labels:
                if key not in labelnames:
                    labelnames.append(key)
            if sample.name.endswith("_bucket"):
                bound = float(sample.labels["le"])
                if not math.isinf(bound) and bound not in bounds:
                    bounds.append(bound)
                continue
            if histogram and not sample.name.endswith("_count"):
                continue
            key = tuple(sorted((k, v) for k, v in labels.items() if k != "pid"))
            series[key] = sample.value
        name = family.name + ("_total" if family.type == "counter" else "")
        out[name] = {
            "type": family.type,
            "help": family.documentation,
            "labels": tuple(sorted(labelnames)),
            "bounds": tuple(sorted(bounds)),
            "series": series,
        }
    return out


def catalog(gen: Any, version: str, wheel: Path) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as root:
        gen.extract(wheel, Path(root))
        idle = families(expose(gen, version, Path(root), served=False))
        served = families(expose(gen, version, Path(root), served=True))
    entries = []
    # By name: the multiprocess collector's own order follows its files' (pids') order.
    for name, family in sorted(served.items()):
        before = idle.get(name, {"series": {}})["series"]
        eager = {
            labels: (value if not math.isnan(value) else "nan")
            for labels, value in family["series"].items()
            if labels in before
        }
        if family["type"] == "histogram":
            eager = dict.fromkeys(eager, 0.0)  # an untouched histogram: zero counts
        if name in idle and not before:
            eager = {}
        entries.append(
            {
                "name": name,
                "type": family["type"],
                "help": family["help"],
                "labels": family["labels"],
                "bounds": family["bounds"],
                # Series present before anything was served, with SGLang's value then.
                "eager": tuple((dict(labels), value) for labels, value in eager.items()),
            }
        )
    return entries


BASE = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank", "pid")

HEADER = '''"""Every metric family a plain SGLang server exposes, per release generation.

Generated by tests/twin/make_sglang_catalog.py from the PyPI wheels' own metrics code; do not
edit by hand. Per generation, each family: its exposed name (counters with `_total`), type,
HELP text, label names, histogram bucket bounds (a key of BOUNDS) and `eager`: the series a
freshly started server shows before it has served anything, each as its labels beyond the
server's own (model_name, engine_type, tp_rank, pp_rank, moe_ep_rank, pid) and SGLang's value
then. A family without eager series appears at its first observation.
"""

# ruff: noqa: E501
# fmt: off
from __future__ import annotations

from typing import NamedTuple


class Family(NamedTuple):
    name: str
    type: str
    help: str
    labels: tuple[str, ...]
    bounds: str | None
    eager: tuple[tuple[tuple[tuple[str, str], ...], float], ...]


'''


def write(out: dict[str, list[dict[str, Any]]]) -> None:
    bounds: dict[tuple[float, ...], str] = {}
    lines = []
    for version, entries in out.items():
        lines.append(f"    {version!r}: (")
        for entry in entries:
            key = None
            if entry["type"] == "histogram":
                key = bounds.setdefault(entry["bounds"], f"b{len(bounds)}")
            eager = tuple(
                (tuple((k, v) for k, v in sorted(labels.items()) if k not in BASE), value)
                for labels, value in entry["eager"]
            )
            fields = [entry["name"], entry["type"], entry["help"], entry["labels"], key, eager]
            lines.append(f"        Family{tuple(fields)!r},".replace("'nan'", 'float("nan")'))
        lines.append("    ),")
    table = "\n".join(f"    {key!r}: {value!r}," for value, key in bounds.items())
    OUT.write_text(
        HEADER
        + f"BOUNDS: dict[str, tuple[float, ...]] = {{\n{table}\n}}\n\n"
        + "FAMILIES: dict[str, tuple[Family, ...]] = {\n"
        + "\n".join(lines)
        + "\n}\n# fmt: on\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--wheels", type=Path, default=Path.home() / ".cache" / "kneepoint" / "sglang-wheels"
    )
    args = parser.parse_args()
    gen = generator()
    out: dict[str, list[dict[str, Any]]] = {}
    for version in VERSIONS:
        wheel = next(args.wheels.glob(f"sglang-{version}-*.whl"), None)
        if wheel is None:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    f"sglang=={version}",
                    "--no-deps",
                    "--only-binary",
                    ":all:",
                    "-d",
                    str(args.wheels),
                ],
                check=True,
            )
            wheel = next(args.wheels.glob(f"sglang-{version}-*.whl"))
        out[version] = catalog(gen, version, wheel)
        print(f"{version}: {len(out[version])} families")
    write(out)
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
