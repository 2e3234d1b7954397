"""The published validation read back: the table's worst misses and verdicts come from the
rows, and a change is inside the validated range exactly where the bench tried it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kneepoint.whatif import validation


def _row(
    change: str,
    setting: dict[str, Any],
    calibrated: dict[str, Any],
    load: int,
    throughput: float,
    ttft: float,
    ratio: float | None,
) -> dict[str, Any]:
    return {
        "change": change,
        "setting": setting,
        "calibrated": calibrated,
        "load": load,
        "past_knee": load > 4,
        "metrics": {
            "throughput": {
                "measured": 100.0,
                "predicted": 100.0 * (1 + throughput),
                "error": throughput,
                "aim": 0.10,
                "met": abs(throughput) <= 0.10,
            },
            "ttft_p95": {
                "measured": 1.0,
                "predicted": 1 + ttft,
                "error": ttft,
                "aim": 0.25,
                "met": abs(ttft) <= 0.25,
            },
            "ttft_p50": {"measured": 0.5, "predicted": 0.5, "error": 0.0, "aim": None, "met": None},
            "preemptions": {
                "measured": 10,
                "predicted": None if ratio is None else 10 / ratio,
                "ratio": ratio,
                "aim": 1.5,
                "met": None if ratio is None else 1 / 1.5 <= ratio <= 1.5,
            },
        },
    }


DOCUMENT: dict[str, Any] = {
    "aims": {
        "throughput": 0.10,
        "ttft_p95": 0.25,
        "itl_p95": 0.25,
        "preemptions_ratio": 1.5,
        "preemptions_per_minute_floor": 1.0,
    },
    "rows": [
        _row("num_gpu_blocks", {"num_gpu_blocks": 48}, {"num_gpu_blocks": 96}, 2, 0.03, -0.1, None),
        _row("num_gpu_blocks", {"num_gpu_blocks": 48}, {"num_gpu_blocks": 96}, 8, -0.08, 0.4, 0.5),
        _row(
            "enable_prefix_caching",
            {"enable_prefix_caching": False},
            {"enable_prefix_caching": True},
            8,
            0.02,
            0.1,
            None,
        ),
        _row("replicas", {"replicas": 2}, {"replicas": 1}, 8, 0.05, 0.2, None),
    ],
}


def test_the_summary_takes_the_worst_miss_over_loads_and_counts_the_aims_met() -> None:
    blocks, prefix, replicas = validation.summary(DOCUMENT)
    assert blocks.change == "num_gpu_blocks" and blocks.loads == (2.0, 8.0)
    assert blocks.worst["throughput"] == 0.08
    assert blocks.worst["ttft_p95"] == 0.4
    assert blocks.worst["preemptions"] == 2.0  # a ratio of 0.5 misses by ×2
    assert blocks.met["throughput"] == (2, 2) and blocks.all_met("throughput") is True
    assert blocks.met["ttft_p95"] == (1, 2) and blocks.all_met("ttft_p95") is False
    assert blocks.all_met("itl_p95") is None  # not measured: neither met nor missed
    assert prefix.worst["throughput"] == 0.02 and replicas.settings == ("replicas=2 (was 1)",)


def test_the_markdown_table_marks_each_aim_met_or_missed() -> None:
    table = validation.markdown(DOCUMENT)
    lines = table.splitlines()
    assert lines[0].startswith("| change | settings | loads | throughput | TTFT p95")
    blocks = next(line for line in lines if line.startswith("| KV blocks"))
    assert "8.0% ✓" in blocks and "40.0% ✗" in blocks and "×2.00 ✗" in blocks
    assert "within 10%" in table


def test_a_change_inside_the_tried_ratios_is_validated_and_one_outside_is_not() -> None:
    shape = {"num_gpu_blocks": 1000, "enable_prefix_caching": True}
    inside = validation.judge(DOCUMENT, {"num_gpu_blocks": 700}, shape)
    assert inside.validated and inside.reasons == ()
    assert inside.errors["throughput"] == 0.08
    outside = validation.judge(DOCUMENT, {"num_gpu_blocks": 250}, shape)
    assert not outside.validated and "0.25× the calibrated value" in outside.reasons[0]
    more = validation.judge(DOCUMENT, {"num_gpu_blocks": 2000}, shape)
    assert not more.validated  # only fewer blocks were tried


def test_switches_replicas_and_never_validated_changes() -> None:
    shape = {"enable_prefix_caching": True}
    assert validation.judge(DOCUMENT, {"enable_prefix_caching": False}, shape).validated
    assert validation.judge(DOCUMENT, {"replicas": 2, "routing": "sticky"}, shape).validated
    three = validation.judge(DOCUMENT, {"replicas": 3}, shape)
    assert not three.validated and "validated up to 2" in three.reasons[0]
    robin = validation.judge(DOCUMENT, {"replicas": 2, "routing": "round-robin"}, shape)
    assert not robin.validated and "round-robin" in robin.reasons[0]
    fp8 = validation.judge(DOCUMENT, {"kv_cache_dtype": "fp8"}, shape)
    assert not fp8.validated and "fp8" in fp8.reasons[0]
    unknown = validation.judge(DOCUMENT, {"max_num_seqs": 8}, {"max_num_seqs": 64})
    assert not unknown.validated and "not validated" in unknown.reasons[0]
    assert not validation.judge(None, {"num_gpu_blocks": 700}, {"num_gpu_blocks": 1000}).validated


def test_load_reads_the_file_and_a_missing_one_is_none(tmp_path: Path) -> None:
    path = tmp_path / "validation.json"
    assert validation.load(path) is None
    path.write_text(json.dumps(DOCUMENT))
    assert validation.load(path) == DOCUMENT


def test_the_readme_and_the_how_to_show_the_published_table_as_it_is() -> None:
    """The README's and the how-to's tables are validation.json's, not a copy that drifts:
    `bench/whatif_validation.py --markdown` prints the block to paste between the markers."""
    document = validation.load()
    assert document is not None, "kneepoint/whatif/validation.json is shipped with the package"
    table = validation.markdown(document)
    root = Path(__file__).resolve().parents[2]
    for page in ("README.md", "docs/how-to/whatif.md"):
        text = (root / page).read_text()
        start, end = "<!-- validation-table -->\n", "\n<!-- /validation-table -->"
        assert start in text and end in text, page
        shown = text.split(start, 1)[1].split(end, 1)[0]
        assert shown == table, f"{page}: paste `bench/whatif_validation.py --markdown`"
