"""The KV cache keyword of the installed transformers: every runner passes the one the model's forward
takes, so a transformers that knows only ``past_key_values`` (5.17, as on a GPU image) still feeds our
caches; and a model that does not write through the ragged runner's cache is refused on the host,
before an index op that would abort a CUDA process."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM

from cdsl_struct.errors import CdslError
from cdsl_struct.models.batch import BatchRunner, Feed
from cdsl_struct.models.compat import cache_keyword, returned_cache
from cdsl_struct.models.ragged import RaggedRunner
from cdsl_struct.models.runner import ModelRunner
from tests.models.solo import close, solo, tiny_llama


class OlderLlama(LlamaForCausalLM):
    """A Llama whose forward takes its cache as ``past_key_values`` only, as transformers 5.17's does;
    an unknown ``cache=`` would vanish into ``**kwargs`` there."""

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                use_cache=None, logits_to_keep=0, **kwargs):
        if "cache" in kwargs:
            kwargs.pop("cache")  # ignored, as an older transformers would
        return super().forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                               past_key_values=past_key_values, use_cache=use_cache,
                               logits_to_keep=logits_to_keep, **kwargs)


class CacheIgnoringLlama(LlamaForCausalLM):
    """A model that builds a cache of its own whatever it is handed (a runner bug's stand-in)."""

    def forward(self, *args, cache=None, past_key_values=None, **kwargs):
        return super().forward(*args, **kwargs)


def _as(cls, model):
    model.__class__ = cls
    return model


def test_the_keyword_follows_the_forward_signature():
    class Newer(torch.nn.Module):
        def forward(self, input_ids=None, cache=None, **kwargs):
            return input_ids

    assert cache_keyword(Newer()) == "cache"
    assert cache_keyword(_as(OlderLlama, tiny_llama())) == "past_key_values"
    assert cache_keyword(object()) == "past_key_values"


def test_the_returned_cache_is_read_by_the_name_the_output_has():
    class OlderOutput(dict):
        past_key_values = "older"

    assert returned_cache(OlderOutput()) == "older"
    assert returned_cache({"cache": "newer"}) == "newer"


@pytest.mark.parametrize("runner", [ModelRunner, BatchRunner, RaggedRunner])
def test_every_runner_feeds_a_model_that_knows_only_past_key_values(runner):
    reference = tiny_llama()
    older = _as(OlderLlama, tiny_llama())
    sequences = {"a": [1, 2, 3, 4, 5], "b": [6, 7, 8], "c": [9, 10, 11, 12]}
    if runner is ModelRunner:
        got = {row: ModelRunner(older).run(seq, keep=1) for row, seq in sequences.items()}
        step = {row: ModelRunner(older).run(seq + [13], keep=1) for row, seq in sequences.items()}
    else:
        batched = runner(older)
        got = dict(zip(sequences, batched.run([Feed(row, seq, keep=1) for row, seq in sequences.items()]),
                       strict=True))
        step = dict(zip(sequences, batched.run([Feed(row, seq + [13], keep=1) for row, seq in sequences.items()]),
                        strict=True))
    for row, seq in sequences.items():
        assert close(got[row], solo(reference, seq))
        assert close(step[row], solo(reference, seq + [13]))


def test_a_model_that_ignores_the_ragged_cache_is_refused_on_the_host():
    runner = RaggedRunner(_as(CacheIgnoringLlama, tiny_llama()))
    with pytest.raises(CdslError, match="did not write through the runner's cache"):
        runner.run([Feed(row, seq, keep=1) for row, seq in {"a": [1, 2, 3], "b": [4, 5], "c": [6, 7, 8, 9]}.items()])
