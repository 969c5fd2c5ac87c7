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


# --- a schema that cannot judge the output never lets its value through ---------------------------


def _spec(schema):
    from cdsl_struct import JsonSchema

    return JsonSchema(schema)


def test_a_valid_output_is_returned_and_an_invalid_one_refused():
    from cdsl_struct import OutputInvalid
    from cdsl_struct.result import parse_value

    spec = _spec({"type": "string", "minLength": 2})
    assert parse_value(spec, '"ab"') == "ab"
    with pytest.raises(OutputInvalid):
        parse_value(spec, '"a"')


def test_a_schema_changed_after_its_spec_was_made_is_checked_again():
    """The spec checked its schema when made; the dict is still mutable. A schema that no longer
    passes its metaschema must not let the output through as validated."""
    from cdsl_struct import InvalidSchema
    from cdsl_struct.result import parse_value

    spec = _spec({"type": "string", "minLength": 2})
    spec.schema["minLength"] = -1  # invalid: and under it "" would pass
    with pytest.raises(InvalidSchema, match="minLength"):
        parse_value(spec, '""')


def test_a_schema_error_while_validating_is_not_a_pass(monkeypatch):
    import jsonschema

    from cdsl_struct import InvalidSchema
    from cdsl_struct.result import parse_value

    class Broken:
        """A validator that finds its schema unusable only once it validates (the path that used to
        return the value unvalidated)."""

        def __init__(self, schema):
            self.schema = schema

        def iter_errors(self, instance):
            raise jsonschema.exceptions.SchemaError("a schema the validator cannot use")

    spec = _spec({"type": "integer", "minimum": 0})
    assert parse_value(spec, "3") == 3  # the schema's own check is done (and kept) before the patch
    monkeypatch.setattr(jsonschema.validators, "validator_for", lambda schema, *args, **kwargs: Broken)
    with pytest.raises(InvalidSchema, match="cannot judge"):
        parse_value(spec, "3")


@pytest.mark.parametrize("schema", [{"$ref": "#/$defs/missing"}, {"$ref": "https://example.invalid/s.json"}])
def test_a_reference_that_resolves_nowhere_is_a_typed_error(schema):
    from cdsl_struct import InvalidSchema
    from cdsl_struct.result import parse_value

    with pytest.raises(InvalidSchema, match="cannot judge"):
        parse_value(_spec(schema), "3")


def test_a_spec_like_object_with_a_bad_schema_is_refused():
    from types import SimpleNamespace

    from cdsl_struct import InvalidSchema
    from cdsl_struct.result import parse_value

    with pytest.raises(InvalidSchema, match="not JSON"):
        parse_value(SimpleNamespace(kind="json_schema", schema={"enum": [{1, 2}]}, model=None), "1")
    with pytest.raises(InvalidSchema, match="required"):
        parse_value(SimpleNamespace(kind="json_schema", schema={"required": "a"}, model=None), '{"a": 1}')
