"""The `kneepoint` command line. Errors: one sentence on stderr, exit 2 for bad input, 1 else.

Help texts are Markdown (`rich_markup_mode="markdown"`): a docstring's first paragraph is the
command's one-line summary in `kneepoint --help`, and its other paragraphs reflow to the
terminal's width, so they may be wrapped freely in the source. They name no source file:
users read the docs site (docs/reference/cli.md is generated from this tree by
kneepoint/cli_reference.py)."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from kneepoint.cliutil import (
    MARKUP,
    AtOption,
    ConfigOption,
    fail,
    load_settings,
    moment,
    open_sessions,
    positive_duration,
)
from kneepoint.clock import system_clock
from kneepoint.config import Config, ConfigError, config_path

if TYPE_CHECKING:
    from kneepoint.audit import Entry
    from kneepoint.records import Status

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=MARKUP,
    help="""Capacity and SLO monitoring for self-hosted LLM inference.

    Try it without a fleet: `kneepoint demo`. With one: write a kneepoint.yaml, then
    `kneepoint migrate`, `kneepoint serve`. `kneepoint COMMAND --help` says more about each
    command; the whole reference is docs/reference/cli.md.""",
)
HostOption = Annotated[
    str,
    typer.Option(
        help="Address the web app listens on. Not loopback: only with `auth:` in the config."
    ),
]


@app.command()
def collect(
    config: ConfigOption = None,
    once: Annotated[bool, typer.Option("--once", help="Scrape once and exit.")] = False,
) -> None:
    """Scrape every target into the store, once or on the schedule.

    Runs the collector's scheduled jobs (scrape, rollup, alerts, deliver, heartbeat,
    report) until Ctrl-C or SIGTERM; on either, the collector leaves the cluster, so the
    others take its targets at once. With `--once`, scrapes each target once, prints
    whether it was up and how long the scrape took, and exits.

    Examples:

    ```
    kneepoint collect --config kneepoint.yaml
    kneepoint collect --once
    ```
    """
    settings = load_settings(config)
    discovery_usable(settings)
    sessions = open_sessions(settings)
    if once:
        from collectors.jobs import collect_round
        from collectors.prometheus_api import PrometheusSourceError

        try:
            outcomes = collect_round(settings, sessions)
        except PrometheusSourceError as error:
            fail(str(error))
        for outcome in outcomes:
            state = "up" if outcome.ok else f"down: {outcome.error}"
            typer.echo(f"{outcome.target}: {state} ({outcome.seconds * 1000:.0f} ms)")
        return
    from collectors.jobs import install_collector
    from collectors.scheduler import StepSafeBlockingScheduler

    scheduler = StepSafeBlockingScheduler()
    cluster = install_collector(scheduler, settings, sessions, system_clock)
    source = f" from {settings.prometheus.url}" if settings.prometheus else ""
    typer.echo(
        f"collecting {len(settings.targets)} targets{source} every "
        f"{settings.scrape_interval:g}s into {settings.database} as collector {cluster.id}",
        err=True,
    )
    # SIGTERM (a service manager, Kubernetes) is a clean shutdown, like Ctrl-C: the
    # collector leaves the membership, so the others take its targets at once.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with contextlib.suppress(KeyboardInterrupt, SystemExit):
        try:
            scheduler.start()
        finally:
            if scheduler.running:
                scheduler.shutdown(wait=False)
            cluster.leave()


@app.command()
def migrate(config: ConfigOption = None) -> None:
    """Create the database or bring its schema up to date.

    The one command that migrates (under a lock on PostgreSQL, so two at once are safe).
    Run it before `collect` and `serve` the first time and after each upgrade of
    kneepoint: the other commands refuse a database whose schema is behind, and say so."""
    settings = load_settings(config)
    from kneepoint.cliutil import shown_url
    from kneepoint.store.db import make_engine
    from kneepoint.store.db import migrate as upgrade
    from kneepoint.store.errors import describe

    where = shown_url(settings.database)
    engine = None
    try:
        engine = make_engine(settings.database)
        before, after = upgrade(engine)
    except Exception as error:  # the URL, the file, the server: one sentence, exit 1
        fail(f"cannot migrate database {where}: {describe(error)}")
    finally:
        if engine is not None:
            engine.dispose()
    change = "already at" if before == after else f"migrated from {before or 'empty'} to"
    typer.echo(f"database {where}: {change} schema revision {after}")


@app.command()
def status(
    config: ConfigOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the JSON contract.")] = False,
    window: Annotated[str, typer.Option(help="Window for rates: 5m, 1h, …")] = "5m",
    at: AtOption = None,
) -> None:
    """The numbers per replica, fleet and GPU over a window.

    KV-cache occupancy, running and waiting requests, prompt and generation tokens per
    second and preemptions, per replica and for the fleet, over the `--window` that ends
    at `--at`. With `--json`, the whole contract, GPUs included (docs/reference/json.md).

    Examples:

    ```
    kneepoint status
    kneepoint status --window 1h --json
    ```
    """
    seconds = positive_duration("--window", window)
    settings = load_settings(config)
    sessions = open_sessions(settings)
    from collectors.discovery import current
    from kneepoint.status import build_status

    with sessions() as session:
        report = build_status(session, current(settings), moment(at, system_clock()), seconds)
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    _print_status(report)


def _print_status(report: Status) -> None:
    table = Table(title=f"kneepoint status, window {report['window_seconds']}s")
    for column in (
        "replica",
        "up",
        "engine",
        "KV occ.",
        "running",
        "waiting",
        "prompt tok/s",
        "gen tok/s",
        "preempt.",
    ):
        table.add_column(column)

    def show(value: object, fmt: str = "{:.0f}") -> str:
        return "–" if value is None else fmt.format(value)

    for r in [*report["replicas"], report["fleet"]]:
        table.add_row(
            r["name"],
            {True: "up", False: "DOWN", None: "?"}[r["up"]],
            " ".join(v for v in (r["engine"], r["engine_generation"]) if v) or "–",
            show(r["kv_cache_occupancy"], "{:.0%}"),
            show(r["requests_running"]),
            show(r["requests_waiting"]),
            show(r["prompt_tokens_per_second"], "{:.1f}"),
            show(r["generation_tokens_per_second"], "{:.1f}"),
            show(r["preemptions"]),
        )
    Console().print(table)
    for r in report["replicas"]:
        if r["last_error"]:
            Console().print(f"{r['name']}: {r['last_error']}", markup=False)
    for gone in report.get("gone", []):
        Console().print(f"{gone['name']}: gone since {gone['gone_since']}", markup=False)


def discovery_usable(settings: Config) -> None:
    """Exit 2 with the sentence saying why when discovery's kubeconfig (or service
    account) cannot be used: a collector must not start blind."""
    from collectors.discovery import check

    try:
        check(settings)
    except ConfigError as error:
        fail(str(error), 2)


@app.command()
def serve(
    config: ConfigOption = None,
    host: HostOption = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port of the web app.")] = 8501,
    no_browser: Annotated[
        bool, typer.Option("--no-browser", help="Do not open a browser on the app.")
    ] = False,
    no_collect: Annotated[
        bool, typer.Option("--no-collect", help="Only the app: another process collects.")
    ] = False,
    api_host: Annotated[
        str, typer.Option(help="Address of the annotation API (only with auth.api_tokens).")
    ] = "127.0.0.1",
    api_port: Annotated[int, typer.Option(help="Port of the annotation API.")] = 8502,
) -> None:
    """Run the collector and the web app; with `auth.api_tokens`, the annotation API too.

    The collector's scheduled jobs run in this process unless `--no-collect`: then another
    process collects into the same database (several app instances, one `kneepoint
    collect`). The app listens on loopback; another `--host` needs `auth:` in the config.

    With `auth.api_tokens` in the config, it also serves the annotation API on
    `--api-host` and `--api-port`: CI pipelines post what they changed to
    `/api/v1/annotations` with a bearer token, and read `/api/v1/timeline`.

    Examples:

    ```
    kneepoint serve --config kneepoint.yaml
    kneepoint serve --no-collect --host 0.0.0.0 --no-browser
    ```
    """
    from kneepoint.webapp import ListenRefused, browser_url, check_listen, run_app

    settings = load_settings(config)
    try:
        check_listen(host, settings)
    except ListenRefused as refused:
        fail(str(refused), 2)
    discovery_usable(settings)
    sessions = open_sessions(settings)
    file = config_path(config)
    if settings.auth is not None and settings.auth.api_tokens:
        from kneepoint.annotations import serve_api

        try:
            serve_api(settings, sessions, api_host, api_port)
        except OSError as error:
            fail(f"the annotation API cannot listen on {api_host}:{api_port}: {error}")
        typer.echo(f"annotation API on http://{api_host}:{api_port}/api/v1/", err=True)
    # Streamlit's own banner is off (kneepoint/webapp.py QUIET): this line says where.
    typer.echo(f"app on {browser_url(host, port)}", err=True)
    if no_collect:  # several app instances, one `kneepoint collect`, one shared database
        sys.exit(run_app(settings, file, host, port, open_browser=not no_browser))
    from collectors.jobs import install_collector
    from collectors.scheduler import StepSafeBackgroundScheduler

    scheduler = StepSafeBackgroundScheduler()
    cluster = install_collector(scheduler, settings, sessions, system_clock)
    scheduler.start()
    try:
        sys.exit(run_app(settings, file, host, port, open_browser=not no_browser))
    finally:
        scheduler.shutdown(wait=False)
        cluster.leave()


@app.command()
def report(
    config: ConfigOption = None,
    since: Annotated[
        str, typer.Option(help="The period: this long, against the one before.")
    ] = "7d",
    out: Annotated[str | None, typer.Option(help="Folder (default: report.output_dir).")] = None,
    at: AtOption = None,
) -> None:
    """The weekly capacity review: a self-contained HTML report and a Markdown summary.

    Compares the last `--since` with the period before it and writes both files, with
    the review's recommendations, to `--out` (default: the config's
    `report.output_dir`)."""
    seconds = positive_duration("--since", since)
    settings = load_settings(config)
    sessions = open_sessions(settings)
    from collectors.discovery import current
    from review.write import write_report

    with sessions() as session:
        written, page, summary = write_report(
            session,
            current(settings),
            moment(at, system_clock()),
            seconds,
            Path(out or settings.report.output_dir),
        )
    typer.echo(f"report:  {page}\nsummary: {summary}")
    typer.echo(f"{len(written.recommendations)} recommendations")


@app.command()
def health(
    config: ConfigOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    this_host: Annotated[
        bool,
        typer.Option(
            "--this-host",
            help="Judge only the collector on this host: healthy while it beats (a pod's "
            "liveness probe; the jobs are the whole cluster's).",
        ),
    ] = False,
) -> None:
    """The collector's jobs, the collectors and the database; exit 1 when unhealthy.

    Every scheduled job recorded (scrape, rollup, alerts, deliver, heartbeat, report):
    its last run, success and error, and whether it is failing or overdue; then the
    collectors (live or gone) and which one leads. Exits 1 when any job is failing or
    overdue, the scrape job never ran, or the database does not answer: a container's
    health check.

    With `--this-host`, exits 1 only when the database does not answer or no live
    collector runs on this host (hostname): the probe of one collector among several,
    which must not fail (and be restarted) because a job on the leader fails; the
    cluster's jobs are watched by the `alert-pipeline-failing` rule and the heartbeat.

    Examples:

    ```
    kneepoint health
    kneepoint health --this-host
    ```
    """
    settings = load_settings(config)
    sessions = open_sessions(settings)
    from kneepoint.health import check_database, check_jobs, collectors

    now = system_clock()
    database = check_database(sessions)
    checks = []
    members: list[dict] = []
    leader = None
    if database is None:
        with sessions() as session:
            checks = check_jobs(session, settings, now)
            members, leader = collectors(session, settings, now)
    problems = [f"{c.job}: {c.problem}" for c in checks if c.problem]
    if this_host:
        import socket

        host = socket.gethostname()
        problems = (
            []
            if any(m["live"] and m["host"] == host for m in members)
            else [f"no live collector on this host ({host})"]
        )
    if database is not None:
        problems.insert(0, f"database: {database}")
    healthy = not problems
    if as_json:
        jobs = [
            {
                "job": c.job,
                "ok": c.ok,
                "problem": c.problem,
                "every_seconds": c.every,
                "last_run_at": c.last_run_at,
                "last_success_at": c.last_success_at,
                "last_error": c.last_error,
                "runs": c.runs,
                "failures": c.failures,
            }
            for c in checks
        ]
        report = {
            "healthy": healthy,
            "database": {"ok": database is None, "error": database},
            "jobs": jobs,
            "collectors": members,
            "leader": leader,
        }
        typer.echo(json.dumps(report, indent=2))
    else:
        typer.echo("database: ok" if database is None else f"database: {database}")
        for c in checks:
            ago = "never" if c.last_success_at is None else f"{now - c.last_success_at:.0f}s ago"
            error = f" (last error: {c.last_error})" if c.last_error else ""
            state = "ok" if c.ok else c.problem
            typer.echo(
                f"{c.job}: {state}; last success {ago}, {c.runs} runs, {c.failures} failed{error}"
            )
        for m in members:
            role = "leader" if m["leader"] else ("live" if m["live"] else "gone")
            held = "?" if m["targets"] is None else m["targets"]
            typer.echo(
                f"collector {m['id']} on {m['host']} (pid {m['pid']}): {role}, {held} targets, "
                f"seen {m['seen_seconds_ago']:.0f}s ago"
            )
        typer.echo("healthy" if healthy else "unhealthy: " + "; ".join(problems))
    if not healthy:
        raise typer.Exit(1)


@app.command()
def capacity(
    model_config: Annotated[
        str | None, typer.Option(help="A model's config.json (Hugging Face).")
    ] = None,
    profile: Annotated[
        str | None, typer.Option(help="A built-in model: qwen3-4b, llama-3.1-8b or qwen3-32b.")
    ] = None,
    layers: Annotated[int | None, typer.Option(help="Transformer layers.")] = None,
    kv_heads: Annotated[int | None, typer.Option(help="KV heads (GQA groups).")] = None,
    head_dim: Annotated[int | None, typer.Option(help="Dimension per head.")] = None,
    kv_dtype: Annotated[str, typer.Option(help="fp16, bf16 or fp8.")] = "fp16",
    context: Annotated[int, typer.Option(help="Tokens per sequence.")] = 131072,
    kv_memory_gib: Annotated[float | None, typer.Option(help="KV cache size, if known.")] = None,
    gpu_memory_gib: Annotated[float | None, typer.Option(help="Memory per GPU.")] = None,
    weights_gib: Annotated[float, typer.Option(help="Model weights, all GPUs together.")] = 0.0,
    gpu_memory_utilization: Annotated[float, typer.Option(help="vLLM's share of memory.")] = 0.9,
    tensor_parallel: Annotated[int, typer.Option(help="GPUs per replica.")] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """The KV-cache planner: bytes per token, tokens and sequences that fit, what-ifs.

    Give the model's shape one way: `--model-config`, `--profile`, or `--layers`,
    `--kv-heads` and `--head-dim`. Then the KV cache's size: `--kv-memory-gib` if known,
    else `--gpu-memory-gib` and `--weights-gib`. Each what-if turns one knob: an FP8 KV
    cache, half or a quarter of the context, twice the GPUs. Needs no config or store.

    Examples:

    ```
    kneepoint capacity --profile llama-3.1-8b --gpu-memory-gib 80 --weights-gib 16
    kneepoint capacity --model-config config.json --kv-memory-gib 20 --context 32768
    ```
    """
    from kneepoint.derived.capacity import Plan, shape_from_config, what_ifs
    from kneepoint.twin.profiles import model

    try:
        if model_config:
            layers, kv_heads, head_dim = shape_from_config(model_config)
        elif profile:
            named = model(profile)
            layers, kv_heads, head_dim = named.layers, named.kv_heads, named.head_dim
        if layers is None or kv_heads is None or head_dim is None:
            fail("give --model-config, --profile, or --layers, --kv-heads and --head-dim", 2)
        plan = Plan(
            layers,
            kv_heads,
            head_dim,
            kv_dtype,
            context,
            kv_memory_gib,
            gpu_memory_gib,
            weights_gib,
            gpu_memory_utilization,
            tensor_parallel,
        )
    except ValueError as error:
        fail(str(error), 2)
    result = {**plan.result(), "what_ifs": what_ifs(plan)}
    if as_json:
        typer.echo(json.dumps(result, indent=2))
        return
    table = Table(title=f"KV cache: {plan.bytes_per_token / 1024:g} KiB per token")
    for column in ("scenario", "KiB/token", "GiB/sequence", "KV tokens", "sequences"):
        table.add_column(column)
    for name, row in result["what_ifs"].items():
        table.add_row(
            name,
            f"{row['bytes_per_token'] / 1024:g}",
            f"{row['sequence_gib']:.2f}",
            f"{row['kv_tokens']:,}",
            f"{row['max_sequences']:.2f}",
        )
    Console().print(table)


@app.command()
def timeline(
    config: ConfigOption = None,
    since: Annotated[str, typer.Option(help="How far back: 1h, 1d, 7d, …")] = "1h",
    replica: Annotated[
        str | None, typer.Option(help="Only this replica's events (and the fleet's).")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print a JSON list: at (ISO), replica, kind, detail.")
    ] = False,
    at: AtOption = None,
) -> None:
    """What changed, oldest first: restarts, upgrades, GPU events, outages, alerts, deploys.

    Restarts, configuration changes and upgrades, GPU events (XID, throttling, power
    capping, a GPU gone), scrape outages, hit-rate drops, prefill storms, alerts firing and
    resolving, silences and annotations, found in the data kneepoint already stores. The
    Timeline page lists the same, and every chart marks them.

    Examples:

    ```
    kneepoint timeline --since 1d --replica qwen-a
    kneepoint timeline --since 7d --json
    ```
    """
    seconds = positive_duration("--since", since)
    settings = load_settings(config)
    sessions = open_sessions(settings)
    from collectors.discovery import current
    from kneepoint.timeline import events

    until = moment(at, system_clock())
    with sessions() as session:
        found = events(session, current(settings), until - seconds, until, replica)
    if as_json:
        typer.echo(json.dumps([event.as_dict() for event in found], indent=2))
        return
    if not found:
        typer.echo(f"no change in the last {since}")
        return
    table = Table("at (UTC)", "replica", "kind", "detail")
    for event in found:
        table.add_row(event.as_dict()["at"], event.replica or "fleet", event.kind, event.detail)
    Console(width=160).print(table)


@app.command()
def annotate(
    text: Annotated[str, typer.Option(help='What changed, e.g. "prompt v42".')],
    config: ConfigOption = None,
    replica: Annotated[
        str | None, typer.Option(help="The replica it concerns (unset: the whole fleet).")
    ] = None,
    at: Annotated[
        str | None,
        typer.Option(help="When: ISO 8601 (2026-11-30T09:00Z) or Unix seconds; now if unset."),
    ] = None,
) -> None:
    """Mark a change made outside kneepoint (a deploy, a prompt version) on the timeline.

    The mark shows on the Timeline page and on every chart, and the audit trail records it.
    Without `--replica`, it concerns the whole fleet. CI pipelines post the same over HTTP:
    the annotation API that `kneepoint serve` starts when the config has `auth.api_tokens`
    (`POST /api/v1/annotations`, with a bearer token).

    Examples:

    ```
    kneepoint annotate --replica qwen-a --text "prompt v42"
    kneepoint annotate --text "router v3" --at 2026-11-30T09:00Z
    ```
    """
    settings = load_settings(config)
    sessions = open_sessions(settings)
    from kneepoint.annotations import Invalid
    from kneepoint.annotations import annotate as add
    from kneepoint.auth import local_identity

    now = system_clock()
    try:
        row = add(sessions.begin, local_identity(), text, replica, moment(at, now), now)
    except Invalid as error:
        fail(str(error), 2)
    typer.echo(f"annotation {row.id} on {replica or 'the fleet'}")


@app.command()
def audit(
    config: ConfigOption = None,
    since: Annotated[str, typer.Option(help="How far back: 1h, 7d, 400d, …")] = "7d",
    limit: Annotated[int, typer.Option(min=1, help="At most this many, the newest.")] = 1000,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the entries as a JSON list.")
    ] = False,
) -> None:
    """The audit trail, newest first: who changed what, from where, before and after.

    Every change made through the app or the command line (silences, test messages, runs
    imported and deleted, reports sent), every sign-in and every refusal: who, with which
    role, from where, what, before and after. Kept for the config's `retention.audit`."""
    seconds = positive_duration("--since", since)
    settings = load_settings(config)
    sessions = open_sessions(settings)
    from kneepoint.audit import entries

    with sessions() as session:
        found = entries(session, system_clock() - seconds, limit)
    if as_json:
        typer.echo(json.dumps([entry.as_dict() for entry in found], indent=2))
        return
    _print_audit(found, since, limit)


