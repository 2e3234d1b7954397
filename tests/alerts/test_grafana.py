"""`kneepoint export grafana`: four Grafana dashboards whose every PromQL expression parses
with Prometheus's own promtool and names only series that exist: a `kneepoint:` recording
rule `kneepoint alerts export` writes for the same config, or a series a real vLLM or
dcgm-exporter exposes (the real captures), or an older vLLM's name for it beside the current
one (the generation fixtures written from vLLM's source).

Template variables: Grafana replaces `$instance` and `$host` before it sends a query; with
"All" chosen it sends each variable's `allValue` (`.*`). The tests substitute the same, so
what promtool and the parser read is what Prometheus would be sent.

Series names come from a real PromQL parser (promql-parser, the Rust parser GreptimeDB
uses, through its Python binding): every vector selector in the tree, inside rate(),
histogram_quantile(), `or` and `and on`, with its metric name."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from alerts.grafana import dashboards, expressions
from kneepoint.cli import app
from kneepoint.config import parse_config
from tests.conftest import DCGM_L4, DCGM_T4, OWN_FIXTURES, VLLM_032, read, require_real

CONFIG = """
slos:
  - {name: interactive-ttft, metric: ttft, threshold: 0.5s, objective: 0.99, window: 30d}
  - {name: smooth-streaming, metric: itl, threshold: 0.1s, objective: 0.95, window: 7d}
  - {name: serving, kind: availability, objective: 0.999}
"""
FILES = {
    "kneepoint-overview.json",
    "kneepoint-capacity.json",
    "kneepoint-prefix-cache.json",
    "kneepoint-slos.json",
}
# Real /metrics captures: vLLM 0.32.0 (three servers) and dcgm-exporter (two GPUs).
REAL = [
    VLLM_032,
    OWN_FIXTURES / "vllm-0.32.0-cpu-ngram-spec-decode.prom",
    OWN_FIXTURES / "vllm-0.32.0-cpu-preemption-under-load.prom",
    DCGM_L4,
    DCGM_T4,
]
# Older vLLM generations, written from each release's metrics source (docs/reference/metrics.md).
GENERATIONS = [
    OWN_FIXTURES / "vllm-0.5.5-v0.prom",
    OWN_FIXTURES / "vllm-0.8.5-v1.prom",
    OWN_FIXTURES / "vllm-0.10.2-dp2.prom",
]
# Grafana's unit ids the panels may use, and its custom "suffix:<text>" unit.
GRAFANA_UNITS = {"percentunit", "s", "short", "reqps", "watt", "celsius", "mbytes"}


def exposed(paths: list[Path]) -> set[str]:
    """Every sample name in the captures, as prometheus_client's text parser reads them."""
    return {
        sample.name
        for path in paths
        for family in text_string_to_metric_families(read(path))
        for sample in family.samples
    }


REAL_SERIES = exposed(REAL)
OLD_SERIES = exposed(GENERATIONS) - REAL_SERIES


def selectors(expr: str) -> list[str | None]:
    """The metric name of every vector selector in `expr` (None: a selector without one)."""
    names: list[str | None] = []

    def visit(node: Any) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            names.append(node.name)
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


def unknown_series(expr: str, records: set[str]) -> list[str]:
    """What in `expr` names no series that exists; [] when all is well."""
    problems = []
    names = selectors(expr)
    for name in names:
        if name is None:
            problems.append("a selector without a metric name")
        elif name.startswith("kneepoint:"):
            if name not in records:
                problems.append(f"{name}: not a recording rule `kneepoint alerts export` writes")
        elif name not in REAL_SERIES and name not in OLD_SERIES:
            problems.append(f"{name}: in no vLLM or dcgm-exporter capture")
    if any(n in OLD_SERIES for n in names) and not any(
        n in records or n in REAL_SERIES for n in names
    ):
        problems.append("only older generations' names, none a current vLLM exposes")
    return problems


def substitute(expr: str, board: dict[str, Any]) -> str:
    """`expr` as Grafana sends it with "All" chosen for every query variable."""
    variables = [v for v in board["templating"]["list"] if v["type"] == "query"]
    for variable in sorted(variables, key=lambda v: -len(v["name"])):
        for spelling in (f"${{{variable['name']}}}", f"${variable['name']}"):
            expr = expr.replace(spelling, variable["allValue"])
    assert "$" not in expr, f"a variable the dashboard does not define: {expr}"
    return expr


def label_values_metric(query: str) -> str:
    """The metric of a Grafana `label_values(metric, label)` variable query."""
    found = re.fullmatch(r"label_values\(([^,()]+),\s*\w+\)", query)
    assert found, query
    return found.group(1).strip()


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        require_real("no promtool (apt-get install prometheus)")
    return str(found)


