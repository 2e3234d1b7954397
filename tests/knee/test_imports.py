"""Importing other load generators' result files, built here from each tool's schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kneepoint.cli import app
from kneepoint.knee.imports import ResultFileError, read
from kneepoint.store.db import open_store
from kneepoint.store.runs import load_runs
from tests.conftest import migrated


def vllm_bench(concurrency: int, output: float, **extra: Any) -> dict[str, Any]:
    """What `vllm bench serve --save-result` writes (0.32), without the per-request lists."""
    return {
        "date": "20261129-101500",
        "endpoint_type": "vllm",
        "backend": "vllm",
        "label": "bf16-baseline",
        "model_id": "Qwen/Qwen3-4B",
        "tokenizer_id": "Qwen/Qwen3-4B",
        "num_prompts": 4 * concurrency,
        "request_rate": "inf",
        "burstiness": 1.0,
        "max_concurrency": concurrency,
        "duration": 12.5,
        "completed": 4 * concurrency,
        "failed": 0,
        "total_input_tokens": 256 * 4 * concurrency,
        "total_output_tokens": 128 * 4 * concurrency,
        "request_throughput": output / 128,
        "request_goodput": None,
        "output_throughput": output,
        "total_token_throughput": output * 3,
        "mean_ttft_ms": 61.0,
        "median_ttft_ms": 60.0,
        "std_ttft_ms": 2.0,
        "p99_ttft_ms": 98.0,
        "mean_tpot_ms": 26.0,
        "median_tpot_ms": 26.0,
        "std_tpot_ms": 1.0,
        "p99_tpot_ms": 30.0,
        "mean_itl_ms": 26.0,
        "median_itl_ms": 25.5,
        "std_itl_ms": 1.5,
        "p99_itl_ms": 40.0,
        "errors": [""] * (4 * concurrency),
        **extra,
    }


def write(path: Path, content: Any) -> Path:
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def test_vllm_bench_one_file_per_concurrency(tmp_path: Path) -> None:
    runs = read(write(tmp_path / "c1.json", vllm_bench(1, 37.5)))
    assert len(runs) == 1
    run = runs[0]
    assert (run.label, run.model, run.source) == ("bf16-baseline", "Qwen/Qwen3-4B", "vllm-bench")
    (point,) = run.points
    assert point.concurrency == 1
    assert point.output_tokens_per_second == 37.5
    assert point.ttft_mean_seconds == pytest.approx(0.061)
    assert point.ttft_p99_seconds == pytest.approx(0.098)
    assert point.itl_p50_seconds == pytest.approx(0.0255)
    assert point.completed == 4 and point.errors == 0


def test_vllm_bench_appended_lines_old_goodput_key_and_acceptance_in_percent(
    tmp_path: Path,
) -> None:
    old = vllm_bench(16, 240.0, spec_decode_acceptance_rate=12.5, spec_decode_acceptance_length=1.4)
    del old["request_goodput"], old["failed"]
    old["request_goodput:"] = 1.25
    old["errors"] = ["", "timeout", ""]  # old releases: no "failed", the errors list
    lines = "\n".join(json.dumps(doc) for doc in (vllm_bench(1, 16.0), old)) + "\n"
    runs = read(write(tmp_path / "appended.jsonl", lines))
    assert [r.points[0].concurrency for r in runs] == [1, 16]
    spec = runs[1].points[0]
    assert spec.spec_acceptance_rate == pytest.approx(0.125)
    assert spec.spec_acceptance_length == pytest.approx(1.4)
    assert spec.errors == 1
    assert runs[1].notes == {"request_goodput": 1.25}


def guidellm_distribution(mean: float, p99: float) -> dict[str, Any]:
    stats = {"mean": mean, "median": mean, "percentiles": {"p90": p99 * 0.9, "p99": p99}}
    return {"successful": stats, "incomplete": stats, "errored": stats, "total": stats}


def guidellm_metrics(output: float, ttft_ms: float) -> dict[str, Any]:
    return {
        "request_totals": {"successful": 32, "incomplete": 0, "errored": 1, "total": 33},
        "requests_per_second": guidellm_distribution(output / 128, output / 128),
        "request_concurrency": guidellm_distribution(7.6, 8),
        "request_latency": guidellm_distribution(3.5, 4.0),
        "time_to_first_token_ms": guidellm_distribution(ttft_ms, ttft_ms * 1.5),
        "inter_token_latency_ms": guidellm_distribution(26.0, 40.0),
        "output_tokens_per_second": guidellm_distribution(output, output),
    }


def test_guidellm_report_with_strategy_under_args(tmp_path: Path) -> None:
    """The 0.2–0.3 layout: `args.strategy` and `worker.backend_model` per benchmark."""
    report = {
        "benchmarks": [
            {
                "type_": "generative_benchmark",
                "args": {"strategy": {"type_": "synchronous"}},
                "worker": {"backend_model": "Qwen/Qwen3-4B"},
                "metrics": guidellm_metrics(37.5, 61),
            },
            {
                "type_": "generative_benchmark",
                "args": {"strategy": {"type_": "concurrent", "streams": 32}},
                "worker": {"backend_model": "Qwen/Qwen3-4B"},
                "metrics": guidellm_metrics(714, 277),
            },
            {
                "type_": "generative_benchmark",
                "args": {"strategy": {"type_": "throughput", "max_concurrency": 512}},
                "worker": {"backend_model": "Qwen/Qwen3-4B"},
                "metrics": guidellm_metrics(800, 1300),  # held 7.6 in flight on average
            },
        ]
    }
    (run,) = read(write(tmp_path / "benchmarks.json", report))
    assert (run.label, run.model, run.source) == ("benchmarks", "Qwen/Qwen3-4B", "guidellm")
    assert [p.concurrency for p in run.points] == [1, 8, 32]
    at_32 = run.points[2]
    assert at_32.output_tokens_per_second == 714
    assert at_32.ttft_p99_seconds == pytest.approx(0.4155)
    assert at_32.errors == 1 and at_32.completed == 32
    assert at_32.e2e_p99_seconds == 4.0  # request_latency is in seconds already


def test_guidellm_report_with_strategy_under_config(tmp_path: Path) -> None:
    """The later layout: `config.strategy` per benchmark, the model in the report's args."""
    report = {
        "metadata": {"version": 1},
        "args": {"model": "Qwen/Qwen3-4B", "profile": "concurrent"},
        "benchmarks": [
            {
                "config": {"strategy": {"type_": "concurrent", "streams": c}},
                "metrics": guidellm_metrics(out, 100),
            }
            for c, out in ((1, 37.5), (32, 714), (64, 800))
        ],
    }
    (run,) = read(write(tmp_path / "guide.json", report))
    assert run.model == "Qwen/Qwen3-4B"
    assert [p.concurrency for p in run.points] == [1, 32, 64]


