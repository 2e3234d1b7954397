"""`kneepoint --help` reads like a command line's help: one row per command in each list, help
paragraphs that reflow to the terminal, help on every option, no source file or README
section named; and the generated reference (kneepoint/cli_reference.py) covers the tree."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from kneepoint import cli_reference
from kneepoint.cli import app

# Help written for a source reader, not a user: a module path, or a section of the README.
SOURCE_PATH = re.compile(r"\w+/\w+\.py")
README_SECTION = 'README "'
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def tree() -> Iterator[tuple[list[str], Any]]:
    """Every command and group as typed after `kneepoint` ([] for the root), walked here
    rather than with cli_reference.walk so the reference is checked against the tree."""

    def walk(words: list[str], command: Any) -> Iterator[tuple[list[str], Any]]:
        yield words, command
        for name, sub in getattr(command, "commands", {}).items():
            yield from walk([*words, name], sub)

    return walk([], typer.main.get_command(app))


def groups() -> list[tuple[list[str], Any]]:
    return [(words, command) for words, command in tree() if getattr(command, "commands", None)]


def texts(command: Any) -> Iterator[str]:
    """Every help text a user can be shown for the command: its own and its parameters'."""
    yield command.help or ""
    yield command.short_help or ""
    yield command.epilog or ""
    for param in command.params:
        yield getattr(param, "help", None) or ""


def shown_help(words: list[str], columns: int) -> str:
    result = CliRunner().invoke(app, [*words, "--help"], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    return ANSI.sub("", result.output)


def command_rows(output: str) -> list[str]:
    """The rows of the Commands panel: the command's name, or "" where a row only carries
    the summary of the row above onto a second line."""
    panel = output.split("╭─ Commands")[1].split("╰")[0]
    rows = [line.strip().strip("│") for line in panel.splitlines()[1:]]
    return [row.split()[0] if row[:2].strip() else "" for row in rows if row.strip()]


@pytest.mark.parametrize("words", [words for words, _ in groups()], ids=" ".join)
def test_each_command_is_listed_on_one_row_at_100_columns(words: list[str]) -> None:
    command = dict((" ".join(w), c) for w, c in tree())[" ".join(words)]
    rows = command_rows(shown_help(words, 100))
    assert "" not in rows, f"a summary wraps onto a second row: {rows}"
    assert rows == list(command.commands)


def test_no_help_text_names_a_source_file_or_a_readme_section() -> None:
    found = [
        f"kneepoint {' '.join(words)}: {text!r}"
        for words, command in tree()
        for text in texts(command)
        if SOURCE_PATH.search(text) or README_SECTION in text
    ]
    assert not found, "help for users names source files or README sections:\n" + "\n".join(found)


def test_every_option_and_argument_has_help() -> None:
    missing = [
        f"kneepoint {' '.join(words)} {param.opts[0]}"
        for words, command in tree()
        for param in command.params
        if not (getattr(param, "help", None) or "").strip()
    ]
    assert not missing, f"options without help: {missing}"


def test_every_paragraph_of_help_reflows_to_the_terminal() -> None:
    """A paragraph wrapped by hand in the docstring is one line on a wide terminal: the
    help does not keep the source's line breaks (ragged rows on any other width)."""
    kept = []
    for words, command in tree():
        text = inspect.cleandoc(command.help or "")
        body = [p for p in text.split("\n\n")[1:] if "\n" in p and not p.startswith("```")]
        if not body:
            continue
        shown = {line.strip() for line in shown_help(words, 1000).splitlines()}
        for paragraph in body:
            line = " ".join(paragraph.split()).replace("`", "")
            if line not in shown:
                kept.append(f"kneepoint {' '.join(words)}: {paragraph[:60]!r}…")
    assert not kept, "paragraphs shown with their source line breaks:\n" + "\n".join(kept)


def test_the_reference_names_every_command_and_option_under_its_heading() -> None:
    page = cli_reference.markdown()
    sections = {part.split("\n", 1)[0]: part for part in ("\n" + page).split("\n### ")[1:]}
    for words, command in tree():
        path = " ".join(["kneepoint", *words])
        assert f"`{path}`" in sections, f"no section for {path}"
        section = sections[f"`{path}`"]
        first_line = " ".join(inspect.cleandoc(command.help or "").split("\n\n")[0].split())
        assert first_line in section, path
        for param in command.params:
            names = [*param.opts, *param.secondary_opts]
            if param.param_type_name == "argument":
                names = [param.name.upper()]
            for name in names:
                assert f"`{name}`" in section, f"{path}: {name} is not in its section"


def test_the_reference_is_plain_markdown_whatever_the_terminal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    narrow = cli_reference.markdown()
    monkeypatch.setenv("COLUMNS", "200")
    assert cli_reference.markdown() == narrow
    assert narrow.startswith("### `kneepoint`\n")
    assert "\x1b" not in narrow and "│" not in narrow and "╭" not in narrow


def test_the_reference_imports_no_scipy_or_pandas() -> None:
    """The docs build imports it: the command line's modules only, not the numbers'."""
    probe = (
        "import sys, kneepoint.cli_reference; print(sorted({'scipy', 'pandas'} & set(sys.modules)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
