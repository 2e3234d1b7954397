"""Every engine's normalizer on bad input: real captures, mutated (label values, values,
bucket bounds, missing, duplicated and reordered series, non-UTF-8 bytes), give either a
sample whose every number is finite (or None) and whose sizes stay within collectors/parse.py's
bounds, or ScrapeFormatError, the documented "bad scrape" error; never another exception, and
never memory in proportion to a label's value. Then the cases found, one by one, and one
collection round in which a target serving such a body is down while another is stored."""

from __future__ import annotations

import dataclasses
import math
import re
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from collectors.collect import collect_once
from collectors.dcgm import MAX_GPU_INDEX, parse_dcgm
from collectors.engines.llamacpp import parse_llamacpp
from collectors.engines.sglang import parse_sglang
from collectors.engines.tgi import parse_tgi
from collectors.engines.trtllm import parse_trtllm
from collectors.engines.vllm import parse_vllm
from collectors.parse import MAX_BUCKETS, MAX_INT, MAX_POSITIONS, ScrapeFormatError
from kneepoint.config import Config, Target
from kneepoint.samples import GpuSample, Histogram, ReplicaSample
from tests.conftest import OWN_FIXTURES, SHARED_FIXTURES, VLLM_032, MetricsServer, Route

Sample = ReplicaSample | list[GpuSample]

PARSERS: dict[str, Callable[[str], Sample]] = {
    "vllm": parse_vllm,
    "sglang": parse_sglang,
    "llamacpp": parse_llamacpp,
    "tgi": parse_tgi,
    "trtllm": parse_trtllm,
    "dcgm": lambda text: parse_dcgm(text, "node-0"),
}
CAPTURES: dict[str, list[str]] = {
    engine: [
        path.read_text(encoding="utf-8")
        for folder in (OWN_FIXTURES, SHARED_FIXTURES)
        for path in sorted(folder.glob(f"{engine}*.prom"))
    ]
    for engine in PARSERS
}
# Lines naming each engine's label-derived sizes, added with a mutated label value.
INJECTED: dict[str, tuple[str, ...]] = {
    "vllm": (
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="{v}"} 7',
        'vllm:kv_cache_usage_perc{engine="{v}",model_name="tiny"} {n}',
        'vllm:cache_config_info{block_size="{v}",num_gpu_blocks="{v}",'
        'gpu_memory_utilization="{v}"} 1',
        'vllm:time_to_first_token_seconds_bucket{engine="0",le="{v}"} {n}',
    ),
    "sglang": (
        'sglang:num_running_reqs{dp_rank="{v}",pp_rank="0",tp_rank="{v}"} {n}',
        'sglang:cache_config_info{page_size="{v}",num_pages="{v}"} 1',
        'sglang:max_total_num_tokens{dp_rank="{v}"} {n}',
        'sglang:token_usage{dp_rank="{v}",tp_rank="0"} {n}',
    ),
    "llamacpp": ('llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="{v}"} {n}',),
    "tgi": ('tgi_request_duration_bucket{le="{v}"} {n}', "tgi_batch_max_total_tokens {n}"),
    "trtllm": (
        'trtllm_spec_decode_drafted_tokens_total{token_position="{v}"} {n}',
        'trtllm_spec_decode_accepted_tokens_total{token_position="{v}"} {n}',
        'trtllm_kv_cache_max_blocks{pid="{v}"} {n}',
    ),
    "dcgm": ('DCGM_FI_DEV_GPU_TEMP{gpu="{v}",UUID="GPU-x",Hostname="{v}"} {n}',),
}
# Labels whose values size something or are read as numbers.
INDEX_LABELS = ("position", "token_position", "gpu", "tp_rank", "dp_rank", "pp_rank", "engine")
LABEL_VALUES = st.one_of(
    # Beyond any bound: a list built up to "50000000" is 400 MB; int() refuses 5,000 digits.
    st.sampled_from(["50000000", "9" * 5000, "1e999", "1e18"]),
    st.sampled_from(
        [
            "",
            "abc",
            "-1",
            "nan",
            "+Inf",
            "-Inf",
            "²",  # str.isdigit() says yes, int() says no
            "٣",
            " 5",
            "0",
            str(MAX_POSITIONS - 1),
            str(MAX_POSITIONS),
            str(MAX_GPU_INDEX + 1),
        ]
    ),
    # What a decoded body can hold: no surrogates (errors="replace" leaves none).
    st.text(st.characters(blacklist_characters='"\\\n', blacklist_categories=("Cs",)), max_size=12),
)
VALUES = st.one_of(
    st.sampled_from(
        [
            "1e308",
            "1.7976931348623157e308",
            "-1e308",
            "-1",
            "NaN",
            "+Inf",
            "-Inf",
            "0",
            "4e-320",
            "18446744073709551616",
            "9.3e18",
            "1e999",
        ]
    ),
    st.floats().map(repr),
)
LE_VALUES = st.sampled_from(["NaN", "-Inf", "+Inf", "abc", "", "1e999", "-1", "0", "1e-320"])
JUNK = st.one_of(
    st.sampled_from([b"\xff", b"\xc3", b"\x80\x80", b"\xed\xa0\x80", b"\x00", b"\xef\xbb\xbf"]),
    st.binary(min_size=1, max_size=8),
)
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"')


