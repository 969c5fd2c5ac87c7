"""``--engine ray`` on a local Ray cluster started here: two actors, a few hundred rows.

Every row is written exactly once, every output is valid, and the rows equal the local engine's.
The model is a tiny random Llama with SmolLM2's real tokenizer, saved to a folder: distributing
rows is mechanics, and the real model's outputs through the same row code are tested in
``test_batch_job.py`` (on this 2-core machine the real model would take minutes for 300 rows).
"""

from __future__ import annotations

import json
import re
import time

import pytest

from cdsl_struct.bulk import BatchJob, run_job
from cdsl_struct.params import GenerationParams
from tests.models.solo import save_tiny_llama

pytest.importorskip("ray.data")  # the extra `ray`, installed by `make test`

N_ROWS = 200
SUBJECTS = ["cats", "fish", "stones", "birds", "clouds", "trees", "snakes", "cars", "bees", "ice"]
VERBS = ["fly", "swim", "sing", "melt", "grow", "bark"]


def rows() -> list[dict]:
    return [{"id": i, "prompt": f"Say yes or no: can {SUBJECTS[i % 10]} {VERBS[i % 6]}", "n": i}
            for i in range(N_ROWS)]


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-smollm2-vocab"))


def test_ray_engine_matches_local_engine(tmp_path, tiny_model_dir):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows()), encoding="utf-8")
    job = BatchJob(regex="[a-z]{2}", params=GenerationParams(max_tokens=4), draft=None, max_batch_size=50,
                   model=tiny_model_dir, chat=False)  # no template: the varying words are the last tokens it sees

    started = time.perf_counter()
    ray_summary = run_job(job, src, tmp_path / "ray.jsonl", engine="ray", actors=2, chunk_size=50, progress=False)
    ray_seconds = time.perf_counter() - started
    local_summary = run_job(job, src, tmp_path / "local.jsonl", chunk_size=50, progress=False)

    ray_rows = [json.loads(line) for line in (tmp_path / "ray.jsonl").read_text().splitlines()]
    local_rows = [json.loads(line) for line in (tmp_path / "local.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in ray_rows) == list(range(N_ROWS))  # every row exactly once
    assert ray_summary.written == local_summary.written == N_ROWS and ray_summary.errors == 0
    assert all(re.fullmatch("[a-z]{2}", r["output"]) and r["finish_reason"] == "stop" for r in ray_rows)
    assert sorted(ray_rows, key=lambda r: r["id"]) == local_rows
    assert len({r["output"] for r in ray_rows}) > 5  # outputs differ by row, so a row mix-up would show
    print(f"ray {ray_seconds:.1f} s, local {local_summary.seconds:.1f} s")

    again = run_job(job, src, tmp_path / "ray.jsonl", engine="ray", actors=2, chunk_size=50, progress=False)
    assert (again.written, again.skipped_done) == (0, N_ROWS)  # resumed: nothing decoded twice
