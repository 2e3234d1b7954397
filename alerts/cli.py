"""`kneepoint alerts eval`, `kneepoint alerts list` and the others, and `kneepoint slo replay`."""

from __future__ import annotations

import contextlib
import json
import time
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from sqlalchemy import select

from kneepoint import clock
from kneepoint.cliutil import MARKUP, ConfigOption, fail, load_settings, open_sessions
from kneepoint.config import Config, ConfigError, Rule

# The commands import the kernel (the evaluation, the store's queries, pandas) when they run:
# this module loads with every `kneepoint` command, each a fresh process (tests/test_cli_start.py).
alerts_app = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=MARKUP,
    help="""Alert rules, their states and history.

    The rules are the built-in ones and the config's `rules:`. What to do when one fires:
    its runbook, on the Alerts page and in docs/reference/runbooks.md.""",
)


def _rules(settings: Config) -> list[Rule]:
    from alerts.rules import effective_rules

    try:
        return effective_rules(settings)
    except ConfigError as error:
        fail(str(error), 2)


def _when(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC).isoformat()


@alerts_app.command("eval")
def evaluate(
    config: ConfigOption = None,
    once: Annotated[bool, typer.Option("--once", help="Evaluate once and exit.")] = False,
) -> None:
    """Evaluate every rule on the stored data, once or every `evaluation_interval`.

    Prints each alert that changes state, then delivers the notifications that are due.
    The collector's leader does the same on its schedule (its alerts job)."""
    from alerts.evaluate import evaluate_once, slo_problems
    from alerts.outbox import deliver_due, http_sender

    settings = load_settings(config)
    _rules(settings)
    sessions = open_sessions(settings)

    with sessions() as session:
        for problem in slo_problems(session, settings, clock.system_clock()):
            typer.echo(f"warning: {problem}; its burn-rate alerts are off", err=True)

    def round_() -> None:
        with sessions.begin() as session:
            for change in evaluate_once(session, settings, clock.system_clock()):
                alert = change.alert
                seen = "no data" if alert.value is None else f"value {alert.value:.4g}"
                why = f"; {change.note}" if change.note else ""
                typer.echo(
                    f"{alert.rule} on {alert.replica or 'fleet'}: {change.before or 'inactive'}"
                    f" -> {change.after} ({seen}, threshold {alert.threshold:g}{why})"
                )
        with sessions() as session:
            counts = deliver_due(session, settings, clock.system_clock(), http_sender())
        if any(counts.values()):
            typer.echo("notifications: " + ", ".join(f"{n} {k}" for k, n in counts.items() if n))

    round_()
    if once:
        return
    with contextlib.suppress(KeyboardInterrupt):
        while True:
            time.sleep(settings.evaluation_interval)
            round_()


@alerts_app.command("test")
def test_channel(
    channel_name: Annotated[str, typer.Option("--channel", help="The channel's name.")],
    config: ConfigOption = None,
) -> None:
    """Send a test message to one channel now, through the outbox.

    Retried like any message: exits 1 when the channel refused it or it is not
    delivered yet. The Alerts page has the same button per channel. Audited.

    Example:

    ```
    kneepoint alerts test --channel oncall-slack
    ```
    """
    from alerts.outbox import send_trial

    settings = load_settings(config)
    if channel_name not in {c.name for c in settings.channels}:
        known = ", ".join(c.name for c in settings.channels) or "none configured"
        fail(f"--channel: no channel named {channel_name!r} (channels: {known})", 2)
    sessions = open_sessions(settings)
    state, error = send_trial(sessions, settings, channel_name, clock.system_clock())
    from kneepoint import audit
    from kneepoint.auth import local_identity

    with sessions.begin() as session:
        change = audit.Change(f"channel {channel_name}", after={"state": state})
        audit.record(
            session, local_identity(), "channel.test", "done", change, clock.system_clock()
        )
    if state == "sent":
        typer.echo(f"{channel_name}: delivered")
    elif state == "pending":
        fail(f"{channel_name}: not delivered yet, will retry ({error})", 1)
    else:
        fail(f"{channel_name}: refused ({error})", 1)


