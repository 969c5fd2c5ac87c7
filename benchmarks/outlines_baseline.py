"""The real ``outlines`` package as a benchmark baseline: what a user would otherwise pick.

``OutlinesBaseline(model, tokenizer)`` wraps ``outlines.from_transformers`` around the same model
object the bench decodes with, and runs one ``outlines.Generator`` per constraint (built before
timing). The constraint is the same one: JSON Schema with Outlines' ``whitespace_pattern`` set to
our JSON whitespace slot (the library's default unless told otherwise), regexes as ``outlines.types.Regex``, choices
as ``outlines.types.Choice``, Lark grammars as ``outlines.types.CFG``. Where Outlines cannot
build a generator for a constraint, ``unsupported`` records why and the bench says so.

Needs the extra ``outlines``. Outlines' first generation compiles its mask kernel (``torch.compile``,
~15 s); ``warm_up`` pays that before timing.
"""

from __future__ import annotations

import json
import time
from typing import Any

from cdsl_struct.constraints import WhitespacePolicy
from cdsl_struct.options import DEFAULT_WHITESPACE


class OutlinesBaseline:
    """Greedy generation with ``outlines.Generator`` over an already loaded transformers model."""

    def __init__(self, model: Any, tokenizer: Any, whitespace: str = DEFAULT_WHITESPACE) -> None:
        import outlines

        self._outlines = outlines
        self.model = outlines.from_transformers(model, tokenizer)
        self.tokenizer = tokenizer
        self.whitespace = WhitespacePolicy.parse(whitespace).pattern
        self._generators: dict[str, Any] = {}
        self.unsupported: dict[str, str] = {}

    def output_type(self, spec: Any) -> Any:
        """The Outlines output type for one of our specs (None: free text, no output type)."""
        if spec is None:
            return None
        types = self._outlines.types
        if spec.kind == "json_schema":
            return types.JsonSchema(json.dumps(spec.schema), whitespace_pattern=self.whitespace)
        if spec.kind == "regex":
            return types.Regex(spec.engine_pattern)  # the language our engines compile
        if spec.kind == "choice":
            return types.Choice(list(spec.options))
        if spec.kind == "grammar":
            return types.CFG(spec.text)
        raise ValueError(f"no Outlines type for {spec.kind}")

    def prepare(self, spec: Any) -> bool:
        """Build (once) the generator for ``spec``; False, with the reason kept, where Outlines cannot."""
        key = _key(spec)
        if key in self._generators:
            return True
        if key in self.unsupported:
            return False
        try:
            self._generators[key] = self._outlines.Generator(self.model, self.output_type(spec))
        except Exception as exc:  # noqa: BLE001 - any failure of Outlines to build it is "cannot express"
            self.unsupported[key] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:160]}"
            return False
        return True

    def reason(self, spec: Any) -> str | None:
        """Why Outlines could not take ``spec`` (None if it could)."""
        return self.unsupported.get(_key(spec))

    def warm_up(self, spec: Any, prompt: str) -> None:
        """One short untimed generation (Outlines compiles its mask kernel on the first)."""
        if self.prepare(spec):
            self._generators[_key(spec)](prompt, max_new_tokens=2, do_sample=False)

    def generate(self, spec: Any, prompt: str, max_tokens: int) -> dict[str, Any] | None:
        """Greedy output for one chat-formatted ``prompt`` and its wall time; None if unsupported."""
        if not self.prepare(spec):
            return None
        start = time.perf_counter()
        text = self._generators[_key(spec)](prompt, max_new_tokens=max_tokens, do_sample=False)
        wall = time.perf_counter() - start
        return {"text": text, "wall_s": round(wall, 4), "tokens": self._count(text)}

    def generate_batch(self, spec: Any, prompts: list[str], max_tokens: int) -> dict[str, Any] | None:
        """``Generator.batch``: one padded ``generate`` over ``prompts``; None if unsupported."""
        if not self.prepare(spec):
            return None
        start = time.perf_counter()
        texts = self._generators[_key(spec)].batch(prompts, max_new_tokens=max_tokens, do_sample=False)
        wall = time.perf_counter() - start
        return {"texts": texts, "wall_s": round(wall, 4), "tokens": sum(self._count(t) for t in texts)}

    def _count(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))


def chat_text(tokenizer: Any, prompt: str) -> str:
    """The prompt as the chat template writes it (Outlines takes text; the same ids as ours)."""
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                         tokenize=False)


def _key(spec: Any) -> str:
    return "free" if spec is None else spec.key
