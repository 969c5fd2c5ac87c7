"""The lexer that tells a JSON row's strings from the whitespace between its tokens, and the
per-state masks that leave that whitespace out (``decoding.compact_json``)."""

from __future__ import annotations

import pytest

from cdsl_struct.constraints import TokenVocabulary
from cdsl_struct.constraints.mask import is_allowed
from cdsl_struct.decoding.compact_json import ESCAPED, INSIDE, OUTSIDE, lex, strip_outside_strings, whitespace_keep


@pytest.mark.parametrize(("data", "state"), [(b'{ "a": "b c', INSIDE), (b'{"a": "b\\', ESCAPED),
                                             (b'{"a": "b\\"', INSIDE), (b'{"a": "b\\""', OUTSIDE),
                                             (b'[1, 2]', OUTSIDE)])
def test_the_lexer_knows_where_strings_are(data, state):
    assert lex(data) == state


def test_whitespace_is_stripped_outside_strings_only():
    assert strip_outside_strings(b'{ "a b": [1, 2],\n "c": "d \\" e" }') == b'{"a b":[1,2],"c":"d \\" e"}'
    assert strip_outside_strings(b' tail", "next": 1', INSIDE) == b' tail","next":1'


def test_the_masks_drop_only_tokens_that_put_whitespace_outside_a_string(smollm2):
    vocabulary = TokenVocabulary.from_tokenizer(smollm2.tokenizer, smollm2.eos_token_ids)
    keep = whitespace_keep(vocabulary, vocabulary.size)
    ids = {text: smollm2.tokenizer.convert_tokens_to_ids(smollm2.tokenizer.tokenize(text))
           for text in (' "', '","', ' Sharma', '",')}
    assert all(len(v) == 1 for v in ids.values())
    space_quote, quote_comma_quote, word, quote_comma = (v[0] for v in ids.values())
    assert not is_allowed(keep[OUTSIDE], space_quote) and is_allowed(keep[INSIDE], space_quote)
    assert is_allowed(keep[OUTSIDE], quote_comma_quote) and is_allowed(keep[INSIDE], quote_comma_quote)
    assert is_allowed(keep[INSIDE], word) and not is_allowed(keep[OUTSIDE], word)
    assert is_allowed(keep[INSIDE], quote_comma) and is_allowed(keep[ESCAPED], space_quote)
    assert all(is_allowed(keep[OUTSIDE], t) for t in vocabulary.eos_token_ids)
