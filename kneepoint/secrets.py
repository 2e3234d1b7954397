"""Secrets in the config, and URLs as they may be shown.

A `Secret` holds a value that must never be printed: a token, a signing secret, a header's
value. The value comes out only through `.reveal()`, called where it is sent or connected
with; `str()`, `repr()`, f-strings, pydantic's `model_dump()` / `model_dump_json()` and the
repr of any model holding one give a mask instead. Two kinds of URL are secrets too, and
print as `redact_url` shows them:

- `SecretURL` (targets, the Prometheus source, the database): the path is shown, the user
  info and every query value are masked, and the token parts of known webhook URLs are
  masked wherever they turn up.
- `HookURL` (channels, the heartbeat): the path is the credential, so only
  `scheme://host[:port]/…` is shown.

Every Secret made is also remembered, so `scrub(text)` can take a secret's value (and its
parts: a URL's password, query values and long path segments, a bearer token) out of text
written by someone else, such as an exception's message from httpx or a driver, a
platform's answer, a log line: what kneepoint stores, logs and prints goes through it.
"""

from __future__ import annotations

import hmac
import logging
import re
import threading
from collections.abc import Mapping
from typing import Any, ClassVar
from urllib.parse import unquote, urlsplit

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

MASK = "***"
HIDDEN = "…"  # what stands for a hidden path
SHORTEST = 6  # parts of a secret shorter than this are not scrubbed from text on their own
LONG_SEGMENT = 16  # a hook URL's path segments this long are scrubbed on their own

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
# Token parts of the chat platforms' webhook URLs, masked even where a path is shown:
# (host suffix or "" for any host, the path's regular expression; group 1 is kept).
_TOKEN_PATHS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("slack.com", re.compile(r"^(/services/).+")),  # Slack: /services/T…/B…/token
    ("", re.compile(r"^(/api/webhooks/).+")),  # Discord: /api/webhooks/<id>/<token>
    ("", re.compile(r"^(/bot)\d+:[^/]+")),  # Telegram: /bot<token>/sendMessage
    ("", re.compile(r"^(/open-apis/bot/v2/hook/).+")),  # Feishu and Lark
    ("office.com", re.compile(r"^(/).+")),  # Teams: webhook.office.com/webhookb2/…
    ("logic.azure.com", re.compile(r"^(/).+")),  # Teams workflows (and their sig= query)
    ("powerplatform.com", re.compile(r"^(/).+")),  # Teams workflows, newer hosts
)


def redact_url(url: str, *, path: bool = True) -> str:
    """`url` as it may be shown. With `path` (targets, Prometheus, the database): the user
    info masked (`***@`), every query value masked (`?key=***`), the fragment hidden, the
    path kept but a known webhook's token part masked. Without (channels, the heartbeat):
    only `scheme://host[:port]/…`. Never raises: an unparsable URL shows only its scheme."""
    try:
        parts = urlsplit(url)
    except ValueError:  # an odd bracket: nothing of it is trusted to be harmless
        scheme = _SCHEME.match(url)
        return f"{scheme.group(1)}://{HIDDEN}" if scheme else HIDDEN
    if not parts.scheme:
        return HIDDEN
    netloc = parts.netloc
    _, at, hostport = netloc.rpartition("@")
    host, colon, port = hostport, "", ""
    if not hostport.endswith("]") and ":" in hostport:
        host, colon, port = hostport.rpartition(":")
        if not port.isdigit():
            port = MASK  # not a port: maybe a token typed in its place
    shown = f"{parts.scheme}://" + (f"{MASK}@" if at else "") + f"{host}{colon}{port}"
    if not path:  # the path, the query and the fragment are the credential
        return shown + (f"/{HIDDEN}" if parts.path not in ("", "/") or parts.query else "")
    shown += _masked_path(host.lower(), parts.path)
    if parts.query:
        shown += "?" + "&".join(_masked_pair(pair) for pair in parts.query.split("&"))
    if parts.fragment:
        shown += "#" + HIDDEN
    return shown


