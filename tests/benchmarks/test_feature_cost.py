"""The feature-cost harness's arithmetic: per-token time and its ratio to plain JSON round by round."""

from __future__ import annotations

import pytest

from benchmarks.feature_cost import format_table, summarize


def test_ratios_are_per_token_and_per_round():
    measured = {"json": [(1.0, 100), (2.0, 100)], "tag": [(1.1, 100), (2.0, 80)]}
    table = summarize(measured)
    assert table["json"]["ratio_to_json"] == 1.0
    assert table["tag"]["ratio_range"] == [1.1, 1.25]  # 11 ms vs 10; 25 ms vs 20
    assert table["tag"]["ratio_to_json"] == pytest.approx(1.175)
    assert table["tag"]["ms_per_token"] == pytest.approx(18.0)  # the median of 11 and 25 ms
    assert "| tag |" in format_table(table)
