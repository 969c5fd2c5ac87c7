"""``cdsl-struct batch`` on the real SmolLM2: valid outputs, carried fields, isolated errors, resume."""

from __future__ import annotations

import json

import pytest

from cdsl_struct.bulk import BatchJob, run_job
from cdsl_struct.cli import main
from cdsl_struct.params import GenerationParams

ROWS = [
    {"id": 1, "prompt": "Is Paris in France? Answer yes or no.", "source": "geo"},
    {"id": "b", "messages": [{"role": "system", "content": "Answer yes or no."},
                             {"role": "user", "content": "Is fire cold?"}]},
    {"id": 3, "prompt": ""},  # no usable prompt: an error row, the job goes on
    {"id": 4, "prompt": "Do fish swim?", "meta": {"k": [1, 2]}},
    {"id": 5, "prompt": "Is ice hot?"},
    {"id": 1, "prompt": "a repeated id is skipped"},
]


def write_input(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def read_output(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def job():
    return BatchJob(choices=["yes", "no"], params=GenerationParams(max_tokens=4), draft=None, max_batch_size=4)


def test_rows_decoded_once_valid_and_resumable(tmp_path, job, one_torch_thread):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_input(src, ROWS)
    summary = run_job(job, src, out, chunk_size=3, progress=False)
    rows = read_output(out)
    assert [r["id"] for r in rows] == [1, "b", 3, 4, 5]
    assert (summary.written, summary.complete, summary.errors, summary.skipped_duplicate) == (5, 4, 1, 1)
    by_id = {r["id"]: r for r in rows}
    assert "prompt" in by_id[3]["error"] and "output" not in by_id[3]
    for key in (1, "b", 4, 5):
        row = by_id[key]
        assert row["output"] in ("yes", "no") and row["text"] == row["output"] and row["finish_reason"] == "stop"
    assert by_id[1]["source"] == "geo" and by_id[4]["meta"] == {"k": [1, 2]}  # other fields carried through

    again = run_job(job, src, out, progress=False)  # nothing left to do
    assert (again.written, again.skipped_done) == (0, 6)  # the repeated id 1 is done too

    # A crash mid-write: two whole rows and a torn third line. The rerun completes the job exactly once.
    lines = out.read_text(encoding="utf-8").splitlines(keepends=True)
    out.write_text("".join(lines[:2]) + lines[2][:7], encoding="utf-8")
    resumed = run_job(job, src, out, progress=False)
    assert (resumed.written, resumed.skipped_done) == (3, 3)
    assert sorted(map(json.dumps, read_output(out))) == sorted(map(json.dumps, rows))


def test_cli_with_a_schema_file(tmp_path, capsys, one_torch_thread):
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"],
              "additionalProperties": False}
    (tmp_path / "schema.json").write_text(json.dumps(schema), encoding="utf-8")
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_input(src, ROWS[:2])
    code = main(["batch", str(src), str(out), "--schema", str(tmp_path / "schema.json"), "--max-tokens", "12",
                 "--draft", "none", "--no-progress"])
    assert code == 0
    rows = read_output(out)
    assert [r["output"]["answer"] in ("yes", "no") for r in rows] == [True, True]
    assert "2 rows written" in capsys.readouterr().err


def test_cli_bad_constraint_fails_before_any_row(tmp_path, capsys):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_input(src, ROWS[:1])
    assert main(["batch", str(src), str(out), "--regex", "(a", "--no-progress"]) == 2
    assert "invalid regex" in capsys.readouterr().err and not out.exists()


def test_a_job_travels_as_plain_data_and_comes_back_equal():
    job = BatchJob(regex="[a-z]+", params=GenerationParams(method="target", max_tokens=5, stop=("x",), seed=3))
    data = job.to_dict()
    assert json.loads(json.dumps(data)) == data  # what a Ray actor receives is plain data
    assert BatchJob.from_dict(data) == job


def test_rows_over_their_budget_come_back_closed_and_marked(tmp_path, one_torch_thread):
    """Issue 40 in bulk jobs: a JSON answer ``max_tokens`` would cut is closed valid and marked."""
    import jsonschema

    schema = {"type": "object", "properties": {"name": {"type": "string"}, "bio": {"type": "string"}},
              "required": ["name", "bio"]}
    job = BatchJob(schema=schema, params=GenerationParams(max_tokens=16), draft=None, max_batch_size=2)
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_input(src, [{"id": 1, "prompt": "Describe Ada Lovelace with a very long bio as JSON."},
                      {"id": 2, "prompt": "Describe Alan Turing with a very long bio as JSON."}])
    run_job(job, src, out, progress=False)
    rows = read_output(out)
    assert [r["closed_by_budget"] for r in rows] == [True, True]
    for row in rows:
        assert row["finish_reason"] == "length"
        jsonschema.validate(row["output"], schema)
