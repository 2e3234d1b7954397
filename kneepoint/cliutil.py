"""What every command shares: the --config option, one-sentence failures, the store."""

from __future__ import annotations

from typing import Annotated, NoReturn

import typer
from rich.console import Console
from sqlalchemy.orm import Session, sessionmaker

from kneepoint.config import Config, ConfigError, load_config

ConfigOption = Annotated[
    str | None, typer.Option("--config", help="kneepoint.yaml (else $KNEEPOINT_CONFIG).")
]


def fail(message: str, code: int = 1) -> NoReturn:
    """Say what went wrong in one sentence on stderr and exit: 2 for bad input, 1 else."""
    Console(stderr=True, soft_wrap=True).print(
        f"kneepoint: {message}", highlight=False, markup=False
    )
    raise typer.Exit(code)


def load_settings(path: str | None) -> Config:
    try:
        return load_config(path)
    except ConfigError as error:
        fail(str(error), 2)


def open_sessions(config: Config) -> sessionmaker[Session]:
    from kneepoint.store.db import open_store

    try:
        return open_store(config.database)
    except Exception as error:  # the database URL or file is unusable: say which
        fail(f"cannot open database {config.database}: {error}", 1)