def write_config(tmp_path: Path, extra: str = "") -> Path:
    config = tmp_path / "kneepoint.yaml"
    config.write_text(f"database: sqlite:///{tmp_path / 'k.db'}\n{CONFIG}{extra}")
    return config


def export(config: Path, out: Path) -> tuple[dict[str, dict[str, Any]], set[str]]:
    """The dashboards `kneepoint export grafana` writes, and the recording rules `kneepoint
    alerts export` writes for the same config."""
    runner = CliRunner()
    result = runner.invoke(app, ["export", "grafana", "--out", str(out), "--config", str(config)])
    assert result.exit_code == 0, result.output
    rules = runner.invoke(app, ["alerts", "export", "--config", str(config)])
    assert rules.exit_code == 0, rules.output
    records = {
        rule["record"]
        for group in yaml.safe_load(rules.stdout)["groups"]
        for rule in group["rules"]
        if "record" in rule
    }
    boards = {path.name: json.loads(path.read_text()) for path in out.iterdir()}
    return boards, records


@pytest.fixture
def exported(tmp_path: Path) -> tuple[dict[str, dict[str, Any]], set[str]]:
    return export(write_config(tmp_path), tmp_path / "grafana")


def checked_expressions(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL as sent) for every panel target and every variable's metric."""
    found = [(title, substitute(expr, board)) for title, expr in expressions(board)]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            found.append((f"${variable['name']}", label_values_metric(variable["query"])))
    return found


def test_the_cli_writes_four_grafana_dashboards(
    exported: tuple[dict[str, dict[str, Any]], set[str]],
) -> None:
    boards, _ = exported
    assert set(boards) == FILES
    uids = set()
    for name, board in boards.items():
        assert isinstance(board["schemaVersion"], int), name
        assert isinstance(board["annotations"]["list"], list), name  # Grafana reads it on load
        assert board["title"].startswith("kneepoint: ") and board["description"], name
        uids.add(board["uid"])
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"
        for shown in ("instance", "host"):
            assert variables[shown]["includeAll"] and variables[shown]["multi"], shown
            assert variables[shown]["datasource"]["uid"] == "${datasource}"
        panels = [p for p in board["panels"] if p["type"] != "row"]
        assert panels, name
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids)), f"{name}: panel ids repeat"
        for panel in panels:
            where = f"{name}: {panel.get('title')}"
            assert panel["title"] and panel["description"], where
            unit = panel["fieldConfig"]["defaults"]["unit"]
            assert unit in GRAFANA_UNITS or unit.startswith("suffix:"), f"{where}: unit {unit}"
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
            assert panel["targets"] and all(t["expr"] and t["refId"] for t in panel["targets"])
            assert set(panel["gridPos"]) == {"x", "y", "w", "h"}, where
    assert len(uids) == len(FILES)
    slos = [p["title"] for p in boards["kneepoint-slos.json"]["panels"] if p["type"] == "row"]
    assert [t.split(":")[0] for t in slos if t.startswith("SLO ")] == [
        "SLO interactive-ttft",
        "SLO smooth-streaming",
        "SLO serving",
    ]


def test_every_expression_parses_with_promtool(
    exported: tuple[dict[str, dict[str, Any]], set[str]], tmp_path: Path
) -> None:
    boards, _ = exported
    tool = promtool()
    for name, board in boards.items():
        found = checked_expressions(board)
        rules = {
            "groups": [
                {
                    "name": name,
                    "rules": [
                        {"record": f"grafana_check:expr_{i}", "expr": expr}
                        for i, (_, expr) in enumerate(found)
                    ],
                }
            ]
        }
        path = tmp_path / f"{name}.rules.yml"
        path.write_text(yaml.safe_dump(rules, sort_keys=False, width=10_000))
        check = subprocess.run([tool, "check", "rules", str(path)], capture_output=True, text=True)
        assert check.returncode == 0, f"{name}: {check.stdout}{check.stderr}"
        assert f"SUCCESS: {len(found)} rules found" in check.stdout, check.stdout


def test_promtool_rejects_a_broken_expression(tmp_path: Path) -> None:
    """The check above can fail: the same file with one unbalanced expression is refused."""
    rules = {"groups": [{"name": "g", "rules": [{"record": "a:b", "expr": "sum(rate(x[5m])"}]}]}
    path = tmp_path / "broken.yml"
    path.write_text(yaml.safe_dump(rules))
    check = subprocess.run(
        [promtool(), "check", "rules", str(path)], capture_output=True, text=True
    )
    assert check.returncode != 0


