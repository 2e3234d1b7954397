"""One real vLLM (CPU build, tiny model, prefix caching on) shared by the tests that need it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.real.vllm_server import Vllm, running_vllm


@pytest.fixture(scope="session")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Vllm]:
    workdir = tmp_path_factory.mktemp("vllm")
    with running_vllm(workdir, "--enable-prefix-caching") as server:
        yield server