def _pick(draw: st.DrawFn, items: list[int]) -> int:
    return items[draw(st.integers(0, len(items) - 1))]


def _mutate(draw: st.DrawFn, engine: str, lines: list[str]) -> None:
    """One mutation of `lines` (a capture split at newlines), in place."""
    samples = [i for i, line in enumerate(lines) if line and line[0] != "#"]
    kind = draw(
        st.sampled_from(
            ["label", "value", "le", "drop", "drop_inf", "duplicate", "reorder", "inject"]
        )
    )
    if not samples:
        kind = "inject"
    if kind == "label":
        # Mostly a label that sizes something, where the capture has one.
        indexed = [i for i in samples if any(f'{lbl}="' in lines[i] for lbl in INDEX_LABELS)]
        labelled = [i for i in samples if "{" in lines[i]]
        pool = indexed if indexed and draw(st.booleans()) else labelled
        if pool:
            i = _pick(draw, pool)
            found = list(_LABEL.finditer(lines[i]))
            if found:
                match = found[draw(st.integers(0, len(found) - 1))]
                value = draw(LABEL_VALUES)
                lines[i] = lines[i][: match.start(2)] + value + lines[i][match.end(2) :]
    elif kind == "value":
        i = _pick(draw, samples)
        head, _, _ = lines[i].rpartition(" ")
        lines[i] = f"{head} {draw(VALUES)}"
    elif kind == "le":
        buckets = [i for i in samples if 'le="' in lines[i]]
        if buckets:
            i = _pick(draw, buckets)
            if draw(st.booleans()):  # another bucket's bound: a duplicated one
                bound = re.search(r'le="([^"]*)"', lines[_pick(draw, buckets)])
                value = bound.group(1) if bound else "1"
            else:
                value = draw(LE_VALUES)
            lines[i] = re.sub(r'le="[^"]*"', f'le="{value}"', lines[i])
    elif kind == "drop":
        del lines[_pick(draw, samples)]
    elif kind == "drop_inf":  # every +Inf bucket missing
        lines[:] = [line for line in lines if 'le="+Inf"' not in line]
    elif kind == "duplicate":
        i = _pick(draw, samples)
        copy = lines[i]
        if draw(st.booleans()):
            copy = f"{copy.rpartition(' ')[0]} {draw(VALUES)}"
        lines.insert(draw(st.integers(0, len(lines))), copy)
    elif kind == "reorder":  # a stretch of lines in another order: unsorted buckets
        start = draw(st.integers(0, len(lines) - 1))
        stretch = lines[start : start + 40]
        lines[start : start + 40] = draw(st.permutations(stretch))
    else:
        _inject(draw, engine, lines)


def _inject(draw: st.DrawFn, engine: str, lines: list[str]) -> None:
    template = draw(st.sampled_from(INJECTED[engine]))
    line = template.replace("{v}", draw(LABEL_VALUES)).replace("{n}", draw(VALUES))
    lines.insert(draw(st.integers(0, len(lines))), line)


