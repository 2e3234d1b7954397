"""Result files of other load generators, read into the run model.

Formats (detected from the content, not the file name):
- `vllm bench serve --save-result` JSON: one object per file, or one per line with
  `--append-result`; old releases wrote `request_goodput:`; acceptance is in percent.
- GuideLLM `benchmarks.json`: both report layouts (strategy under `args` with the model in
  `worker.backend_model`, as 0.2–0.3 wrote; or under `config` with the model in the report's
  top-level `args`, as later releases write).
- AIPerf and GenAI-Perf profile exports (`profile_export_aiperf.json`,
  `profile_export_genai_perf.json`): one metric object per name with its `unit`.
- LLMPerf `*_summary.json`.

A bad file raises ResultFileError: one sentence naming the file and the field.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kneepoint.knee.runs import Point, Run, group


class ResultFileError(ValueError):
    """A result file cannot be imported; nothing of it is stored."""


class _Reader:
    """Field access that names the file and the field in every error."""

    def __init__(self, path: Path) -> None:
        self.name = path.name

    def fail(self, field: str, problem: str) -> ResultFileError:
        return ResultFileError(f"{self.name}: field '{field}' {problem}")

    def get(self, data: Any, dotted: str) -> Any:
        value = data
        for part in dotted.split("."):
            if not isinstance(value, dict) or part not in value:
                return None
            value = value[part]
        return value

    def number(self, data: Any, dotted: str, required: bool = False) -> float | None:
        value = self.get(data, dotted)
        if value is None:
            if required:
                raise self.fail(dotted, "is missing")
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(dotted, f"must be a number, not {json.dumps(value)[:40]}")
        if not math.isfinite(value) or value < 0:
            raise self.fail(dotted, f"must be a finite number ≥ 0, not {value}")
        return float(value)

    def concurrency(self, value: float | None, dotted: str) -> int:
        if value is None:
            raise self.fail(dotted, "is missing: a concurrency step needs its concurrency")
        if value < 1:
            raise self.fail(dotted, f"must be at least 1, not {value:g}")
        return round(value)


def _ms(value: float | None) -> float | None:
    return None if value is None else value / 1000


def _documents(path: Path, reader: _Reader) -> list[Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ResultFileError(f"{path.name}: cannot be read ({error})") from None
    try:
        return [json.loads(text)]
    except json.JSONDecodeError:
        pass
    documents = []  # --append-result writes one JSON object per line
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            documents.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise ResultFileError(f"{path.name}: line {number} is not JSON ({error.msg})") from None
    if not documents:
        raise ResultFileError(f"{path.name}: is empty")
    return documents


def _vllm_bench(doc: dict[str, Any], r: _Reader, path: Path) -> Run:
    concurrency = r.number(doc, "max_concurrency")
    if concurrency is None:  # a rate-driven run: the peak concurrency it reached
        concurrency = r.number(doc, "max_concurrent_requests")
    completed = r.number(doc, "completed")
    failed = r.number(doc, "failed")
    if failed is None and isinstance(doc.get("errors"), list):
        failed = float(sum(1 for e in doc["errors"] if e))
    acceptance = r.number(doc, "spec_decode_acceptance_rate")
    goodput = doc.get("request_goodput", doc.get("request_goodput:"))
    point = Point(
        concurrency=r.concurrency(concurrency, "max_concurrency"),
        output_tokens_per_second=r.number(doc, "output_throughput", required=True) or 0.0,
        requests_per_second=r.number(doc, "request_throughput"),
        ttft_mean_seconds=_ms(r.number(doc, "mean_ttft_ms")),
        ttft_p50_seconds=_ms(r.number(doc, "median_ttft_ms")),
        ttft_p90_seconds=_ms(r.number(doc, "p90_ttft_ms")),
        ttft_p99_seconds=_ms(r.number(doc, "p99_ttft_ms")),
        itl_mean_seconds=_ms(r.number(doc, "mean_itl_ms")),
        itl_p50_seconds=_ms(r.number(doc, "median_itl_ms")),
        itl_p90_seconds=_ms(r.number(doc, "p90_itl_ms")),
        itl_p99_seconds=_ms(r.number(doc, "p99_itl_ms")),
        e2e_mean_seconds=_ms(r.number(doc, "mean_e2el_ms")),
        e2e_p99_seconds=_ms(r.number(doc, "p99_e2el_ms")),
        completed=None if completed is None else int(completed),
        errors=None if failed is None else int(failed),
        duration_seconds=r.number(doc, "duration"),
        spec_acceptance_rate=None if acceptance is None else acceptance / 100,
        spec_acceptance_length=r.number(doc, "spec_decode_acceptance_length"),
    )
    model = doc.get("model_id") or doc.get("model") or "unknown"
    notes = {"request_goodput": goodput} if goodput is not None else {}
    return Run(str(doc.get("label") or path.stem), str(model), "vllm-bench", (point,), None, notes)


def _distribution(r: _Reader, metrics: Any, name: str) -> dict[str, float | None]:
    base = f"{name}.successful"
    return {
        "mean": r.number(metrics, f"{base}.mean"),
        "p50": r.number(metrics, f"{base}.median"),
        "p90": r.number(metrics, f"{base}.percentiles.p90"),
        "p99": r.number(metrics, f"{base}.percentiles.p99"),
    }


def _guidellm(doc: dict[str, Any], r: _Reader, path: Path) -> Run:
    benchmarks = doc.get("benchmarks")
    if not isinstance(benchmarks, list) or not benchmarks:
        raise r.fail("benchmarks", "must be a non-empty list")
    points = []
    model = r.get(doc, "args.model")
    for i, bench in enumerate(benchmarks):
        where = f"benchmarks[{i}]"
        if not isinstance(bench, dict) or not isinstance(bench.get("metrics"), dict):
            raise r.fail(f"{where}.metrics", "is missing")
        strategy = r.get(bench, "config.strategy") or r.get(bench, "args.strategy") or {}
        kind = strategy.get("type_") if isinstance(strategy, dict) else None
        if kind == "concurrent":
            concurrency = r.number(strategy, "streams")
            field = f"{where}.strategy.streams"
        elif kind == "synchronous":
            concurrency, field = 1.0, f"{where}.strategy"
        else:  # throughput, constant, poisson: the concurrency the run actually held
            concurrency = r.number(bench, "metrics.request_concurrency.successful.mean")
            field = f"{where}.metrics.request_concurrency"
        metrics = bench["metrics"]
        ttft = _distribution(r, metrics, "time_to_first_token_ms")
        itl = _distribution(r, metrics, "inter_token_latency_ms")
        e2e = _distribution(r, metrics, "request_latency")
        totals = metrics.get("request_totals") or bench.get("request_totals") or {}
        output = r.number(metrics, "output_tokens_per_second.successful.mean")
        if output is None:
            raise r.fail(f"{where}.metrics.output_tokens_per_second", "is missing")
        points.append(
            Point(
                concurrency=r.concurrency(concurrency, field),
                output_tokens_per_second=output,
                requests_per_second=r.number(metrics, "requests_per_second.successful.mean"),
                ttft_mean_seconds=_ms(ttft["mean"]),
                ttft_p50_seconds=_ms(ttft["p50"]),
                ttft_p90_seconds=_ms(ttft["p90"]),
                ttft_p99_seconds=_ms(ttft["p99"]),
                itl_mean_seconds=_ms(itl["mean"]),
                itl_p50_seconds=_ms(itl["p50"]),
                itl_p90_seconds=_ms(itl["p90"]),
                itl_p99_seconds=_ms(itl["p99"]),
                e2e_mean_seconds=e2e["mean"],
                e2e_p99_seconds=e2e["p99"],
                completed=_int(r.number(totals, "successful")),
                errors=_int(r.number(totals, "errored")),
                duration_seconds=r.number(bench, "duration"),
            )
        )
        model = model or r.get(bench, "worker.backend_model") or r.get(bench, "config.model")
    return Run(path.stem, str(model or "unknown"), "guidellm", tuple(points))


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


_UNIT_SECONDS = {"ms": 1e-3, "milliseconds": 1e-3, "s": 1.0, "sec": 1.0, "ns": 1e-9, "us": 1e-6}


def _profile_export(doc: dict[str, Any], r: _Reader, path: Path) -> Run:
    metrics = doc.get("records") if isinstance(doc.get("records"), dict) else doc
    aiperf = "aiperf_version" in doc or r.get(doc, "input_config.loadgen") is not None

    def latency(name: str, stat: str) -> float | None:
        unit = r.get(metrics, f"{name}.unit")
        value = r.number(metrics, f"{name}.{stat}")
        if value is None:
            return None
        if unit not in _UNIT_SECONDS:
            raise r.fail(f"{name}.unit", f"must be a time unit (ms, s, ns), not {unit!r}")
        return value * _UNIT_SECONDS[unit]

    concurrency = r.number(doc, "input_config.loadgen.concurrency")
    field = "input_config.loadgen.concurrency"
    if concurrency is None:
        concurrency, field = r.number(doc, "input_config.concurrency"), "input_config.concurrency"
    output = r.number(metrics, "output_token_throughput.avg")
    if output is None:
        raise r.fail("output_token_throughput.avg", "is missing")
    model = r.get(doc, "input_config.endpoint.model_names") or r.get(doc, "input_config.model")
    if isinstance(model, list):
        model = model[0] if model else None
    point = Point(
        concurrency=r.concurrency(concurrency, field),
        output_tokens_per_second=output,
        requests_per_second=r.number(metrics, "request_throughput.avg"),
        ttft_mean_seconds=latency("time_to_first_token", "avg"),
        ttft_p50_seconds=latency("time_to_first_token", "p50"),
        ttft_p90_seconds=latency("time_to_first_token", "p90"),
        ttft_p99_seconds=latency("time_to_first_token", "p99"),
        itl_mean_seconds=latency("inter_token_latency", "avg"),
        itl_p50_seconds=latency("inter_token_latency", "p50"),
        itl_p90_seconds=latency("inter_token_latency", "p90"),
        itl_p99_seconds=latency("inter_token_latency", "p99"),
        e2e_mean_seconds=latency("request_latency", "avg"),
        e2e_p99_seconds=latency("request_latency", "p99"),
        completed=_int(r.number(metrics, "request_count.avg")),
        errors=_int(r.number(metrics, "error_request_count.avg")),
        duration_seconds=latency("benchmark_duration", "avg"),
    )
    label = path.parent.name if path.stem.startswith("profile_export") else path.stem
    return Run(label, str(model or "unknown"), "aiperf" if aiperf else "genai-perf", (point,))


def _llmperf(doc: dict[str, Any], r: _Reader, path: Path) -> Run:
    def seconds(name: str) -> float | None:
        return r.number(doc, f"results_{name}")

    per_minute = r.number(doc, "results_num_completed_requests_per_min")
    output = r.number(doc, "results_mean_output_throughput_token_per_s", required=True)
    point = Point(
        concurrency=r.concurrency(
            r.number(doc, "num_concurrent_requests"), "num_concurrent_requests"
        ),
        output_tokens_per_second=output or 0.0,
        requests_per_second=None if per_minute is None else per_minute / 60,
        ttft_mean_seconds=seconds("ttft_s_mean"),
        ttft_p50_seconds=seconds("ttft_s_quantiles_p50"),
        ttft_p90_seconds=seconds("ttft_s_quantiles_p90"),
        ttft_p99_seconds=seconds("ttft_s_quantiles_p99"),
        itl_mean_seconds=seconds("inter_token_latency_s_mean"),
        itl_p50_seconds=seconds("inter_token_latency_s_quantiles_p50"),
        itl_p90_seconds=seconds("inter_token_latency_s_quantiles_p90"),
        itl_p99_seconds=seconds("inter_token_latency_s_quantiles_p99"),
        e2e_mean_seconds=seconds("end_to_end_latency_s_mean"),
        e2e_p99_seconds=seconds("end_to_end_latency_s_quantiles_p99"),
        completed=_int(r.number(doc, "results_num_completed_requests")),
        errors=_int(r.number(doc, "results_number_errors")),
    )
    label = path.stem.removesuffix("_summary")
    return Run(label, str(doc.get("model") or "unknown"), "llmperf", (point,))


Parser = Callable[[dict[str, Any], _Reader, Path], Run]


def _detect(doc: Any, r: _Reader) -> Parser:
    if not isinstance(doc, dict):
        raise ResultFileError(f"{r.name}: is not a JSON object")
    if "benchmarks" in doc:
        return _guidellm
    if "output_throughput" in doc or "request_goodput:" in doc:
        return _vllm_bench
    if "output_token_throughput" in doc or "output_token_throughput" in (doc.get("records") or {}):
        return _profile_export
    if "num_concurrent_requests" in doc or "results_mean_output_throughput_token_per_s" in doc:
        return _llmperf
    raise ResultFileError(
        f"{r.name}: is not a result of vllm bench serve, GuideLLM, AIPerf, GenAI-Perf or LLMPerf "
        "(none of their fields 'output_throughput', 'benchmarks', 'output_token_throughput', "
        "'num_concurrent_requests' is there)"
    )


def read(path: str | Path) -> list[Run]:
    """The runs in one result file, or ResultFileError naming the file and field."""
    path = Path(path)
    reader = _Reader(path)
    return [_detect(doc, reader)(doc, reader, path) for doc in _documents(path, reader)]


def read_all(paths: list[str | Path]) -> tuple[list[Run], list[str]]:
    """Every good file's runs, merged by label and model, and one sentence per refused file
    (nothing of a refused file is kept)."""
    found: list[Run] = []
    refused: list[str] = []
    for path in paths:
        try:
            found.extend(read(path))
        except ResultFileError as error:
            refused.append(str(error))
    return group(found), refused
