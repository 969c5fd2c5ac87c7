"""The feature-cost harness: per-token time and its ratio to plain JSON round by round, host time
per row-step, and the structural tag it measures."""

from __future__ import annotations

import pytest

from benchmarks.feature_cost import fenced_json, format_table, summarize


def _run(wall: float, tokens: int, forward: float = 0.0, rows_stepped: int = 0) -> dict[str, float]:
    return {"wall": wall, "tokens": tokens, "forward": forward, "steps": rows_stepped, "rows_stepped": rows_stepped}


def test_ratios_are_per_token_and_per_round():
    measured = {"json": [_run(1.0, 100), _run(2.0, 100)], "tag": [_run(1.1, 100), _run(2.0, 80)]}
    table = summarize(measured)
    assert table["json"]["ratio_to_json"] == 1.0
    assert table["tag"]["ratio_range"] == [1.1, 1.25]  # 11 ms vs 10; 25 ms vs 20
    assert table["tag"]["ratio_to_json"] == pytest.approx(1.175)
    assert table["tag"]["ms_per_token"] == pytest.approx(18.0)  # the median of 11 and 25 ms
    assert "| tag |" in format_table(table)


def test_host_time_is_wall_less_forward_per_row_step():
    measured = {"json": [_run(1.0, 100, forward=0.8, rows_stepped=50), _run(1.0, 100, forward=0.9, rows_stepped=50)]}
    row = summarize(measured)["json"]
    assert row["host_ms_per_row_step"] == pytest.approx(3.0)  # the median of 4 ms and 2 ms
    assert row["row_forwards_per_token"] == pytest.approx(0.5)  # forced tokens rode along


def test_the_tag_is_a_fence_that_must_hold_the_schema():
    tag = fenced_json({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})
    text = 'Here it is:\n```json\n{"a": 3}\n```'
    (segment,) = tag.parse(text)
    assert segment.value == {"a": 3} and segment.begin == "```json\n"
    assert tag.triggers == ("```",) and tag.at_least_one and tag.stop_after_first
