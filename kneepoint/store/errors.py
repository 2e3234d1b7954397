"""Storage errors in one line: what a log or a stored error says when the database fails.

SQLAlchemy's message for a failed statement carries the SQL and its parameters (a target's
URL, a channel's payload); what kneepoint logs and stores is only the driver's own first
line, such as "OperationalError: database is locked" or "database or disk is full"."""

from __future__ import annotations

from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from kneepoint.secrets import scrub


class StorageError(RuntimeError):
    """A job's database work failed; the message is describe()'s one line."""


def is_storage_error(error: BaseException) -> bool:
    return isinstance(error, SQLAlchemyError | StorageError)


def describe(error: BaseException) -> str:
    """`Type: first line` of an error, the driver's own for a database error, with every
    secret of the config masked (kneepoint/secrets.py) before it is cut."""
    if isinstance(error, DBAPIError) and error.orig is not None:
        error = error.orig
    lines = scrub(str(error)).strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:300] if lines else ''}".rstrip(": ")
