"""Adding an engine is adding one module (docs/adding-an-engine.md): a toy engine, written to a
temporary folder and edited into no file of the repository, is found by the registry, accepted
by the configuration as a target kind, detected from a scrape, and its samples are stored and
reported by `status` like any engine's.

The engine kinds are read once, when the configuration is imported, so the toy runs in a fresh
interpreter whose package collectors.engines also searches the temporary folder (its
`__path__`, set before the package scans itself)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from collectors.engines import ENGINE_NAMES, ENGINES, REGISTRY
from tests.conftest import ROOT

TOY_MODULE = '''
"""A toy engine: `toy:` metrics, a running gauge and a prompt-token counter."""

from collectors.engines.common import Engine, blank_numbers, parse_prefixed, sum_first
from collectors.parse import MAX_SERIES, checked
from kneepoint.samples import CacheConfig, ReplicaSample

P = "toy:"
RUNNING, PROMPT = P + "running", P + "prompt_tokens_total"
UNAVAILABLE = {"preemptions": "not exposed by Toy: it never preempts"}


def parse_toy(text: str, max_series: int = MAX_SERIES) -> ReplicaSample:
    parsed = parse_prefixed(text, P, frozenset({RUNNING, PROMPT}), "no toy metric", max_series)
    gauges, counters = blank_numbers()
    gauges["requests_running"] = sum_first(parsed, (RUNNING,))
    counters["prompt_tokens"] = sum_first(parsed, (PROMPT,))
    return checked(
        ReplicaSample(
            engine=ENGINE.kind,
            generation="toy-1",
            engines=1,
            model_names=[],
            gauges=gauges,
            counters=counters,
            cache=CacheConfig(),
            unavailable=dict(UNAVAILABLE),
        )
    )


ENGINE = Engine(
    kind="toy", name="Toy", order=60, prefixes=(P,), parse=parse_toy, unavailable=UNAVAILABLE
)
'''

# Run in the fresh interpreter: argv[1] the toy's folder, argv[2] a work folder. Prints JSON.
RUN = '''
import importlib.util, json, sys
from pathlib import Path

spec = importlib.util.find_spec("collectors.engines")
spec.submodule_search_locations.append(sys.argv[1])
package = importlib.util.module_from_spec(spec)
sys.modules["collectors.engines"] = package
spec.loader.exec_module(package)

from collectors.collect import store_fetched
from collectors.scrape import Fetched
from kneepoint.config import ENGINE_KINDS, load_config
from kneepoint.status import build_status
from kneepoint.store.db import open_store

work = Path(sys.argv[2])
config_file = work / "kneepoint.yaml"
config_file.write_text(f"""
database: sqlite:///{work / "kneepoint.db"}
targets:
  - {{name: toy-a, kind: toy, url: "http://127.0.0.1:9/a"}}
  - {{name: toy-b, kind: auto, url: "http://127.0.0.1:9/b"}}
discovery:
  kubernetes:
    replicas: {{selector: "app=toy", port: 8000, name: "{{pod}}", engine: toy}}
""")
config = load_config(config_file)
sessions = open_store(config.database)


def body(running, prompt):
    return f"# TYPE toy:running gauge\\ntoy:running {running}\\ntoy:prompt_tokens_total {prompt}\\n"


for ts, running, prompt in ((1000.0, 2, 100), (1060.0, 3, 700)):
    outcomes = store_fetched(
        [Fetched(target, ts, 0.01, body(running, prompt), None) for target in config.targets],
        sessions,
    )
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
with sessions() as session:
    status = build_status(session, config, now=1060.0, window=120.0)
print(json.dumps({
    "engines": list(package.ENGINES),
    "names": package.ENGINE_NAMES,
    "engine_kinds": list(ENGINE_KINDS),
    "kinds": [t.kind for t in config.targets],
    "discovered": config.discovery.kubernetes.replicas.engine,
    "detected": package.detect_engine(body(1, 1)),
    "not_detected": package.detect_engine("vllm:num_requests_running 1\\n"),
    "auto_is_toy": package.parse_replica("auto", body(1, 2))
    == package.parse_replica("toy", body(1, 2)),
    "replicas": [
        {key: replica[key] for key in ("name", "up", "engine", "engine_generation",
                                        "requests_running", "unavailable")}
        for replica in status["replicas"]
    ],
}))
'''


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder, work = tmp_path_factory.mktemp("toy_engine"), tmp_path_factory.mktemp("toy_work")
    (folder / "toy.py").write_text(textwrap.dedent(TOY_MODULE))
    result = subprocess.run(
        [sys.executable, "-c", RUN, str(folder), str(work)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    found: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return found


def test_the_registry_finds_the_toy_module_after_the_engines_it_orders_before(
    toy: dict[str, Any],
) -> None:
    assert "toy" not in REGISTRY  # this interpreter's registry: the repository's own modules
    assert toy["engines"] == [*ENGINES, "toy"]
    assert toy["names"] == {**ENGINE_NAMES, "toy": "Toy"}


def test_the_configuration_accepts_the_toy_as_a_target_kind_and_a_discovered_engine(
    toy: dict[str, Any],
) -> None:
    assert toy["engine_kinds"] == [*ENGINES, "toy", "auto"]
    assert toy["kinds"] == ["toy", "auto"]
    assert toy["discovered"] == "toy"


def test_detection_picks_the_toy_from_its_prefix_and_auto_reads_it_as_its_kind(
    toy: dict[str, Any],
) -> None:
    assert toy["detected"] == "toy"
    assert toy["not_detected"] == "vllm"
    assert toy["auto_is_toy"] is True


def test_the_toy_s_samples_are_stored_and_reported_like_any_engine_s(
    toy: dict[str, Any],
) -> None:
    reported = {replica["name"]: replica for replica in toy["replicas"]}
    for name in ("toy-a", "toy-b"):  # its own kind, and `auto`
        replica = reported[name]
        assert replica["up"] is True
        assert (replica["engine"], replica["engine_generation"]) == ("toy", "toy-1")
        assert replica["requests_running"] == 3  # the newest scrape's
        assert replica["unavailable"]["preemptions"] == "not exposed by Toy: it never preempts"