@alerts_app.command("export")
def export(
    format_: Annotated[
        str, typer.Option("--format", help="The rules' format: only prometheus.")
    ] = "prometheus",
    config: ConfigOption = None,
) -> None:
    """The rules as Prometheus recording and alerting rules (YAML on stdout).

    A rule Prometheus cannot express is left out, and named on stderr.

    Example:

    ```
    kneepoint alerts export > kneepoint-rules.yaml
    ```
    """
    from alerts.export import prometheus_rules

    if format_ != "prometheus":
        fail(f"--format: only prometheus is supported, not {format_!r}", 2)
    text, left_out = prometheus_rules(_rules(load_settings(config)))
    typer.echo(text, nl=False)
    for line in left_out:
        typer.echo(f"# left out: {line}", err=True)


@alerts_app.command("list")
def list_alerts(
    config: ConfigOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Pending and firing alerts, and the rules in force.

    Also names each replica a rule cannot apply to, because its engine does not expose
    the rule's metric, and why."""
    from kneepoint.store.models import AlertRow

    settings = load_settings(config)
    rules = _rules(settings)
    sessions = open_sessions(settings)
    with sessions() as session:
        rows = session.scalars(
            select(AlertRow)
            .where(AlertRow.state.in_(["pending", "firing"]))
            .order_by(AlertRow.state, AlertRow.rule, AlertRow.replica)
        ).all()
        not_exposed = _not_exposed(session, rules, {t.name for t in settings.targets})
        alerts: list[dict[str, Any]] = [
            {
                "rule": row.rule,
                "replica": row.replica or None,
                "state": row.state,
                "value": row.value,
                "threshold": row.threshold,
                "pending_since": _when(row.pending_since),
                "fired_at": _when(row.fired_at),
                "fingerprint": row.fingerprint,
            }
            for row in rows
        ]
    if as_json:
        listed = [r.model_dump(by_alias=True) for r in rules]
        typer.echo(
            json.dumps({"alerts": alerts, "rules": listed, "not_exposed": not_exposed}, indent=2)
        )
        return
    table = Table(title=f"{len(alerts)} alerts pending or firing ({len(rules)} rules)")
    for column in ("state", "rule", "replica", "value", "threshold", "since"):
        table.add_column(column)
    for a in alerts:
        table.add_row(
            str(a["state"]),
            str(a["rule"]),
            str(a["replica"] or "fleet"),
            "–" if a["value"] is None else f"{a['value']:.4g}",
            f"{a['threshold']:g}",
            str(a["fired_at"] or a["pending_since"] or ""),
        )
    Console().print(table)
    for n in not_exposed:
        typer.echo(f"{n['rule']} does not apply to {n['replica']}: {n['reason']}")


def _not_exposed(session: Any, rules: list[Rule], names: set[str]) -> list[dict[str, str]]:
    """Each replica rule whose metric the replica's engine does not expose (as its latest
    scrape says: targets.unavailable), with the reason. Such a rule never pends or fires
    there, and never says "no data" (alerts.lifecycle.evaluate)."""
    from kneepoint.samples import unavailable_reason
    from kneepoint.store import queries

    out = []
    for name, row in queries.targets(session).items():
        if name not in names:  # a target no longer configured
            continue
        unavailable = json.loads(row.unavailable) if row.unavailable else {}
        for rule in rules:
            reason = unavailable_reason(unavailable, rule.metric)
            if rule.scope != "fleet" and reason is not None:
                out.append({"rule": rule.name, "replica": name, "reason": reason})
    return out


slo_app = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=MARKUP,
    help="""Service level objectives: try one out on the stored history.

    The configured SLOs (`slos:` in kneepoint.yaml) are on the SLOs page.""",
)


