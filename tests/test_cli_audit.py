"""Every command that changes the store on a person's behalf leaves an audit entry, as the
app's actions do: actor `cli:<user>` (the OS user), role admin, via `cli`.

Every command of `kneepoint` is in exactly one table below, so a new command fails
`test_every_command_is_classified` until someone says whether it writes. Each read-only one
is run against a real store and must leave every table as it was; each writing one must add
its audit entry in the same run."""

from __future__ import annotations

import getpass
import hashlib
import json
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import MetaData, create_engine, func, select
from typer.testing import CliRunner

from kneepoint.cli import app
from kneepoint.config import load_config
from kneepoint.twin.fleet import Fleet, single_replica
from tests.whatif.conftest import REPLICA, stored_day  # noqa: F401 (a fixture)

pytestmark = pytest.mark.timeout(900)
SPEED = 50.0  # the sweep's twin runs this much faster than real time


@dataclass
class Store:
    config: Path
    folder: Path
    now: float
    database: str
    twin: str  # an OpenAI-compatible server to sweep


# The commands that change the store, with their arguments and the audit action they leave.
WRITES: dict[str, tuple[Callable[[Store], list[str]], str]] = {
    "calibrate": (
        lambda s: ["--replica", REPLICA, "--since", "1d", "--at", str(s.now)],
        "whatif.calibrate",
    ),
    "sweep": (
        lambda s: [
            *("--url", s.twin, "--model", "Qwen/Qwen3-4B", "--concurrency", "1"),
            *("--requests", "2", "--output-tokens", "8", "--label", "audited-sweep"),
        ],
        "run.sweep",
    ),
    "import": (lambda s: [str(bench_result(s.folder))], "run.import"),
    "annotate": (lambda s: ["--text", "prompt v42"], "annotation.create"),
    "alerts test": (lambda s: ["--channel", "nowhere"], "channel.test"),
}
# The commands that only read the store (they may write files elsewhere).
READS: dict[str, Callable[[Store], list[str]]] = {
    "status": lambda s: [],
    "health": lambda s: [],
    "timeline": lambda s: [],
    "audit": lambda s: [],
    "knee": lambda s: [],
    "compare": lambda s: [f"{REPLICA}-sweep", f"{REPLICA}-sweep"],
    "whatif": lambda s: [
        *("--replica", REPLICA, "--set", "kv_cache_dtype=fp8"),
        *("--since", "1h", "--at", str(s.now), "--slice", "5"),
    ],
    "report": lambda s: ["--since", "1h", "--at", str(s.now), "--out", str(s.folder / "r")],
    "alerts list": lambda s: [],
    "slo replay": lambda s: [
        *("--objective", "99", "--threshold", "250ms", "--window", "1h", "--end", str(s.now))
    ],
    "alerts export": lambda s: [],
    "export grafana": lambda s: ["--out", str(s.folder / "grafana")],
}
# Not audited, and why.
EXEMPT = {
    "collect": "the collector's own work: samples scraped, not a change a person chose",
    "alerts eval": "the evaluator's own work (the scheduler's job, run by hand)",
    "migrate": "the schema, not the data; run on every deploy, it would fill the trail",
    "serve": "a server: what people do through it is audited by app/actions.py",
    "demo": "a server on a store of its own making",
    "simulate": "a server of simulated replicas; no store",
    "capacity": "sizing from the model's and the GPU's figures; no store",
}


def commands() -> set[str]:
    """Every leaf command of `kneepoint`, as typed: `alerts test`, `export grafana`."""
    import typer.main

    def walk(command: Any, prefix: str) -> Iterator[str]:
        subcommands = getattr(command, "commands", None)
        if subcommands is None:
            yield prefix
            return
        for name, sub in subcommands.items():
            yield from walk(sub, f"{prefix} {name}".strip())

    return set(walk(typer.main.get_command(app), ""))


def bench_result(folder: Path) -> Path:
    result = folder / "bench.json"
    result.write_text(
        json.dumps({"label": "cli", "model_id": "m", "max_concurrency": 4, "output_throughput": 9})
    )
    return result


