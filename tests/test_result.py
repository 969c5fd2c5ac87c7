"""``Result`` is built once: frozen, changed only by making a copy."""

import dataclasses

import pytest

from cdsl_struct.result import Result
from cdsl_struct.tools import ToolCall


def test_a_result_cannot_be_changed_after_it_is_built():
    result = Result(text="{}", tokens=[1, 2], finish_reason="stop", complete=True, value={})
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.finish_reason = "cancelled"
    changed = dataclasses.replace(result, finish_reason="length", complete=False, value=None)
    assert (result.finish_reason, result.complete, result.value) == ("stop", True, {})
    assert (changed.finish_reason, changed.complete, changed.value, changed.text) == ("length", False, None, "{}")


def test_content_is_the_text_unless_there_are_calls():
    assert Result(text="hi", tokens=[1], finish_reason="stop", complete=True).content == "hi"
    call = ToolCall("f", {}, "call_1")
    assert Result(text="<call>", tokens=[1], finish_reason="stop", complete=True, tool_calls=[call]).content is None