@slo_app.command("replay")
def replay(
    objective: Annotated[
        float,
        typer.Option("--objective", help="The objective in percent of requests (99.5).", min=0),
    ],
    threshold: Annotated[
        str | None,
        typer.Option("--threshold", help="A latency SLO's threshold (450ms, 2s)."),
    ] = None,
    window: Annotated[
        str, typer.Option("--window", help="How far back to replay, ending at --end (28d).")
    ] = "28d",
    metric: Annotated[
        str, typer.Option("--metric", help="A latency SLO's histogram: ttft, itl, e2e or queue.")
    ] = "ttft",
    kind: Annotated[
        str, typer.Option("--kind", help="latency, or availability (no threshold).")
    ] = "latency",
    end: Annotated[
        str | None,
        typer.Option("--end", help="End of the window: ISO 8601 or Unix seconds; now if unset."),
    ] = None,
    config: ConfigOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Would a proposed SLO have been met over the stored history?

    Prints its compliance, the error budget it would have spent and the burn-rate alerts that
    would have fired (evaluated every 5 minutes), beside each configured SLO of the same kind
    and metric over the same window. A threshold between two bucket bounds gets a range (the
    exact compliance at the bound below and above) and an interpolated estimate, labelled as
    such; its alerts are replayed at both bounds. See docs/how-to/replay-an-slo.md.

    Example:

    ```
    kneepoint slo replay --objective 99.5 --threshold 450ms --window 28d
    ```
    """
    from alerts.evaluate import slo_replay
    from alerts.slo_replay import replay_proposal, replayed_json
    from kneepoint.cliutil import moment, positive_duration

    if kind not in ("latency", "availability"):
        fail(f"--kind: latency or availability, not {kind!r}", 2)
    if kind == "latency" and threshold is None:
        fail("--threshold is required for a latency SLO (450ms)", 2)
    if kind == "availability" and threshold is not None:
        fail("--threshold: an availability SLO has none (it counts failed requests)", 2)
    span = positive_duration("--window", window)
    if threshold is not None:
        positive_duration("--threshold", threshold)
    try:
        proposal = replay_proposal(kind, metric, threshold, objective, window)
    except ValueError as error:
        fail(f"the proposed SLO is not valid: {error}", 2)
    settings = load_settings(config)
    until = moment(end, clock.system_clock())
    with open_sessions(settings)() as session:
        results = slo_replay(session, settings, proposal, until, span)
    if as_json:
        typer.echo(json.dumps({"replays": [replayed_json(r) for r in results]}, indent=2))
        return
    for r in results:
        typer.echo(_replay_text(replayed_json(r)))


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.3%}"


def _replay_text(r: dict[str, Any]) -> str:
    s = r["slo"]
    goal = (
        f"availability ≥ {s['objective']:.2%}"
        if s["kind"] == "availability"
        else f"{s['metric']} ≤ {s['threshold']:g} s for {s['objective']:.2%}"
    )
    label = "proposed" if r["role"] == "proposed" else f"configured {r['name']}"
    lines = [f"{label}: {goal}, {_when(r['start'])} to {_when(r['end'])}"]
    c, spent = r["compliance"], r["budget_spent"]
    if r["problem"]:
        lines.append(f"  cannot be judged: {r['problem']}")
    elif c["exact"] is not None:
        lines.append(f"  compliance {_pct(c['exact'])} (exact count)")
        lines.append(f"  error budget spent {_pct(spent['exact'])}")
    else:
        lines.append(
            f"  compliance between {_pct(c['at_lower_bound'])} (at {c['lower_bound']:g} s, "
            f"exact) and {_pct(c['at_upper_bound'])} (at {c['upper_bound']:g} s, exact): "
            f"the threshold is between two bucket bounds"
        )
        lines.append(
            f"  interpolated estimate {_pct(c['interpolated_estimate'])} (linear within the "
            "bucket; not a count)"
        )
        lines.append(
            f"  error budget spent between {_pct(spent['at_upper_bound'])} and "
            f"{_pct(spent['at_lower_bound'])}; interpolated estimate "
            f"{_pct(spent['interpolated_estimate'])}"
        )
    replayed = r["alerts_replayed"]
    for key, firings in (r["alerts"] or {}).items():
        where = (
            ""
            if key == "exact"
            else f" at the lower bound ({c['lower_bound']:g} s)"
            if key == "at_lower_bound"
            else f" at the upper bound ({c['upper_bound']:g} s)"
        )
        if not firings:
            lines.append(f"  burn-rate alerts{where}: none would have fired")
        for f in firings:
            until = _when(f["end"]) if f["end"] is not None else "the end (still firing)"
            lines.append(
                f"  burn-rate alert{where}: {f['severity']} {f['long_window']}/"
                f"{f['short_window']} (> {f['factor']:g}× budget) from {_when(f['start'])} "
                f"to {until}"
            )
    if replayed["from"] is None:
        lines.append("  burn-rate alerts: not replayed (no running sums in the window)")
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    app.add_typer(alerts_app, name="alerts")
    app.add_typer(slo_app, name="slo")
