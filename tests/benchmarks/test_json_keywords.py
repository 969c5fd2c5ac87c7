"""The hard + soft JSON bench: string extraction and metrics with known counts on fixed records."""

import json

import jsonschema
import pytest

from benchmarks.json_keywords import LISTING_SCHEMA, JsonKeywordsConfig, _report, string_values
from cdsl_struct.rewards import KeywordCoverage


def test_string_values_skip_keys_and_numbers():
    value = {"title": "Dog", "tags": ["frisbee", {"catch": "caught"}], "n": 3, "ok": True}
    assert string_values(value) == ["Dog", "frisbee", "caught"]


def test_listing_schema_accepts_a_caption_and_refuses_extra_keys():
    good = {"title": "Dog park", "description": "A dog caught a frisbee, then ran."}
    jsonschema.validate(good, LISTING_SCHEMA)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**good, "extra": "x"}, LISTING_SCHEMA)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**good, "description": "no capital."}, LISTING_SCHEMA)


def output(concepts, value, complete=True, passes=10):
    reward = KeywordCoverage(concepts, max_repeats=2)
    strings = " ".join(string_values(value)) if complete else ""
    return {"concepts": concepts, "text": json.dumps(value), "complete": complete, "valid": complete,
            "covered": reward.covered(strings), "counts": reward.counts(strings), "wall_s": 1.0,
            "target_passes": passes, "draft_passes": 0}


def test_report_has_known_counts():
    concepts = ["dog_N", "frisbee_N", "catch_V"]
    rows = {"greedy": [output(concepts, {"title": "Dog", "description": "A dog caught a frisbee."}),
                       output(concepts, {"title": "Dog", "description": "A dog dog dog sat."}),
                       output(concepts, {"title": "Cut"}, complete=False, passes=96)]}
    report = _report(rows, {"greedy": {}}, JsonKeywordsConfig(methods=("greedy",)), LISTING_SCHEMA)
    row = report["methods"]["greedy"]
    assert row["complete"] == pytest.approx(2 / 3, abs=1e-4) and row["valid"] == pytest.approx(2 / 3, abs=1e-4)
    assert row["valid_of_complete"] == 1.0
    assert row["hard_coverage"] == pytest.approx(1 / 3, abs=1e-4)
    assert row["soft_coverage"] == pytest.approx((1 + 1 / 3 + 0) / 3, abs=1e-4)
    assert row["over_max_repeats"] == pytest.approx(1 / 3, abs=1e-4)
    assert row["target_passes"] == 116 and row["wall_s"] == 3.0
