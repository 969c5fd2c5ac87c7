"""Bad specs are typed errors with messages that say what is wrong."""

import time

import pydantic
import pytest

from cdsl_struct import (
    Choice,
    CompileError,
    Grammar,
    GrammarSyntaxError,
    InvalidSchema,
    JsonSchema,
    Regex,
    UnknownGrammar,
    UnsatisfiableSchema,
    UnsupportedFeature,
)
from cdsl_struct.constraints import WhitespacePolicy


class Person(pydantic.BaseModel):
    name: str
    age: int


def test_pydantic_model_is_a_schema():
    spec = JsonSchema(Person)
    assert spec.model is Person
    assert spec.schema["required"] == ["name", "age"]


def test_json_string_schema():
    assert JsonSchema('{"type": "integer"}').schema == {"type": "integer"}


def test_schema_failing_metaschema():
    with pytest.raises(InvalidSchema, match="invalid JSON Schema at type"):
        JsonSchema({"type": "strnig"})
    with pytest.raises(InvalidSchema, match="minLength"):
        JsonSchema({"type": "string", "minLength": -1})


def test_schema_not_json():
    with pytest.raises(InvalidSchema, match="line 1 column 7"):
        JsonSchema('{"a": }')


def test_false_schema_is_unsatisfiable():
    with pytest.raises(UnsatisfiableSchema):
        JsonSchema(False)


def test_bad_regex_reports_position():
    with pytest.raises(GrammarSyntaxError, match="position 3"):
        Regex("abc(")


@pytest.mark.parametrize("pattern,feature", [
    ("(?=a)a", "lookahead"), ("a(?!b)", "negative lookahead"), ("(?<=a)b", "lookbehind"),
    (r"(a)\1", "backreference"), (r"(?P<x>a)(?P=x)", "backreference"),
])
def test_regex_features_no_engine_has(pattern, feature):
    with pytest.raises(UnsupportedFeature) as info:
        Regex(pattern)
    assert feature in info.value.feature


def test_choice_needs_options():
    with pytest.raises(UnsatisfiableSchema):
        Choice([])
    assert Choice(["a.b", "c"]).pattern == r"(a\.b)|(c)"


def test_grammar_syntax_error_has_line_and_column():
    with pytest.raises(GrammarSyntaxError) as info:
        Grammar('start: "a" item\nitem: "b" |\n   foo bar:\n')
    assert info.value.line == 3 and info.value.column is not None


def test_grammar_undefined_rule():
    with pytest.raises(GrammarSyntaxError, match="foo"):
        Grammar("start: foo\n")


def test_shipped_grammar_by_name_and_path():
    by_name = Grammar("arithmetic")
    assert by_name.origin.endswith("arithmetic.lark")
    assert Grammar(by_name.origin).text == by_name.text
    with pytest.raises(GrammarSyntaxError, match="does not exist"):
        Grammar("missing.lark")


@pytest.mark.parametrize(("name", "suggestion"), [("arithmetics", "arithmetic"), ("jsn", "json"),
                                                  ("sql-select", "sql_select"), ("start", None), ("xyz_9", None)])
def test_an_unknown_grammar_name_is_refused_naming_the_shipped_ones(name, suggestion):
    with pytest.raises(UnknownGrammar) as info:
        Grammar(name)
    error = info.value
    assert isinstance(error, CompileError) and isinstance(error, ValueError)
    assert error.name == name and error.suggestion == suggestion
    assert error.known == ("arithmetic", "function_call", "json", "sql_select")
    assert all(known in str(error) for known in error.known)
    assert (f"did you mean {suggestion!r}" in str(error)) == (suggestion is not None)
    assert "\n" not in str(error)  # one line, as the CLI prints it


@pytest.mark.parametrize("text", ["start: NAME\nNAME: /[a-z]+/\n", 'start: "a"', "?start: \"x\" | \"y\""])
def test_lark_text_is_still_read_as_text(text):
    assert Grammar(text).text == text


def test_shipped_grammar_names_come_from_the_grammars_folder():
    from cdsl_struct.constraints.specs import GRAMMAR_NAME, GRAMMARS_DIR, shipped_grammars

    assert shipped_grammars() == tuple(sorted(p.stem for p in GRAMMARS_DIR.glob("*.lark")))
    assert all(GRAMMAR_NAME.fullmatch(name) for name in shipped_grammars())
    for not_a_name in ("start: x", "a b", "x.lark", "1abc", "-x", "x\n"):
        assert not GRAMMAR_NAME.fullmatch(not_a_name)


def test_whitespace_policies():
    assert WhitespacePolicy.parse("compact").pattern == ""
    assert WhitespacePolicy.parse("spaced").item_separator == ", "
    assert WhitespacePolicy.parse("[ \\n]{0,3}").pattern == "[ \\n]{0,3}"
    for unbounded in ["[ ]*", " +", "( ?)*", "\\s{2,}"]:
        with pytest.raises(CompileError, match="unbounded"):
            WhitespacePolicy.parse(unbounded)
    with pytest.raises(CompileError, match="non-whitespace"):
        WhitespacePolicy.parse("[ a]?")