def _masked_path(host: str, path: str) -> str:
    for suffix, pattern in _TOKEN_PATHS:
        if suffix and not (host == suffix or host.endswith("." + suffix)):
            continue
        match = pattern.match(path)
        if match:
            return match.group(1) + HIDDEN + (_after_bot(path) if match.group(1) == "/bot" else "")
    return path


def _after_bot(path: str) -> str:
    """What follows a Telegram token in the path (`/sendMessage`)."""
    rest = path.split("/", 2)
    return "/" + rest[2] if len(rest) > 2 else ""


def _masked_pair(pair: str) -> str:
    key, equals, _ = pair.partition("=")
    return f"{key}={MASK}" if equals else (MASK if pair else "")


class Secret:
    """A config value that is never shown: `.reveal()` gives it, and nothing else does."""

    __slots__ = ("__value",)

    def __init__(self, value: str, *, remember: bool = True) -> None:
        """`remember`: `scrub` takes the value out of any text from now on (False for a
        short-lived one, such as a signed request's URL, that `scrub` is given itself)."""
        if not isinstance(value, str):
            raise TypeError(f"a {type(self).__name__} holds a string, not {type(value).__name__}")
        self.__value = value
        if remember:
            _remember(self)

    def reveal(self) -> str:
        """The value itself: only where it is sent or connected with, never to print."""
        return self.__value

    def __str__(self) -> str:
        return MASK

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secret) or type(self) is not type(other):
            return NotImplemented
        return hmac.compare_digest(self.__value.encode(), other.__value.encode())

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.__value))

    def __bool__(self) -> bool:
        return bool(self.__value)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.__value,))

    def parts(self) -> dict[str, str]:
        """Text to take out of messages (the value and its parts), each with what replaces it."""
        value = self.__value
        found = {value: str(self)}
        scheme, _, token = value.partition(" ")  # "Bearer <token>", "Basic <credentials>"
        if scheme and token:
            found[token.strip()] = MASK
        return found

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        from_text = core_schema.no_info_after_validator_function(cls, core_schema.str_schema())

        def unwrap(value: object) -> object:  # a Secret given in Python code: made anew
            return value.reveal() if isinstance(value, Secret) else value

        return core_schema.json_or_python_schema(
            json_schema=from_text,
            python_schema=core_schema.no_info_before_validator_function(unwrap, from_text),
            serialization=core_schema.plain_serializer_function_ser_schema(
                _serialized, info_arg=True
            ),
        )


def _serialized(value: Secret, info: core_schema.SerializationInfo) -> Secret | str:
    """model_dump(): the Secret itself (its repr masks it); JSON: its mask or redacted URL."""
    return str(value) if info.mode_is_json() else value


class SecretURL(Secret):
    """A URL that may carry credentials (user info, a query token): shown with them masked,
    its path kept (targets, the Prometheus source, the database)."""

    __slots__ = ()
    path_shown: ClassVar[bool] = True

    def __str__(self) -> str:
        return redact_url(self.reveal(), path=self.path_shown)

    def parts(self) -> dict[str, str]:
        value, shown = self.reveal(), str(self)
        found = {value: shown}
        try:
            import httpx

            found[str(httpx.URL(value))] = shown  # as httpx writes it in its errors
        except Exception:  # not a URL httpx takes: its raw form is enough
            pass
        try:
            split = urlsplit(value)
            password, username = split.password, split.username
        except ValueError:
            return found
        userinfo = split.netloc.rpartition("@")[0]
        pieces = [userinfo, password or "", "" if password else username or ""]
        for pair in split.query.split("&"):
            pieces.append(pair.partition("=")[2])
        if not self.path_shown:
            pieces.append(split.path)
            pieces += [s for s in split.path.split("/") if len(s) >= LONG_SEGMENT]
            pieces += [s.removeprefix("bot") for s in split.path.split("/") if s.startswith("bot")]
        for piece in pieces:
            for form in (piece, unquote(piece)):
                if len(form) >= SHORTEST:
                    found.setdefault(form, MASK)
        return found


