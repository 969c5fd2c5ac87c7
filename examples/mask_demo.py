"""Constrained-mask demo on the embedded default model's tokenizer (SmolLM2).

Compiles the JSON Schema in ``examples/schemas/person.json``, then walks a candidate output
token by token the way a decoder would: fill the mask, check the token, advance. It shows the
engine ``auto`` chose, compile and mask times, the tokens the schema forces, a rejected token,
and a rollback. Run with ``make demo``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import cdsl_struct as cs
from cdsl_struct.constraints import allowed_tokens, is_allowed

SCHEMA_FILE = Path(__file__).parent / "schemas" / "person.json"
CANDIDATE = '{"name":"Ada Lovelace","age":36,"languages":["en","fr"]}'
NOT_ALLOWED = '{"name":"Ada","age":"thirty-six"}'


def main() -> int:
    tokenizer = cs.load_tokenizer("smollm2")
    start = time.perf_counter()
    compiled = cs.compile(cs.JsonSchema(SCHEMA_FILE.read_text()), tokenizer)
    vocab = compiled.vocabulary
    print(f"schema     {SCHEMA_FILE.name}  engine={compiled.backend}  "
          f"compile={1e3 * (time.perf_counter() - start):.1f} ms  vocab={vocab.size} tokens")
    for skipped, why in compiled.skipped:
        print(f"           skipped {skipped}: {why}")

    state = compiled.new_state()
    row = cs.allocate_bitmask(vocab.size)
    forced = state.forced_tokens()
    print(f"forced     {vocab.decode(forced).decode()!r} ({len(forced)} tokens, no model call needed)")

    print("\nwalk       token            allowed-next")
    for token in vocab.encode(CANDIDATE):
        state.fill_mask(row)
        assert is_allowed(row, token)
        count = len(allowed_tokens(row, vocab.size))
        print(f"           {vocab.token_bytes[token].decode(errors='replace')!r:16} {count:6d}")
        state.advance(token)
    state.fill_mask(row)
    print(f"complete   {state.is_complete()}  (EOS allowed: {is_allowed(row, vocab.eos_token_id)})")
    print(f"mask time  {1e6 * state.mask_seconds / state.mask_calls:.1f} us per mask on average")
    print(f"value      {json.loads(CANDIDATE)}")

    state.rollback(4)
    print(f"\nrollback   4 tokens back -> {vocab.decode(vocab.encode(CANDIDATE)[:-4]).decode()!r}")
    bad = compiled.new_state()
    try:
        bad.advance(vocab.encode(NOT_ALLOWED))
    except cs.InvalidToken as error:
        print(f"rejected   {NOT_ALLOWED!r}: {error}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