def profile_metric(unit: str, avg: float, p99: float | None = None) -> dict[str, Any]:
    out = {"unit": unit, "avg": avg, "p50": avg, "p90": avg, "min": avg, "max": avg}
    out["p99"] = avg if p99 is None else p99
    return out


def test_genai_perf_profile_export(tmp_path: Path) -> None:
    export = {
        "request_throughput": profile_metric("requests/sec", 5.5),
        "request_latency": profile_metric("ms", 5800.0),
        "time_to_first_token": profile_metric("ms", 277.0, 410.0),
        "inter_token_latency": profile_metric("ms", 43.0),
        "output_token_throughput": profile_metric("tokens/sec", 714.0),
        "input_config": {"model": ["Qwen/Qwen3-4B"], "concurrency": 32},
    }
    folder = tmp_path / "qwen3-4b-c32"
    folder.mkdir()
    (run,) = read(write(folder / "profile_export_genai_perf.json", export))
    assert (run.label, run.source, run.model) == ("qwen3-4b-c32", "genai-perf", "Qwen/Qwen3-4B")
    (point,) = run.points
    assert (point.concurrency, point.output_tokens_per_second) == (32, 714.0)
    assert point.ttft_p99_seconds == pytest.approx(0.41)
    assert point.e2e_mean_seconds == pytest.approx(5.8)


def test_aiperf_profile_export(tmp_path: Path) -> None:
    export = {
        "aiperf_version": "0.3.0",
        "records": {
            "output_token_throughput": profile_metric("tokens/sec", 800.0),
            "time_to_first_token": profile_metric("ns", 1.3e9),
            "inter_token_latency": profile_metric("ms", 60.0),
            "request_count": profile_metric("requests", 256),
        },
        "input_config": {
            "endpoint": {"model_names": ["Qwen/Qwen3-4B"]},
            "loadgen": {"concurrency": 64},
        },
    }
    (run,) = read(write(tmp_path / "aiperf-c64.json", export))
    assert (run.source, run.label) == ("aiperf", "aiperf-c64")
    (point,) = run.points
    assert point.concurrency == 64
    assert point.ttft_mean_seconds == pytest.approx(1.3)
    assert point.completed == 256


