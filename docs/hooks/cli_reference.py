"""MkDocs hook: fills docs/reference/cli.md from the command line itself, so it cannot drift.

The page holds a marker where `kneepoint.cli_reference.markdown()` goes; the build fails if
the marker is missing, so the generated reference cannot silently vanish from the page."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

PAGE = "reference/cli.md"
MARKER = "<!-- generated: kneepoint.cli_reference.markdown() -->"


def on_config(config: Any) -> Any:
    # mkdocs runs from anywhere; the project's packages live beside mkdocs.yml.
    root = str(Path(config.config_file_path).resolve().parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    return config


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"{PAGE} lost its marker {MARKER}")
    from kneepoint.cli_reference import markdown as reference

    return markdown.replace(MARKER, nested(reference()))


def nested(reference: str) -> str:
    """The generated reference under the page's own heading: its title dropped (the page has
    one), every other heading one level deeper, code blocks untouched."""
    lines = reference.splitlines()
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    fenced = False
    for number, line in enumerate(lines):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            lines[number] = "#" + line
    return "\n".join(lines).strip() + "\n"