@st.composite
def bad_bodies(draw: st.DrawFn, engine: str) -> str:
    # Without the final newline, so no mutation makes every body truncated (that is refused
    # before anything is read).
    lines = draw(st.sampled_from(CAPTURES[engine])).removesuffix("\n").split("\n")
    if draw(st.booleans()):  # half the bodies: a line of this engine's label-derived sizes
        _inject(draw, engine, lines)
    for _ in range(draw(st.integers(0 if len(lines) > 1 else 1, 4))):
        _mutate(draw, engine, lines)
    text = "\n".join(lines) + "\n"
    if draw(st.booleans()):
        # Non-UTF-8 bytes, decoded as collectors/scrape.py decodes a body: UTF-8 (or the
        # declared charset) with errors="replace".
        data = text.encode("utf-8")
        at = draw(st.integers(0, len(data)))
        text = (data[:at] + draw(JUNK) + data[at:]).decode("utf-8", errors="replace")
    return text


PEAK_CAP = 50 * 2**20  # bytes per parse; a 50-million-entry list alone is 400 MB


def run(engine: str, text: str) -> tuple[Sample | ScrapeFormatError, int]:
    """The normalizer's sample or its ScrapeFormatError, and the peak memory it allocated.
    Any other exception propagates: that is a failure."""
    tracemalloc.start()
    try:
        try:
            result: Sample | ScrapeFormatError = PARSERS[engine](text)
        except ScrapeFormatError as error:
            result = error
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return result, peak


def non_finite(item: object, where: str = "sample") -> list[str]:
    """Every number in `item` that is NaN or infinite, or an integer beyond 64 bits (a
    histogram's last bound may be +Inf), by where it is."""
    if isinstance(item, bool) or item is None or isinstance(item, str):
        return []
    if isinstance(item, float):
        return [] if math.isfinite(item) else [f"{where}={item}"]
    if isinstance(item, int):
        return [] if abs(item) <= MAX_INT else [f"{where}={item}"]
    if isinstance(item, Histogram):
        bounds = item.bounds[:-1] if item.bounds[-1:] == (math.inf,) else item.bounds
        return non_finite([*bounds, *item.counts, item.total], where)
    if isinstance(item, dict):
        return [bad for key, value in item.items() for bad in non_finite(value, f"{where}.{key}")]
    if isinstance(item, list | tuple):
        return [bad for i, value in enumerate(item) for bad in non_finite(value, f"{where}[{i}]")]
    assert dataclasses.is_dataclass(item), type(item)
    return [
        bad
        for entry in dataclasses.fields(item)
        for bad in non_finite(getattr(item, entry.name), f"{where}.{entry.name}")
    ]


def assert_bounded(engine: str, text: str) -> Sample | ScrapeFormatError:
    result, peak = run(engine, text)
    assert peak < PEAK_CAP, f"{peak} bytes allocated"
    if isinstance(result, ScrapeFormatError):
        assert str(result), "the reason is recorded: it must say something"
        return result
    assert non_finite(result) == []
    series = sum(1 for line in text.split("\n") if line[:1] not in "#")
    if isinstance(result, list):
        assert len(result) <= series
        assert all(0 <= gpu.index <= MAX_GPU_INDEX for gpu in result)
    else:
        assert len(result.accepted_per_position or []) <= MAX_POSITIONS
        assert 1 <= result.engines <= max(1, series)
        for hist in result.histograms.values():
            assert len(hist.bounds) == len(hist.counts) <= MAX_BUCKETS
            assert list(hist.bounds) == sorted(hist.bounds)
    return result


def test_every_capture_gives_a_sample_within_the_bounds() -> None:
    """The unmutated captures: the checks below hold for real bodies (and are not vacuous)."""
    for engine, captures in CAPTURES.items():
        assert captures, engine
        for text in captures:
            assert_bounded(engine, text)
    assert not isinstance(assert_bounded("llamacpp", CAPTURES["llamacpp"][-1]), Exception)


