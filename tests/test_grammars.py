"""Checks for the bundled Lark grammars in cdsl_struct/grammars/.

Each grammar must load in python-lark (Earley), accept a set of valid samples,
reject a set of invalid ones, and be accepted by llguidance's grammar validator.
No network and no tokenizer are needed.
"""

from __future__ import annotations

from pathlib import Path

import lark
import llguidance
import pytest

GRAMMAR_DIR = Path(__file__).resolve().parent.parent / "cdsl_struct" / "grammars"

SAMPLES: dict[str, tuple[list[str], list[str]]] = {
    "json": (
        [
            "{}",
            "[]",
            "0",
            "-12.5e+3",
            "true",
            "false",
            "null",
            '"a\\"b\\\\c\\n\\u00e9"',
            '"héllo"',
            '{"a":1,"b":[1,2,3]}',
            '{"a": 1, "b": [1, 2, {"c": null}]}',
            '[[],{},""]',
            '{"key": "value", "n": -0.5, "t": true}',
            "[1,2, 3]",
        ],
        [
            "",
            "{",
            '{"a" : 1}',
            '{"a":  1}',
            "[1 ,2]",
            "[1,\n2]",
            " {}",
            "{} ",
            "01",
            "1.",
            ".5",
            '"abc',
            '"a\\x"',
            "{'a':1}",
            "TRUE",
            "[1,]",
            '{"a":1,}',
            "{a:1}",
            "+1",
            "[ 1]",
        ],
    ),
    "arithmetic": (
        [
            "1",
            "3.14",
            "-2",
            "-(-2)",
            "1--2",
            "1+2",
            "1 + 2",
            "1 +2",
            "1+ 2",
            "2*3+4",
            "2 * (3 + 4)",
            "-(1-2)/3.5",
            "10 / -2",
            "((1))",
            "1 - -1",
            "12*34/56-7+8",
            "0.5*-0.25",
            "2 + 3 * 4 = 14",
            "1=1",
            "1 - 3 = -2",
            "10 / 4 = 2.5",
        ],
        [
            "",
            "1  + 2",
            "( 1)",
            "(1 )",
            "1 +",
            "+1",
            "1.",
            ".5",
            "1 2",
            "2 ** 3",
            "(1+2",
            "1+2)",
            " 1",
            "1 ",
            "- 2",
            "a+1",
            "1,5",
            "--2",
            "1---2",
            "1 =",
            "= 1",
            "1 = 2 = 3",
            "1 = 1 + 1",
            "1 = (1)",
            "1  = 1",
            "1 = 1 ",
        ],
    ),
    "sql_select": (
        [
            "SELECT * FROM users",
            "SELECT * FROM users;",
            "SELECT DISTINCT name FROM users",
            "SELECT id, name FROM users WHERE age > 18",
            "SELECT id,name FROM users WHERE age>=18 AND name LIKE 'A%'",
            "SELECT COUNT(*) FROM orders WHERE status IN ('open', 'paid') GROUP BY customer_id",
            "SELECT customer_id, SUM(total) FROM orders GROUP BY customer_id "
            "ORDER BY customer_id DESC LIMIT 10;",
            "SELECT a FROM t WHERE NOT (x = 1 OR y != 'it''s') AND z IS NOT NULL",
            "SELECT a FROM t WHERE b IS NULL ORDER BY a ASC, b LIMIT 5",
            "SELECT AVG(price), MIN(price), MAX(price) FROM products",
            "SELECT COUNT(DISTINCT user_id) FROM visits",
            "SELECT t.a FROM \"Users\" WHERE t.b NOT IN (1, 2.5, -3) OR c NOT LIKE '%x'",
            "SELECT notes FROM orders WHERE notes <= 3 AND order_id < 2",
            "SELECT a FROM t WHERE (a = 1)",
            'SELECT * FROM t WHERE a = "x"',
            "SELECT * FROM t WHERE a<=1 OR b>=2",
        ],
        [
            "",
            "select * from users",
            "SELECT * FROM users ;",
            "SELECT  * FROM users",
            "SELECT * FROM",
            "SELECT FROM users",
            "SELECT * FROM users WHERE",
            "SELECT * FROM users LIMIT -1",
            "SELECT * FROM users ORDER BY",
            'SELECT * FROM t WHERE a = "x',
            "SELECT * FROM t WHERE a< =1",
            "SELECT * FROM t WHERE a NOTLIKE 'x'",
            "SELECT * FROM FROM",
            "SELECT * FROM Users",
            "SELECT * FROM t WHERE a IS NOT",
            "SELECT * FROM t;;",
            "SELECT * FROM t WHERE a  = 1",
            "SELECT * FROM t LIMIT 1.5",
            "SELECT COUNT(*) FROM t WHERE a IN ()",
            "SELECT * FROM t WHERE a <> 1",
            "SELECT a FROM t\nWHERE b = 1",
            "SELECT * FROM t ORDER BY a UP",
        ],
    ),
    "function_call": (
        [
            "f()",
            "f(1)",
            "f(1, 2)",
            "f(1,2)",
            'f("a\\"b")',
            "f(true, false, null)",
            "f(x=1)",
            "f(trueish=true)",
            'f(1, key="v", other=[1, "two", [null]])',
            "math.floor(3.7)",
            'search("q", limit=10, tags=["a","b"])',
            "f([])",
            "f(nullable=null, falsey=false)",
            "g(-1.5e3, x=-2)",
        ],
        [
            "",
            "f",
            "f(",
            "f(1,)",
            "f(,)",
            "f( 1)",
            "f(1 )",
            "f(1,  2)",
            "f(x = 1)",
            "f(x=1, 2)",
            "f('a')",
            "f(True)",
            "f(a.b=1)",
            "f(g(1))",
            "f(x)",
            " f()",
            "f() ",
            "f()()",
            "f(1)\n",
            "f([1,])",
        ],
    ),
}


def _read(name: str) -> str:
    return (GRAMMAR_DIR / f"{name}.lark").read_text(encoding="utf-8")


@pytest.fixture(scope="module", params=sorted(SAMPLES))
def grammar(request: pytest.FixtureRequest) -> tuple[str, lark.Lark]:
    name = request.param
    return name, lark.Lark(_read(name), start="start", parser="earley")


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_grammar_file_conventions(name: str) -> None:
    text = _read(name)
    assert text.lstrip().startswith("//"), "grammar should open with a comment"
    assert "%import" not in text
    assert "%ignore" not in text
    assert any(line.startswith("start:") for line in text.splitlines())


def test_lark_accepts_valid_samples(grammar: tuple[str, lark.Lark]) -> None:
    name, parser = grammar
    for sample in SAMPLES[name][0]:
        parser.parse(sample)


def test_lark_rejects_invalid_samples(grammar: tuple[str, lark.Lark]) -> None:
    name, parser = grammar
    for sample in SAMPLES[name][1]:
        with pytest.raises(lark.exceptions.LarkError):
            parser.parse(sample)
            pytest.fail(f"{name}: accepted invalid sample {sample!r}")


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_llguidance_validates_grammar(name: str) -> None:
    grammar = llguidance.LLMatcher.grammar_from_lark(_read(name))
    assert llguidance.LLMatcher.validate_grammar(grammar) == ""
