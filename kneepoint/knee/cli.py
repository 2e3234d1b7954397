"""`kneepoint sweep`, `import`, `knee` and `compare`."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from kneepoint.cliutil import ConfigOption, fail, load_settings, open_sessions
from kneepoint.durations import parse_duration
from kneepoint.knee.detect import Assessment
from kneepoint.knee.runs import Point

# The commands import the sweep, the store and the importers when they run: this module
# loads with every `kneepoint` command, each a fresh process (tests/test_cli_start.py).


def _ladder(text: str) -> tuple[int, ...]:
    try:
        steps = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        fail(f"--concurrency must be a comma-separated list of integers, not {text!r}", 2)
    if not steps or min(steps) < 1:
        fail("--concurrency needs at least one step, each at least 1", 2)
    return tuple(sorted(set(steps)))


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value * 1000:.0f}"


def sweep(
    url: Annotated[str, typer.Option(help="The server's base URL, e.g. http://host:8000.")],
    model: Annotated[str, typer.Option(help="The served model name.")],
    concurrency: Annotated[str, typer.Option(help="The ladder.")] = "1,2,4,8,16,32,64,128",
    input_tokens: Annotated[int, typer.Option(help="Prompt tokens per request.")] = 256,
    output_tokens: Annotated[int, typer.Option(help="Output tokens per request.")] = 128,
    requests: Annotated[
        int | None, typer.Option(help="Requests per step (default 4 × concurrency, ≥ 8).")
    ] = None,
    duration: Annotated[str | None, typer.Option(help="Time per step instead, e.g. 60s.")] = None,
    label: Annotated[str | None, typer.Option(help="The run's label.")] = None,
    capture_metrics: Annotated[
        bool, typer.Option("--capture-metrics", help="Read URL/metrics around each step.")
    ] = False,
    metrics_url: Annotated[str | None, typer.Option(help="The server's /metrics URL.")] = None,
    ignore_eos: Annotated[bool, typer.Option(help="Ask for exactly --output-tokens.")] = True,
    config: ConfigOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the run and its knee.")] = False,
) -> None:
    """A concurrency sweep against an OpenAI-compatible server, saved as a labelled run.

    At each step of `--concurrency`, sends `--requests` requests (or keeps sending for
    `--duration`), measures throughput and latency, and prints the run with its knee and
    the recommended operating concurrency under the config's SLOs. Audited.

    Example:

    ```
    kneepoint sweep --url http://127.0.0.1:8000 --model Qwen/Qwen3-4B --concurrency 1,4,16,64
    ```
    """
    from kneepoint.knee.detect import assess
    from kneepoint.knee.sweep import CLIENT_SATURATED_CORES, SweepSettings
    from kneepoint.knee.sweep import sweep as run_sweep
    from kneepoint.store.runs import save_run

    settings = load_settings(config)
    sessions = open_sessions(settings)
    if input_tokens < 1 or output_tokens < 1:
        fail("--input-tokens and --output-tokens must be at least 1", 2)
    if requests is not None and requests < 1:
        fail("--requests must be at least 1", 2)
    try:
        seconds = parse_duration(duration) if duration else None
    except ValueError as error:
        fail(f"--duration: {error}", 2)
    if metrics_url is None and capture_metrics:
        metrics_url = url.rstrip("/").removesuffix("/v1") + "/metrics"
    options = SweepSettings(
        url=url,
        model=model,
        ladder=_ladder(concurrency),
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        requests_per_step=requests,
        duration=seconds,
        ignore_eos=ignore_eos,
        metrics_url=metrics_url,
    )
    label = label or f"sweep-{datetime.now(UTC):%Y%m%d-%H%M%S}"
    err = Console(stderr=True)
    with Progress(
        TextColumn("concurrency {task.fields[step]:>4}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        console=err,
        transient=False,
    ) as progress:
        current: dict[str, TaskID] = {}

        def on_step(step: int, total: int | None) -> None:
            current["task"] = progress.add_task("", total=total, step=step, status="")

        def on_request(_outcome: object) -> None:
            progress.advance(current["task"])

        def on_point(p: Point) -> None:
            status = (
                f"{p.output_tokens_per_second:.0f} tok/s, TTFT p99 "
                f"{_ms(p.ttft_p99_seconds)} ms, {p.errors} errors"
            )
            progress.update(current["task"], status=status)
            cores = p.client_cpu_cores
            if cores is not None and cores >= CLIENT_SATURATED_CORES:
                progress.console.print(
                    f"warning: the load generator used {cores:.2f} CPU cores at concurrency "
                    f"{p.concurrency}: it may be the bottleneck, latencies there are suspect",
                    style="yellow",
                )

        try:
            run = run_sweep(
                options, label, on_step=on_step, on_request=on_request, on_point=on_point
            )
        except KeyboardInterrupt:
            fail("sweep interrupted; nothing stored", 1)
    total = sum(p.completed or 0 for p in run.points)
    if total == 0:
        said = next((p.first_error for p in run.points if p.first_error), None)
        fail(f"every request to {options.completions_url} failed ({said}); nothing stored", 1)
    from kneepoint import audit
    from kneepoint.auth import local_identity

    with sessions.begin() as session:  # the run and its audit entry commit together
        save_run(session, run, time.time())
        change = audit.Change(
            f"run {run.label}",
            after={"model": run.model, "concurrency": [p.concurrency for p in run.points]},
        )
        audit.record(session, local_identity(), "run.sweep", "done", change, time.time())
    assessment = assess(run, settings.slos)
    if as_json:
        typer.echo(json.dumps(assessment.as_dict(), indent=2))
        return
    _print_runs([assessment])


def import_results(
    files: Annotated[list[str], typer.Argument(help="Result files to import.")],
    label: Annotated[str | None, typer.Option(help="Label every imported run so.")] = None,
    config: ConfigOption = None,
) -> None:
    """Import result files of vllm bench serve, GuideLLM, AIPerf/GenAI-Perf or LLMPerf.

    Each file becomes a labelled run, or steps of one, for `kneepoint knee` and `kneepoint
    compare`. The files that can be read are stored; each one that cannot is named, and
    the exit status is 2. Audited.

    Example:

    ```
    kneepoint import results/*.json --label qwen-a-knee
    ```
    """
    from kneepoint.knee.imports import read_all
    from kneepoint.knee.runs import group
    from kneepoint.store.runs import save_run

    settings = load_settings(config)
    sessions = open_sessions(settings)
    merged, bad = read_all(list(files))
    if label:
        merged = group([replace(run, label=label) for run in merged])
    from kneepoint import audit
    from kneepoint.auth import local_identity

    with sessions.begin() as session:
        for run in merged:
            save_run(session, run, time.time())
        change = audit.Change(", ".join(files)[:200], after={"stored": [r.label for r in merged]})
        audit.record(session, local_identity(), "run.import", "done", change, time.time())
    for run in merged:
        steps = ", ".join(str(p.concurrency) for p in run.points)
        typer.echo(f"imported {run.label} ({run.source}, {run.model}): concurrency {steps}")
    if bad:
        fail("; ".join(bad) + ("" if len(bad) == 1 else f" ({len(bad)} files not imported)"), 2)


def knee(
    run: Annotated[str | None, typer.Option("--run", help="Only this run's label.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the JSON contract.")] = False,
    config: ConfigOption = None,
) -> None:
    """Knee and recommended operating concurrency per run, held to the configured SLOs.

    Every stored run, or only `--run`; `--json` prints the contract
    (docs/reference/json.md)."""
    from kneepoint.knee.detect import assess
    from kneepoint.store.runs import RunNotFound, load_run, load_runs

    settings = load_settings(config)
    sessions = open_sessions(settings)
    with sessions() as session:
        try:
            runs = [load_run(session, run)] if run else load_runs(session)
        except RunNotFound as error:
            fail(str(error), 2)
    assessments = [assess(r, settings.slos) for r in runs]
    if as_json:
        typer.echo(json.dumps({"runs": [a.as_dict() for a in assessments]}, indent=2))
        return
    if not assessments:
        typer.echo("no runs yet: `kneepoint sweep` or `kneepoint import` makes one")
        return
    _print_runs(assessments)


def _print_runs(assessments: list[Assessment]) -> None:
    for a in assessments:
        table = Table(
            title=(
                f"{a.run.label} ({a.run.source}, {a.run.model}): knee "
                f"{a.knee_concurrency or '–'}, recommended {a.recommended_concurrency or '–'}"
                + (f", held by {a.limiting_slo}" if a.limiting_slo else "")
            )
        )
        for column in ("concurrency", "output tok/s", "TTFT p99 ms", "ITL p99 ms", "errors"):
            table.add_column(column, justify="right")
        for p in a.run.points:
            mark = " ◆" if p.concurrency == a.knee_concurrency else ""
            table.add_row(
                f"{p.concurrency}{mark}",
                f"{p.output_tokens_per_second:.1f}",
                _ms(p.ttft_p99_seconds),
                _ms(p.itl_p99_seconds),
                "–" if p.errors is None else str(p.errors),
            )
        Console().print(table)


def compare(
    baseline: Annotated[str, typer.Argument(help="The baseline run's label.")],
    candidate: Annotated[str, typer.Argument(help="The candidate run's label.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    config: ConfigOption = None,
) -> None:
    """Step-by-step comparison of two runs with a verdict: change one flag at a time.

    Compares the concurrency steps the two runs share: throughput ratio, TTFT change and a
    verdict per step, and one overall.

    Example:

    ```
    kneepoint compare baseline fp8-kv-cache
    ```
    """
    from kneepoint.knee.compare import compare as compare_runs
    from kneepoint.store.runs import RunNotFound, load_run

    settings = load_settings(config)
    sessions = open_sessions(settings)
    with sessions() as session:
        try:
            result = compare_runs(load_run(session, baseline), load_run(session, candidate))
        except RunNotFound as error:
            fail(str(error), 2)
    if not result.steps:
        fail(f"{baseline} and {candidate} share no concurrency step to compare", 2)
    if as_json:
        typer.echo(json.dumps(result.as_dict(), indent=2))
        return
    table = Table(title=f"{candidate} against {baseline}: {result.verdict}")
    for column in (
        "concurrency",
        "baseline tok/s",
        "candidate tok/s",
        "ratio",
        "TTFT p99",
        "verdict",
    ):
        table.add_column(column, justify="right")
    for s in result.steps:
        table.add_row(
            str(s.concurrency),
            f"{s.baseline_output_tokens_per_second:.1f}",
            f"{s.candidate_output_tokens_per_second:.1f}",
            "–" if s.ratio is None else f"{s.ratio:.2f}×",
            "–" if s.ttft_change is None else f"{s.ttft_change:+.0%}",
            s.verdict,
        )
    Console().print(table)


def register(app: typer.Typer) -> None:
    app.command()(sweep)
    app.command("import")(import_results)
    app.command()(knee)
    app.command()(compare)
