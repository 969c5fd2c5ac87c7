"""``decoding.decode`` (a padded one-row engine per call) is deprecated for one release: it warns,
pointing at ``Generator`` and ``BatchEngine``, and still gives what the batched engine gives."""

import pytest

from cdsl_struct import Regex, compile
from cdsl_struct.decoding import BatchEngine, Request, decode
from cdsl_struct.models import ModelRunner, batch_runner
from tests.decoding.test_mechanics_tiny import letters_vocab, tiny_model


def test_decode_warns_and_still_decodes_as_the_engine_does():
    model = tiny_model(1)
    compiled = compile(Regex("[a-d][a-h]"), letters_vocab(), backend="outlines-core")
    target = ModelRunner(model)
    with pytest.warns(DeprecationWarning, match=r"decode\(\) is deprecated.*Generator.*BatchEngine"):
        old = decode(target, compiled, [0, 1, 2], max_tokens=4)
    engine = BatchEngine(batch_runner(model), max_batch_size=4, kv_budget_bytes=float("inf"), mask_workers=0)
    try:
        new = engine.run([Request((0, 1, 2), compiled, max_tokens=4)])[0]
    finally:
        engine.close()
    assert old.tokens == new.tokens and old.finish_reason == new.finish_reason == "stop"
    assert target.passes > 0  # its passes still count on the target, as before