def test_llmperf_summary(tmp_path: Path) -> None:
    summary = {
        "model": "Qwen/Qwen3-4B",
        "num_concurrent_requests": 32,
        "results_mean_output_throughput_token_per_s": 714.0,
        "results_ttft_s_mean": 0.277,
        "results_ttft_s_quantiles_p99": 0.41,
        "results_inter_token_latency_s_mean": 0.043,
        "results_end_to_end_latency_s_quantiles_p99": 6.1,
        "results_num_completed_requests": 128,
        "results_num_completed_requests_per_min": 330.0,
        "results_number_errors": 2,
    }
    (run,) = read(write(tmp_path / "Qwen-Qwen3-4B_256_128_summary.json", summary))
    assert (run.label, run.source) == ("Qwen-Qwen3-4B_256_128", "llmperf")
    (point,) = run.points
    assert point.requests_per_second == pytest.approx(5.5)
    assert point.errors == 2 and point.e2e_p99_seconds == 6.1


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("{not json", "line 1 is not JSON"),
        ("", "is empty"),
        ("[1, 2]", "is not a JSON object"),
        ({"hello": 1}, "is not a result of vllm bench serve"),
        (
            {**vllm_bench(8, 1.0), "output_throughput": "fast"},
            "'output_throughput' must be a number",
        ),
        ({**vllm_bench(8, 1.0), "mean_ttft_ms": -3}, "'mean_ttft_ms' must be a finite number ≥ 0"),
        ({**vllm_bench(8, 1.0), "max_concurrency": None}, "'max_concurrency' is missing"),
        ({**vllm_bench(8, 1.0), "max_concurrency": 0}, "'max_concurrency' must be at least 1"),
        ({"benchmarks": []}, "'benchmarks' must be a non-empty list"),
        ({"benchmarks": [{"args": {}}]}, "'benchmarks[0].metrics' is missing"),
        ({"benchmarks": [{"metrics": {}}]}, "'benchmarks[0].metrics.output_tokens_per_second'"),
        (
            {"output_token_throughput": profile_metric("tokens/sec", 1.0)},
            "'input_config.concurrency' is missing",
        ),
        (
            {
                "output_token_throughput": profile_metric("tokens/sec", 1.0),
                "time_to_first_token": profile_metric("furlongs", 1.0),
                "input_config": {"concurrency": 2},
            },
            "'time_to_first_token.unit' must be a time unit",
        ),
        ({"num_concurrent_requests": 4}, "'results_mean_output_throughput_token_per_s' is missing"),
    ],
)
def test_a_bad_file_names_the_file_and_the_field(tmp_path: Path, content: Any, says: str) -> None:
    path = write(tmp_path / "result.json", content)
    with pytest.raises(ResultFileError) as caught:
        read(path)
    message = str(caught.value)
    assert message.startswith("result.json: ")
    assert says in message
    assert "\n" not in message


def test_import_stores_the_good_files_and_nothing_of_a_bad_one(tmp_path: Path) -> None:
    database = tmp_path / "k.db"
    config = migrated(write(tmp_path / "kneepoint.yaml", f"database: sqlite:///{database}\n"))
    good = [write(tmp_path / f"c{c}.json", vllm_bench(c, t)) for c, t in ((1, 37.5), (32, 714))]
    half_bad = write(
        tmp_path / "bad.jsonl",
        json.dumps({**vllm_bench(64, 800), "label": "bad-run"})
        + "\n"
        + json.dumps({**vllm_bench(128, 1.0), "label": "bad-run", "output_throughput": None}),
    )
    result = CliRunner().invoke(
        app, ["import", "--config", str(config), *map(str, good), str(half_bad)]
    )
    assert result.exit_code == 2, result.output
    assert "bad.jsonl: field 'output_throughput' is missing" in result.output
    assert "imported bf16-baseline (vllm-bench, Qwen/Qwen3-4B): concurrency 1, 32" in result.output
    runs = load_runs(open_store(f"sqlite:///{database}")())
    assert [r.label for r in runs] == ["bf16-baseline"]  # nothing of bad.jsonl, not its line 1

    # A third file with the same label and model adds its step to the same run.
    more = write(tmp_path / "c64.json", vllm_bench(64, 800))
    assert CliRunner().invoke(app, ["import", "--config", str(config), str(more)]).exit_code == 0
    knee = CliRunner().invoke(app, ["knee", "--json", "--config", str(config)])
    (run,) = json.loads(knee.output)["runs"]
    assert [p["concurrency"] for p in run["points"]] == [1, 32, 64]
    assert run["knee_concurrency"] == 32
    assert run["recommended_concurrency"] == 32
