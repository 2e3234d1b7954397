"""Prometheus mode's own logic: scrapes rebuilt from a range query read exactly like the
target's own body. (Against a real Prometheus: tests/real/test_prometheus_source.py.)"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from collectors.dcgm import parse_dcgm
from collectors.engines.vllm import WANTED, parse_vllm
from collectors.prometheus_api import FAMILIES, instance_of, rebuild, selector
from kneepoint.cli import app
from kneepoint.config import ConfigError, Target, parse_config
from tests.conftest import DCGM_T4, VLLM_032, free_port, migrated, read


def as_prometheus_stores_it(text: str, instance: str, times: list[float]) -> list[dict[str, Any]]:
    """What a range query returns for one target scraped at `times` with this body: one
    series per sample, with Prometheus's `job` and `instance` labels added."""
    series = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = {**sample.labels, "__name__": sample.name, "job": "j", "instance": instance}
            series.append({"metric": labels, "values": [[t, repr(sample.value)] for t in times]})
    return series


def test_a_rebuilt_scrape_reads_exactly_like_the_target_s_body() -> None:
    body = read(VLLM_032)
    scrapes = rebuild(as_prometheus_stores_it(body, "10.0.0.1:8000", [100.0, 115.0]), {})
    assert [(s.instance, s.ts) for s in scrapes] == [
        ("10.0.0.1:8000", 100.0),
        ("10.0.0.1:8000", 115.0),
    ]
    assert parse_vllm(scrapes[0].body) == parse_vllm(body)


def test_dcgm_keeps_every_gpu_and_its_identity() -> None:
    body = read(DCGM_T4)
    (scrape,) = rebuild(as_prometheus_stores_it(body, "node:9400", [50.0]), {})
    assert parse_dcgm(scrape.body, default_host="x") == parse_dcgm(body, default_host="x")


def test_only_scrapes_newer_than_the_last_stored_come_back() -> None:
    series = as_prometheus_stores_it(read(VLLM_032), "a:1", [10.0, 20.0, 30.0])
    series += as_prometheus_stores_it(read(VLLM_032), "b:1", [10.0, 20.0])
    scrapes = rebuild(series, {"a:1": 20.0})
    assert [(s.instance, s.ts) for s in scrapes] == [("b:1", 10.0), ("b:1", 20.0), ("a:1", 30.0)]


def test_label_values_that_need_escaping_survive() -> None:
    value = 'say "hi"\\n\nback\\slash'
    series = [
        {"metric": {"__name__": "vllm:x", "instance": "a:1", "m": value}, "values": [[1, "2"]]}
    ]
    (scrape,) = rebuild(series, {})
    (family,) = text_string_to_metric_families(scrape.body)
    assert family.samples[0].labels == {"m": value}


def test_the_selector_asks_only_for_the_series_kneepoint_stores() -> None:
    assert selector('{job="vllm"}', "vllm") == '{job="vllm", __name__=~"' + FAMILIES["vllm"] + '"}'
    assert selector("", "dcgm") == '{__name__=~"' + FAMILIES["dcgm"] + '"}'
    vllm, dcgm = (re.compile(FAMILIES[kind]) for kind in ("vllm", "dcgm"))  # PromQL anchors
    assert all(vllm.fullmatch(name) for name in WANTED)
    assert vllm.fullmatch("vllm_num_requests_running")  # Ray's spelling
    assert not vllm.fullmatch("vllm:request_params_n_bucket")
    assert not vllm.fullmatch("vllm:num_requests_running_created")
    assert dcgm.fullmatch("DCGM_FI_DEV_GPU_UTIL")
    assert not dcgm.fullmatch("DCGM_FI_DEV_PCIE_REPLAY_COUNTER")
    for body, parse in (
        (read(VLLM_032), parse_vllm),
        (read(DCGM_T4), lambda t: parse_dcgm(t, "x")),
    ):
        kept = "".join(
            line + "\n"
            for line in body.splitlines()
            if line.startswith("#")
            or any(m.fullmatch(line.split("{")[0].split(" ")[0]) for m in (vllm, dcgm))
        )
        assert parse(kept) == parse(body)  # nothing a normalizer reads is left out


def test_a_target_is_the_instance_at_its_address_unless_named() -> None:
    assert (
        instance_of(Target(name="a", kind="vllm", url="http://gpu-1:8000/metrics")) == "gpu-1:8000"
    )
    assert instance_of(Target(name="a", kind="dcgm", url="http://gpu-1/metrics")) == "gpu-1:80"
    named = Target(name="a", kind="vllm", url="http://x:1/metrics", instance="vllm-0")
    assert instance_of(named) == "vllm-0"


def test_a_selector_must_be_a_braced_matcher_list() -> None:
    with pytest.raises(ConfigError, match="vllm_selector"):
        parse_config(
            "database: sqlite://\nprometheus: {url: 'http://p:9090', vllm_selector: 'job=vllm'}\n"
        )


def test_an_unreachable_prometheus_is_one_clear_error(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there: a real refusal
    config = tmp_path / "kneepoint.yaml"
    config.write_text(
        f"database: sqlite:///{tmp_path / 'k.db'}\n"
        f"prometheus: {{url: 'http://127.0.0.1:{port}', timeout: 2s}}\n"
        "targets:\n  - {name: a, kind: vllm, url: 'http://10.0.0.1:8000/metrics'}\n"
    )
    migrated(config)
    result = CliRunner().invoke(app, ["collect", "--once", "--config", str(config)])
    assert result.exit_code == 1
    assert f"kneepoint: cannot read http://127.0.0.1:{port}" in result.output