def test_every_expression_names_only_series_that_exist(
    exported: tuple[dict[str, dict[str, Any]], set[str]],
) -> None:
    boards, records = exported
    problems = []
    used: set[str] = set()
    for name, board in boards.items():
        for where, expr in checked_expressions(board):
            used.update(n for n in selectors(expr) if n)
            problems += [f"{name} / {where}: {p}" for p in unknown_series(expr, records)]
    assert problems == []
    # The dashboards do read the recording rules, and each kind of raw series.
    assert used & records
    assert any(n.startswith("vllm:") for n in used - records)
    assert any(n.startswith("DCGM_FI_") for n in used)


# What Prometheus would hold after scraping the real captures for 15 minutes: two vLLM 0.32
# replicas (prefix caching; speculative decoding) and an L4's dcgm-exporter, each series with
# the instance and job labels a scrape adds, counters growing 1 % of their value a minute,
# gauges flat, and `up`, which Prometheus writes for each vLLM target itself.
SCRAPED = {
    VLLM_032: {"instance": "vllm-a:8000", "job": "vllm"},
    OWN_FIXTURES / "vllm-0.32.0-cpu-ngram-spec-decode.prom": {
        "instance": "vllm-b:8000",
        "job": "vllm",
    },
    DCGM_L4: {"instance": "gpu-node-1:9400", "job": "dcgm"},
}
COUNTED = ("counter", "histogram", "summary")
# Panels that rightly show nothing on these captures, with why.
EMPTY_HERE = {
    "GPUs with an XID error": "no capture has an XID (no series until a GPU reports one)",
}


def input_series() -> list[dict[str, str]]:
    series = []
    for path, added in SCRAPED.items():
        for family in text_string_to_metric_families(read(path)):
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                labels = {**sample.labels, **added}
                text = ",".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items()))
                grows = family.type in COUNTED
                values = (
                    f"{sample.value!r}+{sample.value * 0.01!r}x15"
                    if grows
                    else (f"{sample.value!r}x15")
                )
                series.append({"series": f"{sample.name}{{{text}}}", "values": values})
        if added["job"] == "vllm":
            labels_text = f'instance="{added["instance"]}",job="vllm"'
            series.append({"series": f"up{{{labels_text}}}", "values": "1x15"})
    return series


def empty_on_the_captures(exprs: list[str], rule_files: list[Path], tmp_path: Path) -> set[int]:
    """Which of `exprs` Prometheus's rule engine (promtool test rules) evaluates to nothing
    at minute 10 over SCRAPED, with `rule_files` (the recording rules) loaded: each
    expression becomes an alert on `absent(expr)`, expected not to fire."""
    check = tmp_path / "grafana-check.yml"
    alerts = [{"alert": f"grafana_empty_{i}", "expr": f"absent({e})"} for i, e in enumerate(exprs)]
    check.write_text(
        yaml.safe_dump({"groups": [{"name": "grafana", "rules": alerts}]}, width=10**5)
    )
    spec = tmp_path / "grafana-test.yml"
    test = {
        "interval": "1m",
        "input_series": input_series(),
        "alert_rule_test": [
            {"eval_time": "10m", "alertname": f"grafana_empty_{i}", "exp_alerts": []}
            for i in range(len(exprs))
        ],
    }
    document = {
        "rule_files": [str(f) for f in (*rule_files, check)],
        "evaluation_interval": "1m",
        "tests": [test],
    }
    spec.write_text(yaml.safe_dump(document, sort_keys=False, width=10**5))
    run = subprocess.run([promtool(), "test", "rules", str(spec)], capture_output=True, text=True)
    fired = {
        int(i) for i in re.findall(r"alertname: grafana_empty_(\d+),", run.stdout + run.stderr)
    }
    assert (run.returncode == 0) == (not fired), run.stdout + run.stderr
    return fired


def test_every_panel_shows_data_in_prometheus_over_the_real_captures(
    exported: tuple[dict[str, dict[str, Any]], set[str]], tmp_path: Path
) -> None:
    """Prometheus itself evaluates every panel's expression, with the rules file `kneepoint
    alerts export` writes loaded, over the captures' series: each one returns data (NaN
    counts: an idle cache's 0/0), so no panel reads a name, label value or join that matches
    nothing (the bucket bound of an SLO's threshold, a status code, a record)."""
    boards, _ = exported
    rules = tmp_path / "kneepoint-rules.yml"
    config = tmp_path / "kneepoint.yaml"
    result = CliRunner().invoke(app, ["alerts", "export", "--config", str(config)])
    assert result.exit_code == 0, result.output
    rules.write_text(result.stdout)
    panels = [
        (f"{name} / {title}", substitute(expr, board))
        for name, board in sorted(boards.items())
        for title, expr in expressions(board)
    ]
    empty = empty_on_the_captures([e for _, e in panels], [rules], tmp_path)
    shown_empty = {panels[i][0].split(" / ", 1)[1] for i in empty}
    assert shown_empty == set(EMPTY_HERE), [panels[i] for i in sorted(empty)]


