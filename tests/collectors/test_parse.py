from __future__ import annotations

import math

import pytest

from collectors.parse import ScrapeFormatError, parse_exposition
from tests.conftest import VLLM_032, read


def everything(_: str) -> bool:
    return True


MALFORMED = {
    "an HTML error page": "<html><body><h1>502 Bad Gateway</h1></body></html>\n",
    "plain garbage": "this is not prometheus\n",
    "an empty body": "",
    "only whitespace": "  \n\n",
    "a body cut mid-line": 'vllm:num_requests_running{engine="0"} 1\nvllm:num_requests_wai',
    "an unterminated label set": 'vllm:num_requests_running{engine="0" 3\n',
    "a value that is not a number": "vllm:num_requests_running twelve\n",
    "a label without quotes": "vllm:num_requests_running{engine=0} 3\n",
    "two different values for one series": 'a{x="1"} 1\na{x="1"} 2\n',
    "a JSON error body": '{"error": "unauthorized"}\n',
}


@pytest.mark.parametrize("text", MALFORMED.values(), ids=MALFORMED.keys())
def test_it_rejects_malformed_text_with_a_clear_error(text: str) -> None:
    with pytest.raises(ScrapeFormatError) as raised:
        parse_exposition(text, everything)
    assert str(raised.value)


def test_it_names_the_line_of_garbage() -> None:
    with pytest.raises(ScrapeFormatError, match="line 2"):
        parse_exposition("a 1\n<html>\n", lambda name: name == "a")


def test_it_drops_nan_and_inf_values_and_counts_them() -> None:
    parsed = parse_exposition("a NaN\nb +Inf\nc -Inf\nd 4\n", everything)
    assert parsed.samples == {"d": [({}, 4.0)]}
    assert parsed.dropped == 3


def test_it_keeps_one_of_identical_duplicate_series() -> None:
    parsed = parse_exposition('a{x="1"} 5\na{x="1"} 5\na{x="2"} 6\n', everything)
    assert parsed.series("a") == [({"x": "1"}, 5.0), ({"x": "2"}, 6.0)]


def test_it_skips_unwanted_series_before_parsing_them() -> None:
    # A malformed line in a series nobody reads does not fail the scrape...
    parsed = parse_exposition('keep 1\nskip{x="1" 2\n', lambda name: name == "keep")
    assert parsed.series("keep") == [({}, 1.0)]
    # ...but a malformed line in a wanted series does.
    with pytest.raises(ScrapeFormatError):
        parse_exposition('keep{x="1" 2\n', lambda name: name == "keep")


def test_it_renames_before_filtering() -> None:
    parsed = parse_exposition(
        "vllm_x 1\n", lambda name: name == "vllm:x", lambda n: n.replace("vllm_", "vllm:")
    )
    assert parsed.series("vllm:x") == [({}, 1.0)]
    assert not math.isnan(parsed.series("vllm:x")[0][1])


def test_values_written_as_integers_are_floats() -> None:
    """DCGM and Prometheus's API write "0", not "0.0": a histogram's sum must still encode."""
    from collectors.engines.vllm import parse_vllm
    from kneepoint.store.codec import encode_histogram

    text = read(VLLM_032)
    integral = (
        "\n".join(
            line.rsplit(" ", 1)[0] + " 0" if "time_to_first_token_seconds_sum" in line else line
            for line in text.splitlines()
        )
        + "\n"
    )
    ttft = parse_vllm(integral).histograms["ttft"]
    assert ttft is not None and isinstance(ttft.total, float)
    encode_histogram(1, ttft)  # raised AttributeError on an int total


# Lines the regular expression reads (canonical form) and lines it hands to prometheus_client
# (escapes, spaces, timestamps, a trailing comma, tabs): both must read as prometheus_client
# reads the whole body.
FORMS = (
    "plain 1\n"
    'labelled{a="x",b="y"} 2.5\n'
    'stamped{a="x"} 3 1700000000000\n'
    'escaped{a="say \\"hi\\"",b="back\\\\slash",c="new\\nline"} 4\n'
    'spaced{ a = "x" , b="y" } 5\n'
    'comma{a="x",} 6\n'
    'tabbed{a="x"}\t7\n'
    'brace{a="}{"} 8\n'
    "integral 9\n"
    "exponent 1.5e3\n"
    "negative -2\n"
)


def test_every_line_form_reads_as_prometheus_client_reads_it() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    expected: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(FORMS):
        for sample in family.samples:
            expected.setdefault(sample.name, []).append((sample.labels, float(sample.value)))
    parsed = parse_exposition(FORMS, everything)
    assert parsed.samples == expected
    assert all(type(value) is float for series in parsed.samples.values() for _, value in series)


def test_max_series_counts_sample_lines_not_comments() -> None:
    comments = "".join(f"# HELP m{i} help\n# TYPE m{i} gauge\n" for i in range(10))
    samples = "".join(f'm{i}{{x="1"}} 1\n' for i in range(10))
    assert len(parse_exposition(comments + samples, everything, max_series=10).samples) == 10
    with pytest.raises(ScrapeFormatError, match="more than 9 series"):
        parse_exposition(comments + samples, everything, max_series=9)


def test_label_sets_kept_between_scrapes_read_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """Label sets are kept from scrape to scrape by their text, emptied at a cap: a body read
    with the cache cold, warm, and overflowing (a cap of 3) reads the same."""
    import collectors.parse

    body = "".join(f'm{{a="{i}",b="x"}} {i}\nn{{a="{i}"}} {i}\n' for i in range(10))
    collectors.parse._LABEL_SETS.clear()
    cold = parse_exposition(body, everything).samples
    warm = parse_exposition(body, everything).samples
    collectors.parse._LABEL_SETS.clear()
    monkeypatch.setattr(collectors.parse, "_LABEL_SETS_KEPT", 3)
    overflowing = parse_exposition(body, everything).samples
    assert cold == warm == overflowing
    assert cold["m"][7] == ({"a": "7", "b": "x"}, 7.0)
    assert len(collectors.parse._LABEL_SETS) <= 3