def _print_audit(found: list[Entry], since: str, limit: int) -> None:
    from datetime import UTC, datetime

    from rich.text import Text

    if not found:
        typer.echo(f"nothing recorded in the last {since}")
        return
    newest = f", the newest {limit}" if len(found) == limit else ""
    table = Table(title=f"audit trail, last {since}{newest}, newest first")
    for column in ("time (UTC)", "actor", "role", "via", "from", "action", "outcome", "subject"):
        table.add_column(column)
    table.add_column("before → after / why")

    def shown(value: object) -> str:
        return "–" if value is None else json.dumps(value, sort_keys=True, default=str)

    for entry in found:
        change = entry.detail
        if entry.before is not None or entry.after is not None:
            change = f"{shown(entry.before)} → {shown(entry.after)}" + (
                f"; {entry.detail}" if entry.detail else ""
            )
        cells = (
            datetime.fromtimestamp(entry.ts, UTC).strftime("%Y-%m-%d %H:%M:%S"),
            entry.actor,
            entry.role or "–",
            entry.via,
            entry.address or "–",
            entry.action,
            entry.outcome,
            entry.subject,
            change,
        )
        table.add_row(*(Text(cell) for cell in cells))  # Text: typed values are not markup
    Console().print(table, highlight=False)


@app.command()
def demo(
    folder: Annotated[
        str | None, typer.Option("--dir", help="Keep config and database here.")
    ] = None,
    host: HostOption = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port of the web app.")] = 8501,
    no_browser: Annotated[
        bool, typer.Option("--no-browser", help="Do not open a browser on the app.")
    ] = False,
    rules_file: Annotated[
        str | None,
        typer.Option(
            "--rules",
            help="A YAML file whose `rules:` (as in kneepoint.yaml) are added to the demo's.",
        ),
    ] = None,
) -> None:
    """The embedded default: a simulated fleet with a week of history, traffic and the app.

    Needs no config and no GPU: simulated replicas (the fleet twin) serve agent traffic, a
    week of history is backfilled, and the collector and the app run on them until Ctrl-C.
    The config and the database go to a temporary folder, or to `--dir` to keep them.

    Examples:

    ```
    kneepoint demo
    kneepoint demo --dir ./demo --rules my-rules.yaml
    ```
    """
    import yaml

    from kneepoint.demo import run_demo
    from kneepoint.webapp import ListenRefused

    rules = None
    if rules_file is not None:
        try:
            loaded = yaml.safe_load(Path(rules_file).read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as error:
            fail(f"--rules {rules_file}: cannot be read as YAML ({type(error).__name__})", 2)
        if not isinstance(loaded, dict) or not isinstance(loaded.get("rules"), list):
            fail(f"--rules {rules_file}: expected a `rules:` list, as in kneepoint.yaml", 2)
        rules = loaded["rules"]
    try:
        status = run_demo(
            Path(folder) if folder else None, host, port, not no_browser, typer.echo, rules
        )
    except ListenRefused as refused:
        fail(str(refused), 2)
    except ConfigError as error:  # a rule from --rules that does not validate
        fail(str(error), 2)
    raise typer.Exit(status)


@app.command()
def simulate(
    gpu_key: Annotated[
        str, typer.Option("--gpu", help="The GPU: rtx4000ada, l4, a100-80gb, h100-80gb, h200.")
    ] = "rtx4000ada",
    model_key: Annotated[
        str, typer.Option("--model", help="The model: qwen3-4b, llama-3.1-8b, qwen3-32b.")
    ] = "qwen3-4b",
    port: Annotated[
        int, typer.Option(help="Port of the replica (OpenAI API and /metrics).")
    ] = 8100,
    dcgm_port: Annotated[int, typer.Option(help="Port of its dcgm-exporter twin.")] = 9400,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    vllm_version: Annotated[
        str, typer.Option(help="Metric names of vLLM 0.32, 0.10, 0.8 or 0.5.")
    ] = "0.32",
    max_num_seqs: Annotated[int, typer.Option(help="vLLM's --max-num-seqs.")] = 256,
    fp8_weights: Annotated[bool, typer.Option("--fp8-weights", help="FP8 weights.")] = False,
    fp8_kv_cache: Annotated[bool, typer.Option("--fp8-kv-cache", help="An FP8 KV cache.")] = False,
    spec_tokens: Annotated[int, typer.Option(help="Speculative tokens per step (0: off).")] = 0,
    spec_acceptance: Annotated[float, typer.Option(help="Drafter acceptance rate.")] = 0.7,
    fleet: Annotated[str | None, typer.Option(help="A fleet YAML instead of one replica.")] = None,
) -> None:
    """Serve simulated vLLM replicas and dcgm-exporters (the fleet twin) over HTTP.

    One replica from `--gpu`, `--model` and the vLLM flags, or a whole fleet from
    `--fleet`. Each replica answers the OpenAI API, `/metrics` and `/health`, each GPU node
    a dcgm-exporter's `/metrics`, until Ctrl-C or SIGTERM: point a kneepoint.yaml at them.

    Examples:

    ```
    kneepoint simulate --gpu l4 --model qwen3-4b --port 8100
    kneepoint simulate --fleet fleet.yaml
    ```
    """
    import threading

    from kneepoint.twin.fleet import Fleet, load_fleet, single_replica

    try:
        if fleet:
            spec = load_fleet(fleet)
        else:
            extra: dict[str, object] = {
                "vllm_version": vllm_version,
                "max_num_seqs": max_num_seqs,
                "fp8_weights": fp8_weights,
                "fp8_kv_cache": fp8_kv_cache,
            }
            if spec_tokens:
                extra["speculative"] = {"tokens": spec_tokens, "acceptance": spec_acceptance}
            spec = single_replica(gpu_key, model_key, port, dcgm_port, host, **extra)
        running = Fleet(spec).start()
    except ConfigError as error:
        fail(str(error), 2)
    except (OSError, ValueError) as error:
        fail(str(error), 1)
    for name in running.replicas:
        typer.echo(f"replica {name}: {running.url(name)}  (OpenAI API, /metrics, /health)")
    for name in running.nodes:
        typer.echo(f"GPU node {name}: {running.url(name)}/metrics  (dcgm-exporter)")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        running.stop()


@app.command()
def calibrate(
    replica: Annotated[str, typer.Option(help="The replica to calibrate.")],
    run: Annotated[
        str | None,
        typer.Option(help="The knee run's label (default: the replica's newest, or its model's)."),
    ] = None,
    since: Annotated[str, typer.Option(help="Production history to fit too: 1d, 7d, …")] = "7d",
    max_num_seqs: Annotated[
        int | None, typer.Option(help="The replica's --max-num-seqs (default: vLLM's 256).")
    ] = None,
    max_model_len: Annotated[
        int | None, typer.Option(help="The replica's --max-model-len (default: 32768).")
    ] = None,
    max_num_batched_tokens: Annotated[
        int | None,
        typer.Option(
            help="The replica's --max-num-batched-tokens (default: the target's "
            "max_num_batched_tokens, else vLLM's 2048)."
        ),
    ] = None,
    config: ConfigOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the profile as JSON.")] = False,
    at: AtOption = None,
) -> None:
    """Fit the twin's step-time model to a replica, store it and show its fit quality.

    Fits to the replica's knee run (`--run`) and its production history (`--since`), and
    prints the fitted terms and, per point, measured against fitted. A fit that predicts
    nothing is stored but marked not trusted. `kneepoint whatif` replays through it; how
    the fit works: docs/explanation/whatif.md. Audited.

    Examples:

    ```
    kneepoint calibrate --replica qwen-a
    kneepoint calibrate --replica qwen-a --run qwen-a-knee --max-num-seqs 128
    ```
    """
    seconds = positive_duration("--since", since)
    settings = load_settings(config)
    sessions = open_sessions(settings)
    from collectors.discovery import current
    from kneepoint import audit
    from kneepoint.auth import local_identity
    from kneepoint.whatif import WhatIfError
    from kneepoint.whatif.predict import calibrate_replica
    from kneepoint.whatif.profile import cost_dict
    from kneepoint.whatif.store import save_profile
    from review.effects import number

    now = moment(at, system_clock())
    try:
        # Audited as the app's calibration is: the entry commits with the profile, and a
        # calibration that fails is recorded as failed with why.
        with audit.mutation(
            sessions.begin,
            local_identity(),
            "operator",
            "whatif.calibrate",
            f"replica {replica}",
            system_clock(),
        ) as (session, change):
            profile = calibrate_replica(
                session,
                current(settings),
                replica,
                run,
                now - seconds,
                now,
                now,
                max_num_seqs,
                max_model_len,
                max_num_batched_tokens,
            )
            stored = save_profile(session, profile)
            change.after = {
                "run": profile.run_label,
                "trusted": profile.fit.trusted,
                "rms_relative_error": number(profile.fit.rms),
            }
    except (WhatIfError, ValueError) as error:  # ValueError: the twin refuses the shape
        fail(str(error), 2)
    if as_json:
        typer.echo(json.dumps({"id": stored, **profile.as_dict()}, indent=2))
        return
    fit = profile.fit
    verdict = "trusted" if fit.trusted else "NOT TRUSTED: it predicts nothing"
    typer.echo(
        f"{replica}: calibrated from {profile.run_label or 'history'} ({verdict}; {fit.reason})"
    )
    terms = Table("term", "seconds")
    for name, value in cost_dict(profile.cost).items():
        terms.add_row(name, f"{value:.3g}")
    Console().print(terms)
    points = Table("source", "load", "metric", "measured", "fitted", "error")
    for point in fit.points:
        points.add_row(
            point.source,
            f"{point.load:g}",
            point.metric,
            f"{point.measured:.4g}",
            f"{point.fitted:.4g}",
            f"{point.relative_error:+.1%}",
        )
    Console().print(points)


@app.command()
def whatif(
    replica: Annotated[str, typer.Option(help="The replica whose window to replay.")],
    changes: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="A change, KEY=VALUE: kv_cache_dtype, max_num_seqs, max_model_len, "
            "gpu_memory_utilization, num_speculative_tokens, enable_prefix_caching, gpu, "
            "replicas, routing, growth, … (docs/explanation/whatif.md). Repeatable.",
        ),
    ] = None,
    since: Annotated[str, typer.Option(help="The window to replay: 1d, 7d, …")] = "7d",
    slice_seconds: Annotated[
        float,
        typer.Option(
            "--slice",
            min=1.0,
            max=900.0,
            help="Virtual seconds simulated per stored 15-minute bucket (more: closer, slower).",
        ),
    ] = 20.0,
    config: ConfigOption = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the JSON contract (docs/reference/json.md).")
    ] = False,
    at: AtOption = None,
) -> None:
    """Replay a replica's window through its calibrated twin, with and without a change.

    Prints the measured numbers, the baseline (the twin unchanged) and the prediction
    (with the change), with the predicted range. Calibrate the replica first
    (`kneepoint calibrate`). Every change, and every approximation the replay makes:
    docs/explanation/whatif.md.

    Examples:

    ```
    kneepoint whatif --replica qwen-a --set kv_cache_dtype=fp8
    kneepoint whatif --replica qwen-a --set max_num_seqs=128 --set replicas=3 --json
    ```
    """
    seconds = positive_duration("--since", since)
    if not changes:
        fail("give at least one change: --set KEY=VALUE (docs/explanation/whatif.md)", 2)
    from kneepoint.whatif import WhatIfError, parse_changes

    try:
        change = parse_changes(changes)
    except WhatIfError as error:
        fail(str(error), 2)
    settings = load_settings(config)
    sessions = open_sessions(settings)
    from collectors.discovery import current
    from kneepoint.whatif.predict import SHOWN, whatif_replica

    try:
        with sessions() as session:
            end = moment(at, system_clock())
            result = whatif_replica(
                session,
                current(settings),
                replica,
                change,
                end - seconds,
                end,
                slice_seconds=slice_seconds,
            )
    except (WhatIfError, ValueError) as error:  # ValueError: the twin refuses the change
        fail(str(error), 2)
    report = result.as_dict()
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    shown = ", ".join(f"{k}={v}" for k, v in report["change"].items())
    table = Table("", "measured", "baseline", "predicted", "predicted range", title=shown)
    for key in SHOWN:
        bounds = report["predicted"].get("bounds", {}).get(key)
        table.add_row(
            key,
            *(
                _whatif_number(report[side].get(key))
                for side in ("measured", "baseline", "predicted")
            ),
            "–" if not bounds else f"{_whatif_number(bounds[0])} – {_whatif_number(bounds[1])}",
        )
    Console(width=140).print(table)
    checked = report["validation"]
    if not checked["validated"]:
        typer.echo("Outside the validated range: " + "; ".join(checked["reasons"]) + ".")


