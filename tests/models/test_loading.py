"""``load_model`` refuses a name it cannot resolve at once, before any hub request or download."""

import time

import huggingface_hub
import pytest
import transformers

from cdsl_struct import ModelNotFound
from cdsl_struct.models import loading, tokenizers


@pytest.fixture
def hub_calls(monkeypatch, tmp_path):
    """Every way to the hub (and to a model download) records its call and fails it; the local
    Hugging Face cache is an empty folder."""
    calls = []
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))

    def refuse(what):
        def call(*args, **kwargs):
            calls.append((what, args[0] if args else kwargs))
            raise OSError(f"{what} is not reachable in this test")
        return call

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse("AutoTokenizer.from_pretrained"))
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse("AutoModel.from_pretrained"))
    for name in ("hf_hub_download", "snapshot_download"):
        monkeypatch.setattr(huggingface_hub, name, refuse(name))
    monkeypatch.setattr(loading, "gemma3_gguf_path", refuse("gemma3_gguf_path"))
    monkeypatch.setattr(loading, "smollm2_gguf_path", refuse("smollm2_gguf_path"))
    monkeypatch.setattr(tokenizers, "_loaded", {})
    return calls


@pytest.mark.parametrize(("name", "closest"), [("smolm2", "smollm2"), ("SmolLM-2", "smollm2"),
                                               ("gemma-270m", "gemma3-270m"), ("llama", None)])
def test_an_unknown_model_name_fails_at_once_without_the_hub(hub_calls, name, closest):
    started = time.monotonic()
    with pytest.raises(ModelNotFound) as info:
        loading.load_model(name, device="cpu")
    assert time.monotonic() - started < 1.0 and hub_calls == []
    message = str(info.value)
    assert f"could not load model {name!r}" in message and "smollm2" in message and "gemma3-270m" in message
    assert (f"did you mean {closest!r}" in message) == (closest is not None)
    assert "tokenizer" not in message.split("(")[0]  # it names models, not tokenizers


def test_a_missing_folder_fails_at_once(hub_calls, tmp_path):
    with pytest.raises(ModelNotFound, match="no such file or directory"):
        loading.load_model(str(tmp_path / "no-model"), device="cpu")
    assert hub_calls == []


@pytest.mark.parametrize("name", ["HuggingFaceTB/SmolLM2-135M-Instruct", "someone/some-model"])
def test_hub_ids_still_go_to_the_hub(hub_calls, name):
    with pytest.raises(Exception, match="not reachable in this test"):
        loading.load_model(name, device="cpu")
    assert hub_calls and hub_calls[0] == ("AutoTokenizer.from_pretrained", name)


def test_a_local_folder_still_loads_from_the_folder(hub_calls, tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    with pytest.raises(Exception, match="not reachable in this test"):
        loading.load_model(str(folder), device="cpu")
    assert hub_calls[0] == ("AutoTokenizer.from_pretrained", str(folder))


def test_a_gguf_keeps_its_cache_key_when_reinstalled_and_changes_with_its_content(tmp_path):
    import os

    original = tmp_path / "a" / "model.gguf"
    original.parent.mkdir()
    content = bytes(range(256)) * 20_000  # 5 MB: first, middle and last samples apart
    original.write_bytes(content)
    copy = tmp_path / "b" / "model.gguf"  # a new environment's copy, written later
    copy.parent.mkdir()
    copy.write_bytes(content)
    os.utime(copy, (1, 1))
    assert loading.gguf_key(copy) == loading.gguf_key(original)
    changed = bytearray(content)
    changed[len(content) // 2] ^= 1  # one byte of the weights in the middle
    copy.write_bytes(bytes(changed))
    assert loading.gguf_key(copy) != loading.gguf_key(original)
    copy.write_bytes(content + b"\0")  # one byte longer
    assert loading.gguf_key(copy) != loading.gguf_key(original)
