"""The app container's health check (docker-compose.yaml mounts it): healthy only when the
Streamlit server answers AND every module that app/main.py and the pages in app/screens
import is installed and imports.

Streamlit's own /_stcore/health answers 200 even when every page fails on a missing
package (the server is fine, each page's script is not), so that alone hid a broken image.
A page that fails at run time with its imports intact is the browser test's to catch.

    python app_health.py [URL]     # URL defaults to http://127.0.0.1:8501

Exit 0 when healthy; 1 with one line on stderr saying what is wrong."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
import urllib.request
from pathlib import Path

DEFAULT_URL = "http://127.0.0.1:8501"


def app_folder() -> Path:
    """Where the installed `app` package lives (the image's site-packages)."""
    spec = importlib.util.find_spec("app")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the app package is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def page_imports(folder: Path) -> list[tuple[str, tuple[str, ...]]]:
    """(module, names taken from it) for every absolute import in main.py and the pages."""
    found: list[tuple[str, tuple[str, ...]]] = []
    for path in [folder / "main.py", *sorted((folder / "screens").glob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                found += [(alias.name, ()) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.append((node.module, tuple(alias.name for alias in node.names)))
    return found


def check_imports(folder: Path) -> None:
    """Import what the pages import, as `from X import a` would (a may be a submodule)."""
    for module_name, names in page_imports(folder):
        module = importlib.import_module(module_name)
        for name in names:
            if name != "*" and not hasattr(module, name):
                importlib.import_module(f"{module_name}.{name}")


def main(argv: list[str]) -> int:
    url = (argv[0] if argv else DEFAULT_URL).rstrip("/")
    try:
        with urllib.request.urlopen(f"{url}/_stcore/health", timeout=5) as response:
            if response.status != 200:
                raise OSError(f"HTTP {response.status}")
    except OSError as error:
        print(f"unhealthy: the app server at {url} does not answer: {error}", file=sys.stderr)
        return 1
    try:
        check_imports(app_folder())
    except Exception as error:  # any import failure means a page would fail
        print(f"unhealthy: a page cannot import: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    print("healthy")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
