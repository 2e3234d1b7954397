"""MkDocs hook: fills docs/reference/configuration.md from the configuration's own model
(`kneepoint.config.Config`: every key, its type and default) and the example file
`examples/kneepoint.yaml`, so the reference cannot drift from what the loader accepts."""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

PAGE = "reference/configuration.md"
KEYS = "<!-- generated: kneepoint.config.Config -->"
EXAMPLE = "<!-- generated: examples/kneepoint.yaml -->"
# Values never shown in full (logs, errors, pages): say so rather than name the class.
SECRET_TYPES = {
    "SecretURL": "URL (its password masked when shown)",
    "HookURL": "URL (never shown whole)",
    "Secret": "str (never shown)",
}
SECONDS_PER = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))


def _is_duration(info: FieldInfo) -> bool:
    return any(
        getattr(m, "func", None).__name__ == "parse_duration"
        for m in info.metadata
        if getattr(m, "func", None) is not None
    )


def _duration(seconds: float) -> str:
    for unit, size in SECONDS_PER:
        if seconds and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The models an annotation holds (a model, a list or dict of them, an optional one)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def _type(annotation: Any, duration: bool) -> str:
    if duration:
        return "duration"
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin is typing.Annotated:
        validators = [getattr(m, "func", None) for m in annotation.__metadata__]
        held = any(getattr(f, "__name__", "") == "parse_duration" for f in validators)
        return _type(args[0], held)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type(a, False) for a in args if a is not type(None))
    if origin is list:
        return f"list of {_type(args[0], False)}"
    if origin is dict:
        return f"map of {_type(args[0], False)} → {_type(args[1], False)}"
    if getattr(annotation, "__name__", None) in SECRET_TYPES:
        return SECRET_TYPES[annotation.__name__]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"[{annotation.__name__}](#{annotation.__name__.lower()})"
    return getattr(annotation, "__name__", str(annotation))


def _default(info: FieldInfo, duration: bool) -> str:
    if info.is_required():
        return "required"
    value = info.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "its defaults"
    if value is None or value == [] or value == {}:
        return "–"
    if duration and isinstance(value, int | float):
        return f"`{_duration(value)}`"
    shown = value.masked() if hasattr(value, "masked") else value
    return f"`{shown}`" if shown != "" else '`""`'


def _section(model: type[BaseModel], where: str) -> list[str]:
    lines = [f"### {model.__name__}", "", f"Under `{where}`." if where else "The top level."]
    doc = (model.__doc__ or "").strip()
    if doc and model.__doc__ is not BaseModel.__doc__:
        lines += ["", " ".join(doc.split())]
    lines += ["", "| key | type | default |", "|---|---|---|"]
    for name, info in model.model_fields.items():
        key = info.alias or name
        duration = _is_duration(info) or _type(info.annotation, False).startswith("duration")
        lines.append(
            f"| `{key}` | {_type(info.annotation, duration)} | {_default(info, duration)} |"
        )
    return [*lines, ""]


def reference() -> str:
    from kneepoint.config import Config

    seen: dict[type[BaseModel], str] = {}
    queue: list[tuple[type[BaseModel], str]] = [(Config, "")]
    while queue:
        model, where = queue.pop(0)
        if model in seen:
            continue
        seen[model] = where
        for name, info in model.model_fields.items():
            key = f"{where}.{info.alias or name}" if where else (info.alias or name)
            queue += [(sub, key) for sub in _models(info.annotation)]
    return "\n".join(line for model, where in seen.items() for line in _section(model, where))


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    for marker in (KEYS, EXAMPLE):
        if marker not in markdown:
            raise ValueError(f"{PAGE} lost its marker {marker}")
    root = Path(config.config_file_path).resolve().parent
    example = (root / "examples" / "kneepoint.yaml").read_text()
    return markdown.replace(KEYS, reference()).replace(EXAMPLE, f"```yaml\n{example}```")
