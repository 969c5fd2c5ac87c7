import pytest

from cdsl_struct import TokenizerNotFound, load_tokenizer
from cdsl_struct.models.tokenizers import NAMED_TOKENIZERS


def test_every_named_tokenizer_loads():
    for name in NAMED_TOKENIZERS:
        tokenizer = load_tokenizer(name)
        assert len(tokenizer) > 30_000, name
        assert tokenizer.eos_token_id is not None, name


def test_same_name_gives_same_object():
    assert load_tokenizer("gpt2") is load_tokenizer("gpt2")


def test_unknown_tokenizer_is_a_typed_error(tmp_path):
    with pytest.raises(TokenizerNotFound, match="could not load tokenizer"):
        load_tokenizer(str(tmp_path / "no-such-tokenizer"))
