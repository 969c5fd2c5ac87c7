"""The load-time self-check: the ragged runner serves only a model it agrees with; a runner that
raises or computes wrong logits sends the model to the padded runner, logged and reported."""

from __future__ import annotations

import logging

import pytest
import torch

from cdsl_struct.decoding.engine import BatchEngine
from cdsl_struct.models import ragged, ragged_attention, self_check
from cdsl_struct.models.batch import BatchRunner
from cdsl_struct.models.ragged import RaggedRunner
from cdsl_struct.models.self_check import batch_runner, check_ragged
from tests.models.solo import tiny_llama


def test_a_sound_model_gets_the_ragged_runner_checked_once(monkeypatch):
    model = tiny_llama()
    checks = []
    monkeypatch.setattr(self_check, "check_ragged", lambda m: checks.append(m) or check_ragged(m))
    assert isinstance(batch_runner(model), RaggedRunner)
    assert isinstance(batch_runner(model), RaggedRunner)
    assert checks == [model]


def test_the_real_model_passes_its_check(smollm2):
    assert check_ragged(smollm2.model) is None


def _broken_attention(*args, **kwargs):
    out = _real_attention(*args, **kwargs)
    return out + 0.5  # every attended value off: wrong logits, no error


_real_attention = ragged_attention.row_attention


@pytest.mark.parametrize("failure", ["wrong logits", "an error"])
def test_a_runner_that_fails_its_check_never_serves(monkeypatch, caplog, failure):
    """Both ways a runner can fail on some device: it raises (the CUDA crash), or it answers wrongly."""
    def crash(*args, **kwargs):
        raise RuntimeError("output with shape [1, 9, 1, 1] doesn't match the broadcast shape [1, 9, 1, 45]")

    monkeypatch.setattr(ragged_attention, "row_attention", _broken_attention if failure == "wrong logits" else crash)
    model = tiny_llama()
    with caplog.at_level(logging.WARNING, logger=self_check.__name__):
        runner = batch_runner(model, pad_token_id=0)
    assert type(runner) is BatchRunner
    expected = "logits differ" if failure == "wrong logits" else "RuntimeError: output with shape"
    assert expected in runner.fallback_reason
    assert any("self-check" in r.getMessage() and expected in r.getMessage() for r in caplog.records)
    engine = BatchEngine(runner, max_batch_size=2, kv_budget_bytes=float("inf"), mask_workers=0)
    try:
        assert engine.load().runner_fallback == runner.fallback_reason
    finally:
        engine.close()
    monkeypatch.setattr(ragged_attention, "row_attention", _real_attention)  # the padded runner never attends ragged
    with torch.inference_mode():
        out = runner.run([ragged.Feed("a", [1, 2, 3], 1)])
    assert torch.isfinite(out[0]).all()


def test_padded_on_request_skips_the_check(monkeypatch):
    monkeypatch.setenv("CDSL_RUNNER", "padded")
    monkeypatch.setattr(self_check, "check_ragged", lambda m: pytest.fail("checked"))
    assert type(batch_runner(tiny_llama())) is BatchRunner



def test_a_bfloat16_model_passes_and_a_broken_one_does_not(smollm2, monkeypatch):
    """bfloat16's rounding (over a logit at SmolLM2's scale, on an H100 as on this CPU) is not a
    failure; attention that is off everywhere still is."""
    import copy

    model = copy.deepcopy(smollm2.model).to(torch.bfloat16)
    assert check_ragged(model) is None
    monkeypatch.setattr(ragged_attention, "row_attention", _broken_attention)
    assert "logits differ" in check_ragged(model)


def test_the_int8_drafts_check_runs_on_its_first_layers_and_still_catches_a_broken_step(smollm2, monkeypatch):
    """The float check of the int8 self-draft's plumbing runs on its first two layers (all of
    SmolLM2's are alike), and its own step (``Int8Forward``) with its positions doubled still fails it."""
    from cdsl_struct.models import int8_forward
    from cdsl_struct.models.runner import self_draft

    draft = self_draft(smollm2.model, "int8")
    checked = []
    real = self_check.check_runner
    monkeypatch.setattr(self_check, "check_runner",
                        lambda runner: checked.append(len(runner.model.model.layers)) or real(runner))
    assert check_ragged(draft) is None and checked == [2]
    assert len(draft.model.layers) == 30 and draft.config.num_hidden_layers == 30  # the draft itself untouched
    rotary = int8_forward.Int8Forward._rotary
    monkeypatch.setattr(int8_forward.Int8Forward, "_rotary", lambda self, positions: rotary(self, positions * 2))
    assert "logits differ" in check_ragged(draft)


@pytest.mark.parametrize(("kinds", "layers"), [(None, 2), (["full_attention"] * 30, 2),
                                               (["sliding_attention"] * 3 + ["full_attention"] * 27, 4),
                                               (["full_attention"] * 21 + ["sliding_attention"] * 9, 22)])
def test_the_plumbing_check_reaches_a_layer_of_each_kind(kinds, layers):
    from types import SimpleNamespace

    config = SimpleNamespace(layer_types=kinds)
    model = SimpleNamespace(config=config, model=SimpleNamespace(layers=[object()] * 30))
    assert self_check.plumbing_layers(model) == layers
