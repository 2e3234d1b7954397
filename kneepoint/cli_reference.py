"""The command line's reference, as Markdown, read from the command tree itself.

Temporary minimal version in the docs branch (the docs site's hook calls `markdown()`); the
command-line work replaces it with the full one. Typer carries its own copy of Click, so the
tree is walked by what its nodes do (`list_commands`, `param_type_name`), not by their class."""

from __future__ import annotations

from typing import Any

import typer.main


def _option_row(param: Any) -> str:
    names = ", ".join(f"`{name}`" for name in [*param.opts, *param.secondary_opts])
    help_text = " ".join((param.help or "").split()).replace("|", "\\|")
    return f"| {names} | {help_text} |"


def _argument_row(param: Any) -> str:
    name = (param.metavar or param.name or "").upper()
    help_text = " ".join((getattr(param, "help", None) or "").split()).replace("|", "\\|")
    return f"| `{name}` | {help_text} |"


def _command(command: Any, path: list[str]) -> list[str]:
    name = " ".join(path)
    context = command.context_class(command, info_name=name)
    usage = " ".join([name, *command.collect_usage_pieces(context)])
    lines = [f"{'#' * min(len(path) + 1, 4)} `{name}`", "", "```", usage, "```", ""]
    if command.help:
        lines += [command.help.replace("\b\n", "").strip(), ""]
    visible = [p for p in command.params if not getattr(p, "hidden", False)]
    arguments = [p for p in visible if p.param_type_name == "argument"]
    options = [p for p in visible if p.param_type_name == "option"]
    if arguments:
        lines += ["| argument | meaning |", "|---|---|", *map(_argument_row, arguments), ""]
    if options:
        lines += ["| option | meaning |", "|---|---|", *map(_option_row, options), ""]
    if hasattr(command, "list_commands"):
        for sub_name in command.list_commands(context):
            sub = command.get_command(context, sub_name)
            if sub is not None and not sub.hidden:
                lines += _command(sub, [*path, sub_name])
    return lines


def markdown() -> str:
    """Every command of `kneepoint`: its usage, help, arguments and options."""
    from kneepoint.cli import app

    return "\n".join(_command(typer.main.get_command(app), ["kneepoint"])).rstrip() + "\n"
