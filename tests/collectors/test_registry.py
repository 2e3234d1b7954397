"""The engine declarations say what their normalizers do: what an engine never gives is in
every sample it yields, keyed by a canonical quantity; each capture's names carry its
engine's declared prefixes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from collectors.engines import ENGINES, REGISTRY, detect_engine, discover
from collectors.engines.common import Engine
from kneepoint.samples import QUANTITIES
from kneepoint.store.models import TargetRow
from tests.conftest import OWN_FIXTURES, SHARED_FIXTURES, read

CAPTURES = sorted(
    path
    for folder in (OWN_FIXTURES, SHARED_FIXTURES)
    for path in folder.glob("*.prom")
    if path.name.split("-")[0] in REGISTRY
)


def test_every_engine_is_found_in_its_declared_order_under_its_module_s_name() -> None:
    assert set(ENGINES) >= {"vllm", "sglang", "llamacpp", "tgi", "trtllm"}
    orders = [REGISTRY[kind].order for kind in ENGINES]
    assert orders == sorted(orders) and len(set(orders)) == len(orders)
    for kind, engine in REGISTRY.items():
        assert isinstance(engine, Engine) and engine.kind == kind
        assert engine.parse.__module__ == f"collectors.engines.{kind}"


def test_every_kind_fits_the_store_s_engine_column() -> None:
    column = TargetRow.__table__.c.engine
    assert all(len(kind) <= column.type.length for kind in ENGINES)


@pytest.mark.parametrize("kind", sorted(REGISTRY))
def test_what_an_engine_never_gives_is_a_canonical_quantity_said_in_words(kind: str) -> None:
    engine = REGISTRY[kind]
    assert set(engine.unavailable) <= set(QUANTITIES)
    assert all(
        reason.startswith(f"not exposed by {engine.name}") for reason in engine.unavailable.values()
    )


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.name)
def test_every_sample_reports_what_its_engine_never_gives(path: Path) -> None:
    engine = REGISTRY[path.name.split("-")[0]]
    sample = engine.parse(read(path), 20_000)
    assert sample.engine == engine.kind
    assert engine.unavailable.items() <= sample.unavailable.items()


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.name)
def test_a_capture_s_names_carry_its_engine_s_prefixes(path: Path) -> None:
    engine = REGISTRY[path.name.split("-")[0]]
    names = {
        line.split("{")[0].split(" ")[0]
        for line in read(path).splitlines()
        if line[:1] not in ("", "#")
    }
    prefixed = {name for name in names if name.startswith(engine.prefixes)}
    assert prefixed or engine.unprefixed & names
    assert detect_engine(read(path)) == engine.kind


def test_a_module_named_apart_from_its_kind_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "toys"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "odd.py").write_text(
        "from collectors.engines.common import Engine\n"
        "ENGINE = Engine(kind='even', name='Even', order=1, prefixes=('even:',), parse=print)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.raises(TypeError, match="name the module after it"):
            discover("toys", [str(package)])
    finally:
        for name in [n for n in sys.modules if n == "toys" or n.startswith("toys.")]:
            del sys.modules[name]


def test_a_module_that_fails_to_import_is_left_out_and_the_others_are_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    package = tmp_path / "shaky"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "good.py").write_text(
        "from collectors.engines.common import Engine\n"
        "ENGINE = Engine(kind='good', name='Good', order=1, prefixes=('good:',), parse=print)\n"
    )
    (package / "broken.py").write_text("raise RuntimeError('a broken normalizer')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        found = discover("shaky", [str(package)])
    finally:
        for name in [n for n in sys.modules if n == "shaky" or n.startswith("shaky.")]:
            del sys.modules[name]
    assert list(found) == ["good"]
    assert "cannot load the engine module shaky.broken" in caplog.text