def test_nesting_beyond_the_limit_is_refused_before_any_parser_recurses():
    from cdsl_struct.constraints.specs import MAX_NESTING

    Regex("(" * MAX_NESTING + "a" + ")" * MAX_NESTING)  # at the limit: fine
    with pytest.raises(UnsupportedFeature, match="nests 400 levels"):
        Regex("(" * 400 + "a" + ")" * 400)
    with pytest.raises(UnsupportedFeature, match="nests 3000 levels"):
        Grammar.from_text("start: " + "(" * 3000 + '"a"' + ")" * 3000)


@pytest.mark.parametrize("rule", [" ".join(['"a"?'] * 64), " ".join(['["a"]'] * 4000), '("a"|"b") ~ 3..20',
                                  " ".join(['("a"|"b"|"c")'] * 9)])
def test_a_rule_lark_would_expand_exponentially_is_refused_before_lark_builds_it(rule):
    """Each optional item doubles a rule's alternatives in lark's Earley parser: 64 of them never
    finished loading (and 4000 raised RecursionError, a 500 in the server)."""
    with pytest.raises(UnsupportedFeature, match="alternatives") as info:
        Grammar.from_text(f"start: x\nx: {rule}\n")
    assert info.value.feature == "grammar size"


def test_a_rule_with_a_few_optional_items_still_loads():
    grammar = Grammar.from_text('start: x\nx: ' + " ".join(['"a"?'] * 8) + "\n")
    assert grammar.parse("aaa")


def chained_terminals(depth: int) -> str:
    return "start: A0\n" + "".join(f"A{i}: A{i + 1}\n" for i in range(depth)) + f'A{depth}: "a"\n'


def test_terminals_nested_too_deeply_are_refused_from_the_text():
    """lark resolves terminal chains in time that grows faster than quadratically: 3,000 deep took
    tens of seconds inside lark before any answer."""
    started = time.monotonic()
    with pytest.raises(UnsupportedFeature, match="nested terminals") as info:
        Grammar.from_text(chained_terminals(3000))
    assert info.value.feature == "grammar size" and time.monotonic() - started < 2.0


@pytest.mark.parametrize("text", ["/etc/secret.lark", "", "start"])
def test_text_with_no_definition_is_a_grammar_syntax_error(text):
    with pytest.raises(GrammarSyntaxError):
        Grammar.from_text(text)


def test_terminals_nested_within_the_limit_and_shared_ones_still_load():
    assert Grammar.from_text(chained_terminals(50)).parse("a")
    shared = ('start: W (" " W)*\nW: L L? /[0-9]/ "Q"\nL: LOW | UP\nLOW: "a".."z"\nUP: "A".."Z"\n'
              '// C: comment mentioning W\n')
    assert Grammar.from_text(shared).parse("ab1Q Z2Q")


CYCLE = {f"d{i}": {"$ref": f"#/$defs/d{(i + 1) % 200}"} for i in range(200)}


@pytest.mark.parametrize("schema", [{"$defs": CYCLE, "$ref": "#/$defs/d0"},
                                    {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, {"$ref": "#"}])
def test_a_schema_that_is_only_a_cycle_of_references_is_unsatisfiable(schema):
    from cdsl_struct import UnsatisfiableSchema

    with pytest.raises(UnsatisfiableSchema, match="cycle of references"):
        JsonSchema(schema)


def test_a_recursive_schema_that_builds_structure_is_fine():
    node = {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/t"}}}}
    tree = {"$defs": {"t": node}, "$ref": "#/$defs/t"}
    JsonSchema(tree)


@pytest.mark.parametrize(("pattern", "engine"), [
    (r"\d{4}-\d{2}", "[0-9]{4}-[0-9]{2}"),
    (r"[\d_]+", "[[0-9]_]+"),
    (r"[^\d]\D", "[^[0-9]][^0-9]"),
    (r"\w\W", "[0-9a-zA-Z_][^0-9a-zA-Z_]"),
    (r"\s\S", r"\s\S"),  # as in a JSON Schema pattern: Unicode whitespace
    (r"\\d", r"\\d"),  # a backslash, then d
    ("[a-z]+", "[a-z]+"),
])
def test_regex_class_escapes_mean_the_json_schema_ascii_sets(pattern, engine):
    spec = Regex(pattern)
    assert spec.engine_pattern == engine
    assert Regex(pattern, unicode=True).engine_pattern == pattern


def test_regex_unicode_flag_is_in_the_key_and_equality():
    assert Regex(r"\d").key != Regex(r"\d", unicode=True).key
    assert Regex(r"\d") != Regex(r"\d", unicode=True)
    assert Regex(r"\d") == Regex(r"\d") and Regex(r"\d").key == Regex(r"\d").key
    with pytest.raises(TypeError, match="bool"):
        Regex(r"\d", unicode="yes")


def test_choice_keeps_its_literal_pattern():
    options = Choice([r"\d", "a/b", "x_1"])
    assert options.engine_pattern == options.pattern == r"(\\d)|(a/b)|(x_1)"