@pytest.mark.parametrize("engine", list(PARSERS))
@settings(
    derandomize=True,
    max_examples=45,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_a_mutated_capture_gives_a_bounded_sample_or_scrape_format_error(
    engine: str, data: st.DataObject
) -> None:
    assert_bounded(engine, data.draw(bad_bodies(engine)))


# --- the cases, one by one ------------------------------------------------------------------

LLAMACPP_SPEC = (OWN_FIXTURES / "llamacpp-b11434-spec.prom").read_text(encoding="utf-8")
POSITION = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"
HUGE_POSITION = LLAMACPP_SPEC + f'{POSITION}{{position="50000000"}} 1\n'
VLLM = "vllm:kv_cache_usage_perc 0.5\n"
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
DRAFTED = "trtllm_spec_decode_drafted_tokens_total"
MANY_BUCKETS = "".join(f'tgi_request_duration_bucket{{le="{i}"}} {i}\n' for i in range(3000))

REFUSED: dict[str, tuple[str, str, str]] = {
    # engine, body, what the reason says
    "llama.cpp position 50000000": ("llamacpp", HUGE_POSITION, "from 0 to 63 (MAX_POSITIONS)"),
    "llama.cpp position -3": (
        "llamacpp",
        LLAMACPP_SPEC + f'{POSITION}{{position="-3"}} 1\n',
        "MAX_POSITIONS",
    ),
    "llama.cpp counters adding up past 1.8e308": (
        "llamacpp",
        "llamacpp:prompt_tokens_total 1e308\nllamacpp:prompt_tokens_cached_total 1e308\n",
        "counters['prompt_tokens'] is inf",
    ),
    "vLLM position 50000000": (
        "vllm",
        VLLM + f'{PER_POS}{{position="50000000"}} 1\n',
        "MAX_POSITIONS",
    ),
    "vLLM position ²": ("vllm", VLLM + f'{PER_POS}{{position="²"}} 1\n', "MAX_POSITIONS"),
    "vLLM position of 5,000 digits": (
        "vllm",
        VLLM + f'{PER_POS}{{position="{"9" * 5000}"}} 1\n',
        "MAX_POSITIONS",
    ),
    "vLLM occupancy adding up past 1.8e308": (
        "vllm",
        'vllm:kv_cache_usage_perc{engine="0"} 1e308\nvllm:kv_cache_usage_perc{engine="1"} 1e308\n',
        "kv_cache_usage_mean",
    ),
    "vLLM NaN bucket bound": (
        "vllm",
        VLLM + 'vllm:e2e_request_latency_seconds_bucket{le="NaN"} 1\n',
        "not an upper bound",
    ),
    "TensorRT-LLM token_position ²": (
        "trtllm",
        f'{DRAFTED}{{token_position="²"}} 3\n',
        "MAX_POSITIONS",
    ),
    "TensorRT-LLM token_position 50000000": (
        "trtllm",
        f'{DRAFTED}{{token_position="50000000"}} 3\n',
        "MAX_POSITIONS",
    ),
    "TensorRT-LLM KV blocks adding up past 1.8e308": (
        "trtllm",
        'trtllm_kv_cache_max_blocks{pid="1"} 1e308\ntrtllm_kv_cache_max_blocks{pid="2"} 1e308\n'
        "trtllm_kv_cache_tokens_per_block 32\n",
        "trtllm_kv_cache_max_blocks is inf",
    ),
    "SGLang pages times page size past 1.8e308": (
        "sglang",
        'sglang:page_size{dp_rank="0"} 1e200\nsglang:num_pages{dp_rank="0"} 1e200\n',
        "sglang:page_size is 1e+200",
    ),
    "TGI capacity beyond 64 bits": (
        "tgi",
        "tgi_batch_max_total_tokens 1e308\n",
        "tgi_batch_max_total_tokens is 1e+308",
    ),
    "TGI -Inf bucket bound": (
        "tgi",
        'tgi_request_duration_bucket{le="-Inf"} 1\ntgi_request_duration_bucket{le="+Inf"} 1\n',
        "not an upper bound",
    ),
    "TGI histogram of 3,000 buckets": ("tgi", MANY_BUCKETS, "more than 2048 (MAX_BUCKETS)"),
    "DCGM gpu ²": ("dcgm", 'DCGM_FI_DEV_GPU_TEMP{gpu="²"} 40\n', "MAX_GPU_INDEX"),
    "DCGM gpu of 5,000 digits": (
        "dcgm",
        f'DCGM_FI_DEV_GPU_TEMP{{gpu="{"9" * 5000}"}} 40\n',
        "from 0 to 1023 (MAX_GPU_INDEX)",
    ),
}


@pytest.mark.timeout(60)  # the old code built a 50-million-entry list: fail, do not hang
@pytest.mark.parametrize(("engine", "body", "reason"), REFUSED.values(), ids=REFUSED.keys())
def test_a_bad_label_or_number_is_a_scrape_format_error_naming_it(
    engine: str, body: str, reason: str
) -> None:
    result, peak = run(engine, body)
    assert isinstance(result, ScrapeFormatError), result
    assert reason in str(result)
    assert len(str(result)) < 300  # the label's value is cut, not copied whole
    assert peak < 2 * 2**20  # nothing sized by the label: a 50-million list is 400 MB


def test_labels_that_are_no_number_leave_a_field_unknown_not_the_scrape_refused() -> None:
    """A cache or rank label out of any integer's range reads as unknown (as "abc" does);
    the old code raised OverflowError for "1e999" and kept NaN for "nan"."""
    vllm = parse_vllm(
        VLLM + 'vllm:cache_config_info{block_size="1e999",num_gpu_blocks="16",'
        'gpu_memory_utilization="nan",kv_cache_size_tokens="1e999"} 1\n'
    )
    assert vllm.cache.block_size is None and vllm.cache.num_gpu_blocks == 16
    assert vllm.cache.gpu_memory_utilization is None and vllm.cache.capacity_tokens is None
    big = parse_vllm(VLLM + 'vllm:cache_config_info{block_size="1e18",num_gpu_blocks="1e18"} 1\n')
    assert big.cache.block_size == 10**18 and big.cache.capacity_tokens is None
    sglang = parse_sglang(
        'sglang:num_running_reqs{dp_rank="0",pp_rank="0",tp_rank="1e999"} 3\n'
        'sglang:num_running_reqs{dp_rank="0",pp_rank="0",tp_rank="1"} 3\n'
    )
    assert sglang.gauges["requests_running"] == 3  # "1e999" is rank 0, "1" its repeat


def test_positions_below_the_bound_are_kept() -> None:
    top = MAX_POSITIONS - 1
    sample = parse_llamacpp(LLAMACPP_SPEC + f'{POSITION}{{position="{top}"}} 1\n')
    assert sample.accepted_per_position is not None
    assert len(sample.accepted_per_position) == MAX_POSITIONS
    assert sample.accepted_per_position[-1] == 1 and sample.accepted_per_position[10] == 0
    gpus = parse_dcgm(f'DCGM_FI_DEV_GPU_TEMP{{gpu="{MAX_GPU_INDEX}"}} 40\n', "node")
    assert [gpu.index for gpu in gpus] == [MAX_GPU_INDEX]


# --- one round ------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_a_target_with_a_huge_position_is_down_and_the_round_stores_the_others(
    metrics_server: MetricsServer, tmp_path: Path
) -> None:
    from kneepoint.store.db import open_store
    from kneepoint.store.models import ReplicaSampleRow, TargetRow

    metrics_server.routes = {
        "/good": Route(VLLM_032.read_bytes()),
        "/bad": Route(HUGE_POSITION.encode()),
    }
    targets = [
        Target(name="good", kind="vllm", url=metrics_server.url("/good"), timeout=5.0),
        Target(name="bad", kind="llamacpp", url=metrics_server.url("/bad"), timeout=5.0),
    ]
    config = Config(database=f"sqlite:///{tmp_path / 'k.db'}", targets=targets)
    sessions = open_store(config.database)
    outcomes = {o.target: o for o in collect_once(config, sessions)}
    assert outcomes["good"].ok
    assert not outcomes["bad"].ok
    assert "position='50000000'" in (outcomes["bad"].error or "")
    assert "MAX_POSITIONS" in (outcomes["bad"].error or "")
    with sessions() as session:
        bad = session.scalars(select(TargetRow).where(TargetRow.name == "bad")).one()
        assert bad.up is False and "MAX_POSITIONS" in (bad.last_error or "")
        stored = session.scalar(select(func.count()).select_from(ReplicaSampleRow))
        assert stored == 1
