"""The job's files: torn last lines are cut and rewritten, ids are required, rows are whole lines."""

from __future__ import annotations

import json

import pytest

from cdsl_struct.bulk.files import InputError, RowWriter, id_key, read_rows, repair_and_read_done


def test_torn_last_line_is_cut_and_its_row_counted_undone(tmp_path):
    out = tmp_path / "out.jsonl"
    whole = [json.dumps({"id": 1, "text": "a"}), json.dumps({"id": "2", "text": "b"})]
    out.write_text("\n".join(whole) + "\n" + '{"id": 3, "te', encoding="utf-8")
    done = repair_and_read_done(out)
    assert done == {id_key(1), id_key("2")}
    assert out.read_text(encoding="utf-8") == "\n".join(whole) + "\n"
    with RowWriter(out) as writer:
        writer.write({"id": 3, "text": "c"})
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == [1, "2", 3]


def test_a_last_row_without_its_newline_is_rewritten_whole(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text('{"id": 1}\n{"id": 2}', encoding="utf-8")
    assert repair_and_read_done(out) == {id_key(1)}
    assert out.read_text() == '{"id": 1}\n'


def test_garbage_inside_the_output_is_an_error_not_silently_dropped(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text('{"id": 1}\nnot json\n{"id": 2}\n', encoding="utf-8")
    with pytest.raises(InputError, match="line 2"):
        repair_and_read_done(out)


@pytest.mark.parametrize(("line", "message"), [("{oops", "not JSON"), ("[1]", "not a JSON object"),
                                               ('{"prompt": "x"}', "no \"id\"")])
def test_bad_input_lines_name_their_line(tmp_path, line, message):
    path = tmp_path / "in.jsonl"
    path.write_text('{"id": 0, "prompt": "fine"}\n\n' + line + "\n", encoding="utf-8")
    with pytest.raises(InputError, match=f"line 3 .*{message}"):
        list(read_rows(path))
