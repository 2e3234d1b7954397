"""The real vLLM servers the tests share (CPU build), started once per session, each group of
one model together, and stopped as soon as no test left to run needs them.

Why shared and together: a start is mostly importing vLLM and compiling (a minute or more
here), the same for every test that uses the same configuration; started at the same time,
several starts share the two cores better than one after another. An idle server uses no
CPU, so a test loading one server is not slowed by its idle neighbours; the group is stopped
after its last test, before the tests that come after it (timing ones among them)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from tests.real.vllm_server import (
    DEV_MODE,
    ENGINE_BOUND,
    ENGINE_BOUND_SERVERS,
    TINY,
    TINY_SERVER_ENV,
    TINY_SERVERS,
    Vllm,
    running_together,
)

# The open server groups by fixture name, stopped after the last test that uses them.
_OPEN: dict[str, ExitStack] = {}


def _group(
    name: str,
    tmp_path_factory: pytest.TempPathFactory,
    servers: dict[str, tuple[str, ...]],
    shape: tuple[int, int],
    env: dict[str, dict[str, str]] | None = None,
) -> dict[str, Vllm]:
    stack = ExitStack()
    folder = tmp_path_factory.mktemp(name)
    ready = stack.enter_context(running_together(folder, servers, shape, env))
    _OPEN[name] = stack
    return ready


@pytest.fixture(scope="session")
def tiny_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Vllm]]:
    """The tiny model's servers (vllm_server.TINY_SERVERS): prefix caching, starved of KV
    blocks, n-gram speculation, max_num_seqs 2, and "limits" (queue limits, MFU counters, a
    small token budget, LoRA)."""
    yield _group("tiny_servers", tmp_path_factory, TINY_SERVERS, TINY, TINY_SERVER_ENV)
    _OPEN.pop("tiny_servers", ExitStack()).close()  # unless stopped after its last test


@pytest.fixture(scope="session")
def engine_bound_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Vllm]]:
    """The engine-bound model's servers A, B and C (vllm_server.ENGINE_BOUND_SERVERS), in dev
    mode (the what-if test empties their prefix caches between runs)."""
    env = dict.fromkeys(ENGINE_BOUND_SERVERS, DEV_MODE)
    yield _group("engine_bound_servers", tmp_path_factory, ENGINE_BOUND_SERVERS, ENGINE_BOUND, env)
    _OPEN.pop("engine_bound_servers", ExitStack()).close()


@pytest.fixture(scope="session")
def vllm(tiny_servers: dict[str, Vllm]) -> Vllm:
    """One real vLLM (tiny model, prefix caching on)."""
    return tiny_servers["prefix"]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After a test, stop each open group no test still to run asks for (a session fixture
    is otherwise only torn down when the whole session ends)."""
    yield
    if not _OPEN:
        return
    items = item.session.items
    later = items[items.index(item) + 1 :] if item in items else []
    needed = {name for test in later for name in getattr(test, "fixturenames", ())}
    for name in [name for name in _OPEN if name not in needed]:
        _OPEN.pop(name).close()
