"""Every inference engine kneepoint reads, by name: its normalizer, and which engine a scrape
came from when the target's kind is `auto`.

Each engine's module exposes `parse_<engine>(text, max_series) -> ReplicaSample`, which sets
the sample's `engine`, `generation` and `unavailable` (kneepoint/samples.py QUANTITIES). A
module not present in this checkout leaves its engine out of PARSERS: a target of that kind
is then recorded down with the reason, and `auto` never picks it.
"""

from __future__ import annotations

import importlib
import logging
import re
from collections.abc import Callable

from collectors.parse import MAX_SERIES, ParsedScrape, ScrapeFormatError
from kneepoint.samples import ENGINE_NAMES, ENGINES, ReplicaSample

Parser = Callable[[str, int], ReplicaSample]
log = logging.getLogger(__name__)

# Engine -> (module, function) of its normalizer.
_MODULES: dict[str, tuple[str, str]] = {
    engine: (f"collectors.engines.{engine}", f"parse_{engine}") for engine in ENGINES
}

DISPLAY = ENGINE_NAMES  # what the engines are called in sentences


def _load() -> dict[str, Parser]:
    parsers: dict[str, Parser] = {}
    for engine, (module_name, function) in _MODULES.items():
        try:
            module = importlib.import_module(module_name)
            parsers[engine] = getattr(module, function)
        except ModuleNotFoundError as error:
            if error.name != module_name:  # the module exists but an import inside it fails
                log.exception("cannot load the %s normalizer; its targets stay down", engine)
        except Exception:  # one broken normalizer must not stop the others' collection
            log.exception("cannot load the %s normalizer; its targets stay down", engine)
    return parsers


PARSERS: dict[str, Parser] = _load()

# Name prefixes that say which engine wrote an exposition (engines.md §6.1). Gateways and
# Ray may turn `:` into `_` (`sglang_num_running_reqs`, `vllm_…`). Only families the engine
# itself defines count: `tgi_` and `trtllm_` are underscores by origin. The oldest
# trtllm-serve names carry no prefix at all (PR #5785); those are told by the families below.
_PREFIXES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("vllm", re.compile(r"^vllm[:_]")),
    ("sglang", re.compile(r"^sglang[:_]")),
    ("llamacpp", re.compile(r"^llamacpp[:_]")),
    ("tgi", re.compile(r"^tgi_")),
    ("trtllm", re.compile(r"^trtllm[:_]")),
)
# trtllm-serve before its `trtllm_` prefix (PR #5785, 1.0/1.1): unprefixed names carrying
# `engine_type="undefined"`; nothing else serves `request_success_total` unprefixed.
_UNPREFIXED_TRTLLM = ("request_success_total", "e2e_request_latency_seconds_count")


def detect_engine(scrape: str | ParsedScrape) -> str | None:
    """The engine whose metric names the exposition (or parsed scrape) carries, or None.

    Counts the sample lines per engine prefix and takes the engine with most: a vLLM with
    LMCache has `lmcache:` lines too, and a Dynamo worker passes its engine's names through
    beside `dynamo_*` (neither is an engine here). Ties go to the order of ENGINES.
    """
    names = _names(scrape)
    counts = dict.fromkeys(ENGINES, 0)
    for name in names:
        for engine, pattern in _PREFIXES:
            if pattern.match(name):
                counts[engine] += 1
                break
    best = max(ENGINES, key=lambda engine: counts[engine])
    if counts[best]:
        return best
    if any(name in _UNPREFIXED_TRTLLM for name in names):
        return "trtllm"
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
        if text.lstrip().startswith(("{", "[")):  # trtllm-serve's /metrics is JSON
            from collectors.engines.trtllm import JSON_BODY

            raise ScrapeFormatError(JSON_BODY)
        found = detect_engine(text)
        if found is None:
            raise ScrapeFormatError(
                "no engine's metrics found (vllm:, sglang:, llamacpp:, tgi_ or trtllm_ names); "
                "is this an inference engine's /metrics endpoint?"
            )
        engine = found
    parser = PARSERS.get(engine)
    if parser is None:
        raise ScrapeFormatError(f"kneepoint cannot read {DISPLAY.get(engine, engine)} yet")
    return parser(text, max_series)


def not_exposed(engine: str, why: str = "") -> str:
    """The reason sentence: "not exposed by SGLang" plus an optional tail."""
    head = f"not exposed by {DISPLAY.get(engine, engine)}"
    return f"{head} {why}".strip() if why else head
