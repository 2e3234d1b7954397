"""The vLLM servers' models are built once per configuration and kept at a path that stays
the same (vllm_server.tiny_model says why): no vLLM needed, the builder is a stand-in."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.real import vllm_server

STAND_IN = """
import sys
from pathlib import Path
out = Path(sys.argv[1])
(out / "config.json").write_text(" ".join(sys.argv[2:]))
with open(sys.argv[0] + ".calls", "a") as calls:
    calls.write(out.name + "\\n")
"""


def test_a_configurations_model_is_built_once_and_found_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    builder = tmp_path / "make_model.py"
    builder.write_text(STAND_IN)
    monkeypatch.setattr(vllm_server, "VLLM_PYTHON", Path(sys.executable))
    monkeypatch.setattr(vllm_server, "MAKE_MODEL", builder)
    monkeypatch.setattr(vllm_server, "MODELS", tmp_path / "models")
    calls = tmp_path / "make_model.py.calls"

    first = vllm_server.tiny_model((4, 8), ("--max-num-seqs", "64"))
    again = vllm_server.tiny_model((4, 8), ("--max-num-seqs", "64"))
    assert again == first and (first / "config.json").read_text() == "4 8"
    assert len(calls.read_text().splitlines()) == 1, "built again"
    # Another configuration, or another shape: a folder of its own.
    other = vllm_server.tiny_model((4, 8), ("--max-num-seqs", "16"))
    tiny = vllm_server.tiny_model((2, 2), ("--max-num-seqs", "64"))
    assert len({first, other, tiny}) == 3
    # Only finished models are there: no half-built folder is left behind.
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == sorted(
        p.name for p in (first, other, tiny)
    )
    # A changed builder is a new model.
    builder.write_text(STAND_IN + "\n# changed\n")
    assert vllm_server.tiny_model((4, 8), ("--max-num-seqs", "64")) != first
