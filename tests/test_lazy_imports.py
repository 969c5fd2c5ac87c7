"""``import cdsl_struct`` and the constraint layer load without torch or transformers (issue 41):
``Generator``, ``generate``, ``load_tokenizer`` and the ``models`` / ``decoding`` modules behind them
are imported on first access (PEP 562). Each check runs in a fresh interpreter, since this one has
long since imported torch.

Compiling for a tokenizer stays torch-free when it is given a ``tokenizers.Tokenizer`` (or a
``TokenVocabulary``) and the mask row is a numpy array; a tokenizer *name* or path goes through
``transformers.AutoTokenizer``, which imports torch itself, so that path is not asserted here."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import cdsl_struct


def _run(code: str) -> dict:
    """Run ``code`` in a fresh interpreter; it prints one JSON line, returned."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300, env={**__import__("os").environ, "OMP_NUM_THREADS": "1",
                                            "TOKENIZERS_PARALLELISM": "false"})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


HEAVY = '["torch", "transformers"]'


def test_the_constraint_layer_loads_without_torch():
    out = _run(f"""
        import json, sys
        import cdsl_struct as cs
        from cdsl_struct import Choice, CompileError, Grammar, JsonSchema, Regex, compile  # noqa: F401
        import cdsl_struct.constraints
        import cdsl_struct.models.tokenizers  # the models package no longer loads its runners
        cs.Regex("[a-z]+")
        cs.JsonSchema({{"type": "object", "properties": {{"a": {{"type": "integer"}}}}}})
        cs.Choice(["yes", "no"])
        cs.Grammar('start: "a"+')
        print(json.dumps({{"loaded": [m for m in {HEAVY} if m in sys.modules],
                          "dir": sorted(set(cs.__all__) - set(dir(cs)))}}))
    """)
    assert out == {"loaded": [], "dir": []}


def test_compiling_for_a_rust_tokenizer_and_filling_a_numpy_mask_stay_torch_free():
    out = _run(f"""
        import json, sys
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers
        import cdsl_struct as cs

        alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
        vocab = {{c: i for i, c in enumerate(alphabet)}}
        tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens(["<eos>"])
        vocabulary = cs.TokenVocabulary.from_tokenizer(tok, eos_token_ids=[tok.token_to_id("<eos>")])
        state = cs.compile(cs.Regex("[ab]+"), vocabulary).new_state()
        row = cs.allocate_bitmask(vocabulary.size, backend="numpy")
        state.fill_mask(row)
        allowed = [i for i in range(vocabulary.size) if row[i // 32] >> (i % 32) & 1]
        print(json.dumps({{"loaded": [m for m in {HEAVY} if m in sys.modules],
                          "allowed": [tok.id_to_token(i) for i in allowed]}}))
    """)
    assert out == {"loaded": [], "allowed": ["a", "b"]}


def test_the_heavy_names_still_import_and_then_load_torch():
    out = _run("""
        import json, sys
        import cdsl_struct as cs
        before = "torch" in sys.modules
        from cdsl_struct import Generator, generate, load_tokenizer, NAMED_TOKENIZERS
        from cdsl_struct.api import Generator as Home
        from cdsl_struct.models import load_model, RaggedRunner  # noqa: F401
        print(json.dumps({"before": before, "after": "torch" in sys.modules, "same": Generator is Home,
                          "named": list(NAMED_TOKENIZERS) == list(cs.NAMED_TOKENIZERS),
                          "modules": all(hasattr(cs, m) for m in ("api", "decoding", "models"))}))
    """)
    assert out == {"before": False, "after": True, "same": True, "named": True, "modules": True}


def test_every_exported_name_resolves_and_unknown_names_raise():
    for name in cdsl_struct.__all__:
        assert getattr(cdsl_struct, name) is not None
    assert set(cdsl_struct.__all__) <= set(dir(cdsl_struct))
    try:
        cdsl_struct.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("expected AttributeError")
