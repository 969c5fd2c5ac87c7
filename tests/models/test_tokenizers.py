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


def test_an_unknown_tokenizer_name_fails_at_once_without_the_hub(monkeypatch, tmp_path):
    import huggingface_hub
    import transformers

    def no_hub(*args, **kwargs):
        raise AssertionError("the hub was asked for a name that is a typo")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", no_hub)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(TokenizerNotFound) as info:
        load_tokenizer("lama3")
    message = str(info.value)
    assert "could not load tokenizer 'lama3'" in message and "did you mean 'llama3'?" in message
    assert all(name in message for name in NAMED_TOKENIZERS)


def test_a_hub_id_still_goes_to_the_hub(monkeypatch):
    import transformers

    asked = []

    def offline(source, *args, **kwargs):
        asked.append(source)
        raise OSError("offline in this test")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", offline)
    with pytest.raises(TokenizerNotFound, match="offline in this test"):
        load_tokenizer("someone/some-tokenizer")
    assert asked == ["someone/some-tokenizer"]
