"""The docs: the site builds under `mkdocs build --strict` (a broken link, a missing anchor, a
page left out of nav fails it), every docs path the code, the tests, the chart and the front
pages name exists, and every file of the repository the docs name exists (a module renamed
without its docs fails here, so the docs' tables cannot drift from the code's layout)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from kneepoint.config import Config
from tests.conftest import ROOT

# A path into this repository's docs/ folder: `docs/...md` not preceded by another folder's
# name (`../shared/docs/x.md` is a different tree; `sglang/docs/...` a quoted upstream path).
DOCS_PATH = re.compile(r"(?<![\w/.-])docs/(?:[\w-]+/)*[\w-]+\.md\b")
# Where references to the docs live: code, tests, tools, the chart and deployment files.
SCANNED_SUFFIXES = {".py", ".yaml", ".yml", ".toml", ".sh", ".tpl", ".cfg", ".ini"}
SCANNED_DIRS = (
    "kneepoint",
    "collectors",
    "alerts",
    "dashboards",
    "app",
    "review",
    "tests",
    "bench",
    "deploy",
    "examples",
    "scripts",
)
FRONT_PAGES = ("README.md", "CONTRIBUTING.md")
# A file of this repository as the docs name it: a top-level folder of the checkout, then a
# path ending in a file's suffix (`collectors/scrape.py`, `deploy/helm/kneepoint/values.yaml`).
TOP_FOLDERS = "|".join((*SCANNED_DIRS, "docs"))
REPOSITORY_PATH = re.compile(
    rf"(?<![\w/.-])((?:{TOP_FOLDERS})/(?:[\w.-]+/)*[\w-]+"
    r"\.(?:py|md|yaml|yml|toml|sh|prom|json|png|ini|tpl|txt|csv))\b"
)
# The made-up engine docs/adding-an-engine.md walks through: its files are examples, not files.
EXAMPLE_ENGINE = "acme"
# Files whose docs/ paths are data, not references: .dockerignore patterns under test, and
# this file's own examples.
NOT_REFERENCES = {Path("tests/test_deploy.py"), Path("tests/test_docs.py")}


def test_the_site_builds_strict(tmp_path: Path) -> None:
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=240,
    )
    assert build.returncode == 0, f"mkdocs build --strict failed:\n{build.stdout}{build.stderr}"
    # The generated references were filled in, not left as markers.
    cli = (tmp_path / "reference" / "cli" / "index.html").read_text()
    configuration = (tmp_path / "reference" / "configuration" / "index.html").read_text()
    assert "kneepoint whatif" in cli and "generated:" not in cli
    assert "generated:" not in configuration
    top_level = [info.alias or name for name, info in Config.model_fields.items()]
    absent = [key for key in top_level if f"<td><code>{key}</code></td>" not in configuration]
    assert not absent, f"the configuration reference lacks {absent}"


def named_docs_paths() -> dict[str, list[str]]:
    """Each `docs/...md` path named outside docs/, with where it is named."""
    files = [ROOT / name for name in FRONT_PAGES]
    for folder in SCANNED_DIRS:
        files += [p for p in (ROOT / folder).rglob("*") if p.suffix in SCANNED_SUFFIXES]
    named: dict[str, list[str]] = {}
    for path in files:
        relative = path.relative_to(ROOT)
        if relative in NOT_REFERENCES or "__pycache__" in relative.parts:
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for match in DOCS_PATH.findall(line):
                named.setdefault(match, []).append(f"{relative}:{number}")
    return named


def test_every_docs_path_named_in_the_code_and_tests_exists() -> None:
    named = named_docs_paths()
    assert "docs/reference/runbooks.md" in named, "the scan found none of the known references"
    missing = {path: where for path, where in named.items() if not (ROOT / path).is_file()}
    assert not missing, f"docs paths that do not exist: {missing}"


def test_the_front_pages_links_resolve() -> None:
    """README.md and CONTRIBUTING.md sit outside the site, so mkdocs does not check them."""
    for name in FRONT_PAGES:
        text = (ROOT / name).read_text()
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if not target.startswith(("http://", "https://", "mailto:")):
                assert (ROOT / target).exists(), f"{name} links to {target}, which does not exist"


def test_every_repository_file_the_docs_name_exists() -> None:
    pages = [*sorted((ROOT / "docs").rglob("*.md")), *(ROOT / name for name in FRONT_PAGES)]
    named: dict[str, list[str]] = {}
    for page in pages:
        for path in REPOSITORY_PATH.findall(page.read_text()):
            if EXAMPLE_ENGINE not in Path(path).name:
                named.setdefault(path, []).append(str(page.relative_to(ROOT)))
    assert "collectors/scrape.py" in named, "the scan found none of the files the docs name"
    missing = {
        path: sorted(set(where)) for path, where in named.items() if not (ROOT / path).exists()
    }
    assert not missing, f"files the docs name that do not exist: {missing}"