def _whatif_number(value: object) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


export_app = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=MARKUP,
    help="kneepoint's views for other tools: Grafana dashboards.",
)
app.add_typer(export_app, name="export")


@export_app.command("grafana")
def export_grafana(
    out: Annotated[
        Path, typer.Option("--out", help="Folder for the dashboards' JSON files (created).")
    ],
    config: ConfigOption = None,
) -> None:
    """Grafana dashboards (overview, capacity, prefix cache, SLOs) as JSON files.

    The dashboards read the recording rules that `kneepoint alerts export` writes for the
    same config: load those into Prometheus too.

    Example:

    ```
    kneepoint export grafana --out dashboards/ --config kneepoint.yaml
    ```
    """
    from alerts.export import prometheus_rules
    from alerts.grafana import dashboards, recorded_metrics
    from alerts.rules import effective_rules

    settings = load_settings(config)
    try:
        rules_file, _ = prometheus_rules(effective_rules(settings))
    except ConfigError as error:
        fail(str(error), 2)
    boards = dashboards(recorded_metrics(rules_file), settings.slos)
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, board in boards.items():
            (out / name).write_text(json.dumps(board, indent=2) + "\n", encoding="utf-8")
    except OSError as error:
        fail(f"cannot write the dashboards to {out}: {error.strerror or error}", 1)
    for name in boards:
        typer.echo(out / name)


from alerts.cli import register as _register_alerts  # noqa: E402 (needs `app`)
from kneepoint.knee.cli import register as _register_knee  # noqa: E402

_register_knee(app)
_register_alerts(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