def digest(database: str) -> dict[str, str]:
    """Each table's row count, and the rows themselves hashed where there are few (alert
    states, runs, profiles, the outbox): what a read-only command must leave as it was.
    The sample tables are only counted: hashing a day of samples per command is slow."""
    engine = create_engine(database)
    try:
        metadata = MetaData()
        metadata.reflect(engine)
        hashes = {}
        with engine.connect() as connection:
            for table in metadata.sorted_tables:
                count = connection.scalar(select(func.count()).select_from(table))
                if count is not None and count <= 5000:
                    rows = connection.execute(select(table)).all()
                    text = "\n".join(sorted(repr(tuple(row)) for row in rows))
                    hashes[table.name] = hashlib.sha256(text.encode()).hexdigest()
                else:
                    hashes[table.name] = f"{count} rows"
        return hashes
    finally:
        engine.dispose()


def audit_entries(config: Path) -> list[dict[str, Any]]:
    shown = CliRunner().invoke(app, ["audit", "--json", "--config", str(config)])
    assert shown.exit_code == 0, shown.output
    return list(json.loads(shown.output))


@pytest.fixture(scope="module")
def store(
    stored_day: tuple[Path, float],  # noqa: F811 (the fixture imported above)
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Store]:
    """A copy of the what-if day (a twin replica's stored day and its sweep), calibrated,
    with a channel nobody answers, and a twin to sweep."""
    config_file, now = stored_day
    folder = tmp_path_factory.mktemp("cli-audit")
    shutil.copytree(config_file.parent, folder, dirs_exist_ok=True)
    config = folder / config_file.name
    text = config.read_text().replace(str(config_file.parent), str(folder))
    config.write_text(
        text + "channels:\n  - {name: nowhere, type: webhook, url: 'http://127.0.0.1:9/h'}\n"
    )
    calibrated = CliRunner().invoke(  # what `whatif` replays through
        app,
        [
            "calibrate",
            "--replica",
            REPLICA,
            "--since",
            "1d",
            "--at",
            str(now),
            "--config",
            str(config),
        ],
    )
    assert calibrated.exit_code == 0, calibrated.output
    spec = single_replica("rtx4000ada", "qwen3-4b", 0, 0)
    fleet = Fleet(spec.model_copy(update={"speed": SPEED})).start()
    try:
        yield Store(
            config, folder, now, str(load_config(config).database.reveal()), fleet.url("qwen3-4b")
        )
    finally:
        fleet.stop()


def test_every_command_is_classified() -> None:
    """A new command must be put in WRITES (and audited), READS or EXEMPT (with why)."""
    classified = set(WRITES) | set(READS) | set(EXEMPT)
    assert len(classified) == len(WRITES) + len(READS) + len(EXEMPT)  # in one table only
    assert commands() == classified


@pytest.mark.parametrize("command", sorted(READS))
def test_a_read_only_command_leaves_the_store_as_it_was(store: Store, command: str) -> None:
    before = digest(store.database)
    args = [*command.split(), *READS[command](store), "--config", str(store.config)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code in (0, 1), result.output  # health: 1 when a job is unhealthy
    assert digest(store.database) == before, f"`kneepoint {command}` wrote to the store"


@pytest.mark.parametrize("command", sorted(WRITES))
def test_a_writing_command_leaves_its_audit_entry(store: Store, command: str) -> None:
    arguments, action = WRITES[command]
    before = {entry["id"] for entry in audit_entries(store.config)}
    stored = digest(store.database)
    started = time.time()
    args = [*command.split(), *arguments(store), "--config", str(store.config)]
    result = CliRunner().invoke(app, args)
    # alerts test: 1 when nobody answered (the message stays queued); still a change.
    assert result.exit_code in ((0, 1) if command == "alerts test" else (0,)), result.output
    changed = {name for name, value in digest(store.database).items() if stored.get(name) != value}
    assert changed - {"audit"}, f"`kneepoint {command}` changed nothing but the audit trail"
    new = [entry for entry in audit_entries(store.config) if entry["id"] not in before]
    assert [(e["action"], e["outcome"]) for e in new] == [(action, "done")], new
    (entry,) = new
    assert (entry["actor"], entry["role"], entry["via"]) == (
        f"cli:{getpass.getuser()}",
        "admin",
        "cli",
    )
    assert entry["ts"] >= started - 1  # when it was done, not the --at it was given
