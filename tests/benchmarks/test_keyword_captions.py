"""The keyword-captions bench: its count of captions of keywords alone, and one run through
``generate`` on the embedded model via the CLI."""

import json

from benchmarks.__main__ import main
from benchmarks.keyword_captions import keywords_alone
from tests.benchmarks.test_commongen_bench import write_data


def test_a_caption_of_keywords_alone_is_told_from_one_that_uses_them():
    words = ["door", "open", "slide"]
    assert keywords_alone("Door opens, slide", words) and keywords_alone("door slides", words)
    assert not keywords_alone("The door slides open.", words) and not keywords_alone("Door", words)


def test_keyword_captions_runs_through_generate(tmp_path, smollm2, monkeypatch, one_torch_thread):
    from cdsl_struct import api

    monkeypatch.setattr(api, "load_model", lambda name, **options: smollm2)
    data = write_data(tmp_path / "dev.jsonl")
    out = tmp_path / "captions.json"
    assert main(["keyword-captions", "--data", str(data), "--limit", "1", "--split", "all", "--max-tokens", "24",
                 "--no-progress", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    (row,) = report["rows"]
    assert row["caption"] is not None and set(row["covered"]) <= set(row["words"])  # closed to fit at worst
    assert report["summary"]["sets"] == 1 and report["summary"]["valid_json"] == 1
