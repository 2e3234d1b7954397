"""The packages' layers point down and their modules import in no cycle: the import-linter
contracts in pyproject.toml (`[tool.importlinter]`) hold, every module is placed in a layer,
and the module graph, function-local and TYPE_CHECKING imports included, has no cycle."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from collections.abc import Iterable, Mapping

import grimp

from tests.conftest import ROOT

CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
PACKAGES: tuple[str, ...] = tuple(CONFIG["root_packages"])
# `lint-imports`, run by this interpreter (the venv's script need not be on PATH).
LINT_IMPORTS = "from importlinter.cli import lint_imports_command; lint_imports_command()"


def import_graph() -> grimp.ImportGraph:
    """The six packages' import graph as this checkout has it (not an installed copy)."""
    sys.path.insert(0, str(ROOT))
    try:
        return grimp.build_graph(*PACKAGES, cache_dir=None)
    finally:
        sys.path.remove(str(ROOT))


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Each group of modules that import one another in a circle, directly or through
    others (the graph's strongly connected components of more than one module), sorted."""
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):  # Tarjan's algorithm, iterative: no recursion limit
        if root in index:
            continue
        work = [(root, iter(edges[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges.get(child, ()))))
                elif child in on_stack:
                    low[module] = min(low[module], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[module])
            if low[module] == index[module]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == module:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def describe_cycle(graph: grimp.ImportGraph, modules: Iterable[str]) -> str:
    """The imports that close a cycle, one per line with where they are."""
    members = set(modules)
    lines = []
    for importer in sorted(members):
        for imported in sorted(set(graph.find_modules_directly_imported_by(importer)) & members):
            where = ", ".join(
                str(d["line_number"])
                for d in graph.get_import_details(importer=importer, imported=imported)
            )
            lines.append(f"  {importer} imports {imported} (line {where})")
    return "\n".join(lines)


def layer_entries(contract: Mapping[str, object]) -> list[str]:
    """The modules a layers contract names (optional ones without their parentheses)."""
    entries = []
    for layer in contract["layers"]:  # type: ignore[attr-defined]
        for part in str(layer).replace("|", ":").split(":"):
            entries.append(part.strip().strip("()"))
    return entries


def unplaced(modules: Iterable[str], entries: Iterable[str]) -> list[str]:
    """Modules neither named by an entry, nor inside one, nor a package holding one."""
    named = set(entries)

    def placed(module: str) -> bool:
        return any(
            module == entry or module.startswith(entry + ".") or entry.startswith(module + ".")
            for entry in named
        )

    return sorted(m for m in modules if not placed(m))


def test_the_import_contracts_hold() -> None:
    """`lint-imports`: no module imports one of a higher layer, siblings marked independent
    import none of each other; its output names each offending import and its line."""
    run = subprocess.run(
        [sys.executable, "-c", LINT_IMPORTS, "--no-cache", "--no-logo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, f"an import breaks the layers:\n{run.stdout}{run.stderr}"
    assert "0 broken" in run.stdout


def test_every_module_sits_in_a_layer() -> None:
    """A new module is placed in pyproject.toml's layers, else its imports go unchecked; a
    package placed only through its modules (`kneepoint`, `kneepoint.derived`) imports
    nothing of the packages in its `__init__`, which no layer would check."""
    [layers] = [c for c in CONFIG["contracts"] if c["type"] == "layers"]
    entries = layer_entries(layers)
    graph = import_graph()
    missing = unplaced(graph.modules, entries)
    assert not missing, "modules in no layer of [tool.importlinter]: " + ", ".join(missing)
    holders = [m for m in graph.modules if m not in entries and not unplaced([m], entries)]
    holders = [m for m in holders if not any(m.startswith(e + ".") for e in entries)]
    importing = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in sorted(holders)}
    importing = {m: found for m, found in importing.items() if found}
    assert not importing, f"package inits outside the layers import: {importing}"


def test_no_module_imports_itself_back_through_others() -> None:
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n\n".join(
        describe_cycle(graph, modules) for modules in found
    )


def test_a_cycle_is_found_and_described_with_its_lines() -> None:
    """The cycle check itself: a three-module circle and a pair are found, a chain is not."""
    graph = grimp.ImportGraph()
    for importer, imported, line in [
        ("p.a", "p.b", 3),
        ("p.b", "p.c", 4),
        ("p.c", "p.a", 5),
        ("p.d", "p.e", 6),
        ("p.e", "p.d", 7),
        ("p.f", "p.a", 8),
    ]:
        graph.add_import(importer=importer, imported=imported, line_number=line, line_contents="")
    assert cycles(graph) == [["p.a", "p.b", "p.c"], ["p.d", "p.e"]]
    assert "p.c imports p.a (line 5)" in describe_cycle(graph, ["p.a", "p.b", "p.c"])


def test_a_module_outside_every_layer_is_reported() -> None:
    entries = layer_entries({"layers": ["alerts.rules | app", "kneepoint.store : (kneepoint.new)"]})
    assert entries == ["alerts.rules", "app", "kneepoint.store", "kneepoint.new"]
    modules = ["kneepoint", "kneepoint.store.models", "kneepoint.new", "app.x", "alerts.other"]
    assert unplaced(modules, entries) == ["alerts.other"]
