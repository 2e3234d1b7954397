"""The command line's reference, generated from the command line itself.

`markdown()` walks the command tree Typer builds (`typer.main.get_command`) and writes, for
every command and group, its usage, its one-line summary, its help and its options as plain
Markdown: no terminal, so no colour and no wrapping, and the same text whatever the width of
the terminal that runs it. The docs site's hook (docs/hooks/cli_reference.py) puts it in
docs/reference/cli.md, under that page's own title and introduction, so the page cannot drift
from the code; `python -m kneepoint.cli_reference` prints it.

The help texts are already Markdown (kneepoint/cliutil.py MARKUP): they are copied as they
are, their first paragraph being the summary. Importing this module imports the command
line's modules only, which load no scipy or pandas (a test holds that)."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import typer
import typer.core
import typer.main

from kneepoint.cli import app

if TYPE_CHECKING:
    # What this Typer's get_command returns: its own copy of Click's classes.
    from typer._click.core import Command, Parameter

# Each command's heading: one level below the page's section that holds the reference, and
# the whole command as typed, so a sub-command's place in the tree shows in its name.
HEADING = "###"


@dataclass(frozen=True)
class Node:
    """One command or group of the tree, with the context Click would give it."""

    path: str  # as typed: "kneepoint alerts eval"
    command: Command
    context: typer.Context


def walk(
    command: Command, name: str = "kneepoint", parent: typer.Context | None = None
) -> Iterator[Node]:
    """The command, then each sub-command in the order `--help` lists them."""
    context = typer.Context(command, info_name=name, parent=parent)
    yield Node(context.command_path, command, context)
    for sub_name, sub in getattr(command, "commands", {}).items():
        if not sub.hidden:
            yield from walk(sub, sub_name, context)


def paragraphs(help_text: str | None) -> tuple[str, str]:
    """(summary, the rest): a help text's first paragraph on one line, and the others as
    written (Markdown). Click's `\\f` ends what users are shown."""
    text = inspect.cleandoc(help_text or "").partition("\f")[0]
    first, _, rest = text.partition("\n\n")
    return " ".join(first.split()), rest.strip()


def summary(command: Command) -> str:
    """The one line `kneepoint --help` lists the command with."""
    return command.short_help or paragraphs(command.help)[0]


def usage(node: Node) -> str:
    words = [node.path, "[OPTIONS]"]
    for param in node.command.params:
        if param.param_type_name == "argument" and param.name:
            many = "..." if param.nargs == -1 else ""
            words.append(
                f"{param.name.upper()}{many}" if param.required else f"[{param.name.upper()}{many}]"
            )
    if getattr(node.command, "commands", None):
        words.append("COMMAND [ARGS]...")
    return " ".join(words)


def anchor(path: str) -> str:
    """The heading's id as MkDocs makes it (its `toc` default): lower case, words joined by
    hyphens, the code marks dropped."""
    return path.lower().replace(" ", "-")


def cell(text: str) -> str:
    """Text that stays inside one cell of a Markdown table."""
    return " ".join(text.split()).replace("|", "\\|")


def kind(param: Parameter, context: typer.Context) -> str:
    """What the option takes, as `--help` names it (`int`, `list[str]`), a flag, or a
    number within bounds (`int, 2 to 20`)."""
    if getattr(param, "is_flag", False) and not param.secondary_opts:
        return "flag"
    if not isinstance(param, typer.core.TyperOption | typer.core.TyperArgument):
        return ""
    shown = param.display_type(context).strip("<>").removesuffix(" range")
    low, high = getattr(param, "min", None), getattr(param, "max", None)
    if low is not None and high is not None:
        return f"{shown}, {low} to {high}"
    if low is not None:
        return f"{shown}, at least {low}"
    if high is not None:
        return f"{shown}, at most {high}"
    return shown


def default(param: Parameter, taken: str) -> str:
    """The value used when the option is not given; "required" when it must be."""
    if param.required:
        return "required"
    if param.default is None or (taken == "flag" and param.default is False):
        return ""
    if isinstance(param.default, bool):  # an on/off pair: the one in force
        return f"`{param.opts[0] if param.default else param.secondary_opts[0]}`"
    return f"`{param.default}`"


def option_row(param: Parameter, context: typer.Context) -> str:
    if param.param_type_name == "argument":
        names = f"`{(param.name or '').upper()}`"
    else:
        names = " / ".join(f"`{name}`" for name in (*param.opts, *param.secondary_opts))
    taken = kind(param, context)
    help_text = cell(getattr(param, "help", None) or "")
    return f"| {names} | {taken} | {default(param, taken)} | {help_text} |"


def section(node: Node) -> str:
    first, rest = paragraphs(node.command.help)
    lines = [f"{HEADING} `{node.path}`", "", first, "", "```", usage(node), "```", ""]
    if rest:
        lines += [rest, ""]
    shown = [p for p in node.command.params if not getattr(p, "hidden", False)]
    if shown:
        lines += ["| option | type | default | what it does |", "|---|---|---|---|"]
        lines += [option_row(param, node.context) for param in shown]
        lines.append("")
    subcommands = getattr(node.command, "commands", {})
    if subcommands:
        lines += ["| command | what it does |", "|---|---|"]
        for name, sub in subcommands.items():
            if not sub.hidden:
                path = f"{node.path} {name}"
                lines.append(f"| [{name}](#{anchor(path)}) | {cell(summary(sub))} |")
        lines.append("")
    return "\n".join(lines)


def markdown() -> str:
    """Every command's section, the root's first, in the order `--help` lists them."""
    root = typer.main.get_command(app)
    return "\n".join(section(node) for node in walk(root)).rstrip() + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
