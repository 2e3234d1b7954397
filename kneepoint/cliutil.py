"""What every command shares: the --config option, one-sentence failures, the store."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Annotated, Final, Literal, NoReturn

import typer
from rich.console import Console
from sqlalchemy.orm import Session, sessionmaker

from kneepoint.config import Config, ConfigError, config_path, load_config
from kneepoint.secrets import Secret, guard_logging, redact_url, reveal, scrub

# Every Typer app's help is Markdown: paragraphs reflow to the terminal (Rich's own mode
# keeps a docstring's hard line breaks), code blocks hold examples, and the same text is
# the docs site's CLI reference (kneepoint/cli_reference.py) unchanged.
MARKUP: Final[Literal["markdown"]] = "markdown"

ConfigOption = Annotated[
    str | None, typer.Option("--config", help="kneepoint.yaml (else $KNEEPOINT_CONFIG).")
]


AtOption = Annotated[
    str | None,
    typer.Option(
        "--at",
        help="End of the window: ISO 8601 (2026-11-30T09:00Z) or Unix seconds; now if unset.",
    ),
]


def moment(at: str | None, now: float) -> float:
    """The --at option as Unix seconds (bad input: exit 2)."""
    if at is None:
        return now
    try:
        return float(at)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(at.replace("Z", "+00:00"))
    except ValueError:
        fail(f"--at: {at!r} is neither ISO 8601 nor Unix seconds", 2)
    if parsed.tzinfo is None:
        fail(f"--at: {at!r} needs a time zone (Z or +01:00)", 2)
    return parsed.timestamp()


def positive_duration(option: str, text: str) -> float:
    """A duration option (5m, 7d) in seconds; bad or not positive: exit 2 naming it."""
    from kneepoint.durations import parse_duration

    try:
        seconds = parse_duration(text)
    except ValueError as error:
        fail(f"{option}: {error}", 2)
    if seconds <= 0:
        fail(f"{option} must be positive", 2)
    return seconds


def fail(message: str, code: int = 1) -> NoReturn:
    """Say what went wrong in one sentence on stderr and exit: 2 for bad input, 1 else.
    A secret known to this process is masked in it (kneepoint/secrets.py `scrub`)."""
    Console(stderr=True, soft_wrap=True).print(
        f"kneepoint: {scrub(message)}", highlight=False, markup=False
    )
    raise typer.Exit(code)


# The config file this command loaded: what `kneepoint migrate --config …` must be given.
_loaded_from: Path | None = None


def load_settings(path: str | None) -> Config:
    global _loaded_from
    guard_logging()  # this process's log lines never show a secret of the config
    try:
        config = load_config(path)
    except ConfigError as error:
        fail(str(error), 2)
    _loaded_from = config_path(path)
    return config


def migrate_hint() -> str:
    """The command that brings this command's database to the schema it needs."""
    given = f" --config {_loaded_from}" if _loaded_from is not None else ""
    return f"kneepoint migrate{given}"


def open_sessions(config: Config) -> sessionmaker[Session]:
    """The store, without migrating it: behind (or missing), exit 2 saying what to run."""
    from kneepoint.store.db import SchemaError, connect_store

    try:
        return connect_store(config.database)
    except SchemaError as error:
        fail(f"{error}: run `{migrate_hint()}`", 2)
    except Exception as error:  # the URL, the file or the server is unusable: say which
        from kneepoint.store.errors import describe

        fail(f"cannot open database {shown_url(config.database)}: {describe(error)}", 1)


def shown_url(url: str | Secret) -> str:
    """A database URL as it may be shown: user info and query values masked."""
    return redact_url(reveal(url))