class HookURL(SecretURL):
    """A URL whose path (or query) is the credential: a chat webhook, a heartbeat check.
    Shown as `scheme://host[:port]/…`."""

    __slots__ = ()
    path_shown: ClassVar[bool] = False


_known: dict[str, str] = {}
_known_lock = threading.Lock()


def _remember(secret: Secret) -> None:
    found = {text: shown for text, shown in secret.parts().items() if text != shown}
    with _known_lock:
        for text, shown in found.items():
            if len(text) >= SHORTEST or (text == secret.reveal() and len(text) >= 4):
                _known.setdefault(text, shown)


def forget_all() -> None:
    """Forget every remembered secret (tests: one test's secrets must not mask another's
    output; a process that loads a new config keeps the old secrets masked, by design)."""
    with _known_lock:
        _known.clear()


def scrub(text: str, *also: Secret) -> str:
    """`text` with every known secret (every Secret made in this process, and `also`) and
    its parts replaced by their masks: for messages that others wrote (an exception's, a
    platform's answer) before kneepoint stores, logs or prints them."""
    with _known_lock:
        pairs = dict(_known)
    for secret in also:
        pairs.update(secret.parts())
    for secret_text in sorted(pairs, key=len, reverse=True):
        if secret_text and secret_text in text:
            text = text.replace(secret_text, pairs[secret_text])
    return text


def reveal(value: str | Secret) -> str:
    """A value that may be a Secret, as text to connect with (a database URL given either
    way: the store takes both)."""
    return value.reveal() if isinstance(value, Secret) else value


def revealed(headers: Mapping[str, Secret | str]) -> dict[str, str]:
    """Headers with their values revealed, to hand to the HTTP client."""
    return {name: reveal(value) for name, value in headers.items()}


class ScrubbingFormatter(logging.Formatter):
    """A log formatter whose every line (its traceback included) goes through `scrub`."""

    def format(self, record: logging.LogRecord) -> str:
        return scrub(super().format(record))


class _ScrubbedRecord(logging.LogRecord):
    """A log record whose message goes through `scrub` however a handler formats it."""

    def getMessage(self) -> str:
        return scrub(super().getMessage())


_records_scrubbed = False


def scrub_log_records() -> None:
    """Make every log record this process makes from now on carry its message, traceback and
    stack scrubbed, whichever logger, handler or formatter writes it. A formatter on the
    root logger is not enough where libraries log through handlers of their own that do not
    propagate (Streamlit gives each of its loggers, uvicorn's too, its own stderr handler).
    Idempotent: the app's script calls it on every run."""
    global _records_scrubbed
    with _known_lock:
        if _records_scrubbed:
            return
        _records_scrubbed = True
    made = logging.getLogRecordFactory()

    def scrubbed(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = made(*args, **kwargs)
        if type(record) is logging.LogRecord:
            record.__class__ = _ScrubbedRecord
        if record.exc_info and not record.exc_text:
            # Formatters format a traceback only when exc_text is empty: give them it scrubbed.
            record.exc_text = scrub(logging.Formatter().formatException(record.exc_info))
        if record.stack_info:
            record.stack_info = scrub(record.stack_info)
        return record

    logging.setLogRecordFactory(scrubbed)


def guard_logging() -> None:
    """Make the process's log lines go through `scrub`: every record (`scrub_log_records`),
    and when the root logger has no handler (a command line process), a stderr handler at
    WARNING, which prints what Python prints without any logging set up, scrubbed. A
    process that set up its own logging keeps its handlers."""
    scrub_log_records()
    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler()
    handler.setLevel(logging.WARNING)
    handler.setFormatter(ScrubbingFormatter())
    root.addHandler(handler)
