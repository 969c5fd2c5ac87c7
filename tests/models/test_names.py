"""Model and tokenizer names are read before anything loads: known names, paths, hub ids, typos."""

import pytest
from huggingface_hub import constants

from cdsl_struct.models.loading import KNOWN_MODELS
from cdsl_struct.models.names import in_hub_cache, is_hub_id, looks_like_path, unresolvable


@pytest.fixture(autouse=True)
def empty_hub_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache: what this machine happens to hold cannot change the answers."""
    cache = tmp_path / "hub-cache"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


@pytest.mark.parametrize("name", ["HuggingFaceTB/SmolLM2-135M-Instruct", "Qwen/Qwen3-0.6B", "a/b", "org_1/x.y-z"])
def test_hub_ids_pass_through(name):
    assert is_hub_id(name) and unresolvable(name, KNOWN_MODELS, "model") is None


@pytest.mark.parametrize("name", ["smolm2", "SmolLM2", "gpt2", "gemma3", "", " ", "a b", "x/y/z", "/no/such/dir",
                                  "./nope"])
def test_other_names_are_refused(name):
    assert unresolvable(name, KNOWN_MODELS, "model")


def test_a_typo_names_the_known_ones_and_the_closest():
    problem = unresolvable("smolm2", KNOWN_MODELS, "model")
    assert "did you mean 'smollm2'?" in problem and all(known in problem for known in KNOWN_MODELS)
    assert "did you mean 'gemma3-270m'?" in unresolvable("gemma3", KNOWN_MODELS, "model")
    assert "did you mean" not in unresolvable("qwerty", KNOWN_MODELS, "model")


def test_a_missing_path_says_so(tmp_path):
    for missing in (str(tmp_path / "model"), "./no-such-model", "models/a/b"):
        assert looks_like_path(missing)
        assert "no such file or directory" in unresolvable(missing, KNOWN_MODELS, "model")


def test_existing_local_paths_pass_through(tmp_path, monkeypatch):
    folder = tmp_path / "my-model"
    folder.mkdir()
    assert unresolvable(str(folder), KNOWN_MODELS, "model") is None
    monkeypatch.chdir(tmp_path)
    assert unresolvable("my-model", KNOWN_MODELS, "model") is None  # a bare name that is a folder here


def test_a_bare_id_passes_only_when_the_hub_cache_holds_it(empty_hub_cache):
    assert not in_hub_cache("distilgpt2") and unresolvable("distilgpt2", KNOWN_MODELS, "model")
    (empty_hub_cache / "models--distilgpt2").mkdir()
    assert in_hub_cache("distilgpt2") and unresolvable("distilgpt2", KNOWN_MODELS, "model") is None