def test_prometheus_finds_nothing_under_a_name_without_total(tmp_path: Path) -> None:
    """The evaluation above can fail: the field's `vllm:num_preemptions` is empty on a real
    vLLM's series where `vllm:num_preemptions_total` is not; so is a record not loaded."""
    exprs = [
        "sum by (instance) (rate(vllm:num_preemptions[5m]))",
        "sum by (instance) (rate(vllm:num_preemptions_total[5m]))",
        'kneepoint:kv_cache_occupancy{instance=~".*"}',
    ]
    assert empty_on_the_captures(exprs, [], tmp_path) == {0, 2}


def test_the_series_check_flags_names_that_do_not_exist() -> None:
    records = {"kneepoint:preemptions_per_second"}
    # The field's bug: vLLM's and llm-d's example rules drop `_total` and never fire.
    assert unknown_series("sum by (instance) (rate(vllm:num_preemptions[5m])) > 0", records) == [
        "vllm:num_preemptions: in no vLLM or dcgm-exporter capture"
    ]
    assert unknown_series("rate(vllm:num_preemptions_total[5m])", records) == []
    assert unknown_series("kneepoint:ttft_p99_seconds > 2", records) == [
        "kneepoint:ttft_p99_seconds: not a recording rule `kneepoint alerts export` writes"
    ]
    assert unknown_series('{__name__=~"vllm:.*"}', records)[0] == (
        "a selector without a metric name"
    )
    # An old generation's name passes beside a current one, not alone.
    assert unknown_series("vllm:kv_cache_usage_perc or vllm:gpu_cache_usage_perc", records) == []
    assert unknown_series("vllm:gpu_cache_usage_perc", records) == [
        "only older generations' names, none a current vLLM exposes"
    ]


def test_a_recorded_latency_rule_is_read_from_its_record(tmp_path: Path) -> None:
    """With a rule on ttft_p99_seconds the export writes kneepoint:ttft_p99_seconds, and the
    overview reads it; without one it reads vLLM's histogram (no record to read)."""
    rule = """rules:
  - {name: slow-first-token, metric: ttft_p99_seconds, op: ">", threshold: 2}
"""
    with_rule, records = export(write_config(tmp_path, rule), tmp_path / "with")
    assert "kneepoint:ttft_p99_seconds" in records
    (tmp_path / "plain").mkdir()
    plain, plain_records = export(write_config(tmp_path / "plain"), tmp_path / "plain" / "out")
    assert "kneepoint:ttft_p99_seconds" not in plain_records

    def ttft(boards: dict[str, dict[str, Any]]) -> str:
        board = boards["kneepoint-overview.json"]
        return next(e for t, e in expressions(board) if t.startswith("Time to first token"))

    assert ttft(with_rule).startswith("kneepoint:ttft_p99_seconds{")
    assert "vllm:time_to_first_token_seconds_bucket" in ttft(plain)


def test_each_slo_shows_its_threshold_objective_and_budget() -> None:
    config = parse_config(f"database: sqlite:///k.db\n{CONFIG}", source="test")
    board = dashboards(set(), config.slos)["kneepoint-slos.json"]
    quantile = [p for p in board["panels"] if p.get("title", "").endswith("objective's quantile")]
    # One per latency SLO, each with its threshold (0.5 s, 0.1 s) as the red step.
    assert [p["fieldConfig"]["defaults"]["thresholds"]["steps"][-1]["value"] for p in quantile] == [
        slo.threshold for slo in config.slos if slo.kind == "latency"
    ]
    burn = [p for p in board["panels"] if p.get("title") == "Burn rate"]
    assert len(burn) == len(config.slos)
    assert all(len(p["targets"]) == 4 for p in burn)

    def steps(title: str) -> list[list[Any]]:
        return [
            [
                (step["value"], step["color"])
                for step in p["fieldConfig"]["defaults"]["thresholds"]["steps"]
            ]
            for p in board["panels"]
            if p.get("title") == title
        ]

    # Red below, green from: no budget left, and compliance under the objective.
    assert steps("Error budget left") == [[(None, "red"), (0, "green")]] * len(config.slos)
    assert steps("Compliance") == [[(None, "red"), (slo.objective, "green")] for slo in config.slos]


def test_an_unwritable_out_exits_non_zero_with_a_clear_message(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    result = CliRunner().invoke(
        app, ["export", "grafana", "--out", str(blocker / "dashboards"), "--config", str(config)]
    )
    assert result.exit_code == 1
    assert f"cannot write the dashboards to {blocker / 'dashboards'}" in result.stderr
    assert "Not a directory" in result.stderr
    assert not (blocker.parent / "dashboards").exists()
