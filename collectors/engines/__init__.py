"""Every inference engine kneepoint reads: the registry, and which engine a scrape came from when
the target's kind is `auto`.

Each module of this package but `common` is one engine and ends with `ENGINE = Engine(...)`
(collectors/engines/common.py): its kind and name, its metric prefixes, its normalizer and
what it cannot give. They are found by scanning the package, in the order they declare, so
adding an engine is adding a module (docs/adding-an-engine.md); configuration's target kinds
(kneepoint/config.py ENGINE_KINDS) come from here. A module that fails to import is logged and
left out, so one broken normalizer does not stop the other engines' collection; its kind is
then not among the configuration's target kinds.

This package sits below configuration: it and its modules import only the parser and
kneepoint.samples, never config, the store, alerts or the app.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil

from collectors.engines.common import Engine, Parser
from collectors.parse import MAX_SERIES, ParsedScrape, ScrapeFormatError
from kneepoint.samples import ReplicaSample

log = logging.getLogger(__name__)

# Modules of the package that are no engine.
_NOT_ENGINES = frozenset({"common"})


def discover(package: str, paths: list[str]) -> dict[str, Engine]:
    """The engines the modules of `package` (at `paths`) declare, by kind, in their order.
    Each module is named after its kind, so no two declare the same one."""
    found: list[Engine] = []
    for module_info in pkgutil.iter_modules(paths):
        if module_info.name in _NOT_ENGINES or module_info.name.startswith("_"):
            continue
        name = f"{package}.{module_info.name}"
        try:
            module = importlib.import_module(name)
        except Exception:  # one broken normalizer must not stop the others' collection
            log.exception("cannot load the engine module %s; its kind is left out", name)
            continue
        engine = getattr(module, "ENGINE", None)
        if not isinstance(engine, Engine):
            raise TypeError(f"{name} declares no engine: it must end with ENGINE = Engine(...)")
        if engine.kind != module_info.name:  # so each engine is found where its kind says
            raise TypeError(f"{name} declares kind {engine.kind!r}: name the module after it")
        found.append(engine)
    found.sort(key=lambda engine: (engine.order, engine.kind))
    return {engine.kind: engine for engine in found}


REGISTRY: dict[str, Engine] = discover(__name__, __path__)
# The engine kinds, in order: a replica target's `kind` is one of them (or `auto`).
ENGINES: tuple[str, ...] = tuple(REGISTRY)
# What they are called in sentences ("not exposed by llama.cpp").
ENGINE_NAMES: dict[str, str] = {kind: engine.name for kind, engine in REGISTRY.items()}
PARSERS: dict[str, Parser] = {kind: engine.parse for kind, engine in REGISTRY.items()}


def detect_engine(scrape: str | ParsedScrape) -> str | None:
    """The engine whose metric names the exposition (or parsed scrape) carries, or None.

    Counts the sample lines per engine prefix and takes the engine with most: a vLLM with
    LMCache has `lmcache:` lines too, and a Dynamo worker passes its engine's names through
    beside `dynamo_*` (neither is an engine here). Ties go to the order of ENGINES. With no
    prefixed name, an engine's unprefixed names (the oldest trtllm-serve's) decide.
    """
    names = _names(scrape)
    prefixes = [(engine.prefixes, kind) for kind, engine in REGISTRY.items()]
    counts = dict.fromkeys(ENGINES, 0)
    for name in names:
        for prefix, kind in prefixes:
            if name.startswith(prefix):
                counts[kind] += 1
                break
    best = max(ENGINES, key=lambda kind: counts[kind], default=None)
    if best is not None and counts[best]:
        return best
    present = set(names)
    for kind, engine in REGISTRY.items():
        if engine.unprefixed & present:
            return kind
    return None


def _names(scrape: str | ParsedScrape) -> list[str]:
    if isinstance(scrape, ParsedScrape):
        return list(scrape.samples)
    names = []
    for line in scrape.split("\n"):
        if line and line[0] != "#":
            names.append(line.partition(" ")[0].partition("{")[0])
    return names


def parse_replica(kind: str, text: str, max_series: int = MAX_SERIES) -> ReplicaSample:
    """Normalize one engine scrape of a target of `kind` (an engine, or `auto`: the engine
    detected from the names). Raises ScrapeFormatError when the body is not one."""
    engine = kind
    if kind == "auto":
        if not text.strip():
            raise ScrapeFormatError("the response body is empty")
        if text.lstrip().startswith(("{", "[")):
            hints = [e.json_body for e in REGISTRY.values() if e.json_body is not None]
            raise ScrapeFormatError(hints[0] if hints else "the response body is JSON")
        found = detect_engine(text)
        if found is None:
            raise ScrapeFormatError(
                f"no engine's metrics found ({_prefix_list()} names); "
                "is this an inference engine's /metrics endpoint?"
            )
        engine = found
    parser = PARSERS.get(engine)
    if parser is None:
        raise ScrapeFormatError(f"kneepoint cannot read {ENGINE_NAMES.get(engine, engine)} yet")
    return parser(text, max_series)


def _prefix_list() -> str:
    """Each engine's first prefix: "vllm:, sglang:, llamacpp:, tgi_ or trtllm_"."""
    shown = [engine.prefixes[0] for engine in REGISTRY.values()]
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} or {shown[-1]}"
