"""Structural tags: free text in which a trigger string starts a constrained segment.

``StructuralTag(tags, triggers)``: the output is free text, except that wherever one of the
``triggers`` is written it must go on as one of the tags that begin with it: the rest of the
tag's ``begin``, its content (a JSON value valid under a schema, a regex match, or a Lark
grammar's sentence) and its ``end``; then free text again. Free text never holds a trigger
otherwise. ``at_least_one`` asks for one tag or more; ``stop_after_first`` ends the output with
the first tag's ``end``. (The shape of vLLM's and XGrammar's ``structural_tag`` response format.)

It compiles to ONE llguidance grammar (Lark dialect): the text before a trigger and the trigger
itself are one lexeme (``/(?s:.*)T/`` minus every text holding a trigger before its end), so the
lexer cannot end free text anywhere but at a trigger, and each JSON content is embedded with
``%json``. A regex content followed by a non-empty ``end`` is one lazy lexeme: the segment ends at
the first place where the regex matches and ``end`` follows (a JSON or grammar content ends where
its value does).

Refused up front with ``InvalidStructuralTag``: no tags, no or empty triggers, a trigger inside
another (the text lexemes would be ambiguous), a begin that starts with no trigger, a trigger that
starts no tag, and a grammar content with an empty ``end``; a bad schema, regex or grammar raises
its own ``CompileError``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidStructuralTag
from .specs import ConstraintSpec, Grammar, JsonSchema, Regex, escape_regex
from .whitespace import DEFAULT_WHITESPACE, WhitespacePolicy


@dataclass(frozen=True)
class Tag:
    """One tag: ``begin`` (starts with a trigger), its ``content`` and its ``end`` string.

    ``content``: a ``JsonSchema`` / ``Regex`` / ``Grammar`` spec, or a JSON Schema given as a dict,
    JSON text or pydantic model (read as ``JsonSchema``).
    """

    begin: str
    content: ConstraintSpec
    end: str = ""

    def __init__(self, begin: str, content: Any, end: str = "") -> None:
        if not isinstance(begin, str) or not begin:
            raise InvalidStructuralTag(f"a tag's begin must be a non-empty string, got {begin!r}")
        if not isinstance(end, str):
            raise InvalidStructuralTag(f"a tag's end must be a string, got {end!r}")
        if not isinstance(content, (JsonSchema, Regex, Grammar)):
            if isinstance(content, ConstraintSpec):
                raise InvalidStructuralTag(f"a tag's content must be a JSON Schema, a Regex or a Grammar, not "
                                           f"{type(content).__name__}")
            content = JsonSchema(content)
        if isinstance(content, Grammar) and not end:
            raise InvalidStructuralTag(f"tag {begin!r}: a grammar content needs a non-empty end string (where its "
                                       "sentence stops would be ambiguous)")
        object.__setattr__(self, "begin", begin)
        object.__setattr__(self, "content", content)
        object.__setattr__(self, "end", end)


@dataclass(frozen=True)
class TagSegment:
    """One tag as written in an output: which tag (``index`` into ``StructuralTag.tags``), its
    content's ``text``, and ``value`` (the parsed JSON for a JSON content, else the text)."""

    index: int
    begin: str
    text: str
    value: Any
    end: str
    start: int
    """Where the segment's begin starts in the output."""


class StructuralTag(Grammar):
    """Free text in which each trigger starts one of its tags (see the module docstring).

    ``tags``: ``Tag``s or ``{"begin", "schema" | "regex" | "grammar", "end"}`` dicts.
    ``triggers``: strings each tag's begin starts with (default: the begins themselves).
    ``at_least_one``: the output holds at least one tag. ``stop_after_first``: it ends with the
    first tag. The finished output's value is the list of ``TagSegment``s in it.
    """

    kind = "grammar"

    def __init__(self, tags: Sequence[Any], triggers: Sequence[str] | None = None, *,
                 at_least_one: bool = False, stop_after_first: bool = False) -> None:
        if isinstance(tags, (str, bytes, Mapping)) or not isinstance(tags, Sequence) or not tags:
            raise InvalidStructuralTag("a structural tag needs a non-empty list of tags")
        parsed = tuple(tag if isinstance(tag, Tag) else _tag_from_dict(tag, i) for i, tag in enumerate(tags))
        chosen = _check_triggers(parsed, triggers)
        object.__setattr__(self, "tags", parsed)
        object.__setattr__(self, "triggers", chosen)
        object.__setattr__(self, "at_least_one", bool(at_least_one))
        object.__setattr__(self, "stop_after_first", bool(stop_after_first))
        text = self.lark(WhitespacePolicy.parse(DEFAULT_WHITESPACE))
        object.__setattr__(self, "source", text)
        object.__setattr__(self, "text", text)
        object.__setattr__(self, "origin", "<structural tag>")

    def __repr__(self) -> str:
        return (f"StructuralTag(tags={list(self.tags)!r}, triggers={list(self.triggers)!r}, "
                f"at_least_one={self.at_least_one}, stop_after_first={self.stop_after_first})")

    @property
    def key(self) -> str:
        return "structural_tag:" + self.text

    def openers(self) -> tuple[str, ...]:
        """The tags' begins, shortest first: what a budget closer writes to open a tag where one
        must still be written (``at_least_one``)."""
        return tuple(sorted(dict.fromkeys(tag.begin for tag in self.tags), key=len))

    def trigger_of(self, tag: Tag) -> str:
        """The trigger ``tag``'s begin starts with."""
        return next(t for t in self.triggers if tag.begin.startswith(t))

    # --- the grammar ---------------------------------------------------------------------------

    def lark(self, policy: WhitespacePolicy, specials: Mapping[str, int] | None = None) -> str:
        """The main grammar in llguidance's Lark dialect (grammar contents as ``@tag_K``). ``specials``:
        texts of the vocabulary's special tokens in the triggers, begins and ends (see
        ``special_tokens_in``), which may then be written as those tokens too."""
        specials = specials or {}
        alternatives = " | ".join(f"open_{i} after_{i}" for i in range(len(self.triggers)))
        if self.stop_after_first:
            start = "piece" if self.at_least_one else "TEXT | piece"
        else:
            start = f"piece{'+' if self.at_least_one else '*'} TEXT"
        lines = [f"start: {start}", f"piece: {alternatives}"]
        for i, trigger in enumerate(self.triggers):
            tags = [k for k, tag in enumerate(self.tags) if self.trigger_of(tag) == trigger]
            lines.append(f"after_{i}: " + " | ".join(f"tag_{k}" for k in tags))
            lines.append(f"OPEN_{i}: {text_then(trigger, self.triggers)}")
            token = specials.get(trigger)
            lines.append(f"open_{i}: OPEN_{i}" + (f" | TEXT <[{token}]>" if token is not None else ""))
        for k, tag in enumerate(self.tags):
            rest = tag.begin[len(self.trigger_of(tag)):]
            lines.extend(self._tag_rules(k, tag, rest, policy, specials))
        lines.append(f"TEXT: {text_without(self.triggers)}")
        return "\n".join(lines) + "\n"

    @staticmethod
    def _tag_rules(k: int, tag: Tag, rest: str, policy: WhitespacePolicy, specials: Mapping[str, int]) -> list[str]:
        head = f"{lark_literal(rest, specials=specials)} " if rest else ""
        tail = f" {lark_literal(tag.end, specials=specials)}" if tag.end else ""
        content = tag.content
        if isinstance(content, JsonSchema):
            return [f"tag_{k}: {head}content_{k}{tail}", f"content_{k}: %json {embedded_json(content.schema, policy)}"]
        if isinstance(content, Regex):
            pattern = lark_regex(content.engine_pattern)
            if tag.end:  # ends at the first place the regex matches with the end after it (spelled out)
                end = json.dumps(tag.end, ensure_ascii=False)
                return [f"tag_{k}: {head}content_{k}", f"content_{k}[lazy]: {pattern} {end}"]
            return [f"tag_{k}: {head}CONTENT_{k}", f"CONTENT_{k}: {pattern}"]
        return [f"tag_{k}: {head}@tag_{k}{tail}"]

    def engine_grammar(self, policy: WhitespacePolicy, vocabulary: Any = None) -> str:
        """What llguidance compiles: the Lark grammar, with the grammar contents beside it as named
        grammars of one top-level grammar when there are any."""
        import llguidance

        texts = [*self.triggers, *(t.begin for t in self.tags), *(t.end for t in self.tags)]
        main = self.lark(policy, special_tokens_in(vocabulary, texts) if vocabulary is not None else None)
        subs = [{"name": f"tag_{k}", "lark_grammar": tag.content.text}
                for k, tag in enumerate(self.tags) if isinstance(tag.content, Grammar)]
        if not subs:
            return llguidance.LLMatcher.grammar_from_lark(main)
        return json.dumps({"grammars": [{"name": "structural_tag", "lark_grammar": main}, *subs]})

    def with_closed_objects(self) -> StructuralTag:
        """This spec with every JSON content closed to undeclared keys (``closed_objects``);
        ``self`` when that changes nothing."""
        from .closed_objects import closed_spec

        tags = tuple(Tag(tag.begin, closed_spec(tag.content), tag.end) for tag in self.tags)
        if all(new.content is old.content for new, old in zip(tags, self.tags, strict=True)):
            return self
        return StructuralTag(tags, self.triggers, at_least_one=self.at_least_one,
                             stop_after_first=self.stop_after_first)

    # --- reading an output ---------------------------------------------------------------------

    def parser(self) -> Any:
        """An object whose ``parse(text)`` gives the segments (lark cannot read ``%json``)."""
        return self

    def parse(self, text: str) -> list[TagSegment]:
        """The tags written in a finished output, in order (``InvalidStructuralTag`` when the text
        does not follow this spec)."""
        segments: list[TagSegment] = []
        position = 0
        while True:
            found = _first_trigger(text, position, self.triggers)
            if found is None:
                return segments
            start, trigger = found
            segment = self._segment_at(text, start, trigger)
            segments.append(segment)
            position = start + len(segment.begin) + len(segment.text) + len(segment.end)
            if self.stop_after_first:
                return segments

    def _segment_at(self, text: str, start: int, trigger: str) -> TagSegment:
        for k, tag in enumerate(self.tags):
            if self.trigger_of(tag) != trigger or not text.startswith(tag.begin, start):
                continue
            body = start + len(tag.begin)
            end = _content_end(tag, text, body)
            if end is None or not text.startswith(tag.end, end):
                continue
            content = text[body:end]
            value = json.loads(content) if isinstance(tag.content, JsonSchema) else content
            return TagSegment(k, tag.begin, content, value, tag.end, start)
        raise InvalidStructuralTag(f"the trigger {trigger!r} at {start} is not followed by any of its tags")


def _content_end(tag: Tag, text: str, body: int) -> int | None:
    """Where ``tag``'s content starting at ``body`` ends (None: it does not parse there)."""
    content = tag.content
    if isinstance(content, JsonSchema):
        try:
            _, end = json.JSONDecoder().raw_decode(text, body)
        except ValueError:
            return None
        return end
    if tag.end:
        found = text.find(tag.end, body)
        return None if found < 0 else found
    match = re.compile(content.pattern).match(text, body)  # a regex with no end: greedy
    return None if match is None else match.end()


def _first_trigger(text: str, position: int, triggers: Sequence[str]) -> tuple[int, str] | None:
    hits = [(found, trigger) for trigger in triggers if (found := text.find(trigger, position)) >= 0]
    return min(hits) if hits else None


def _tag_from_dict(tag: Any, index: int) -> Tag:
    if not isinstance(tag, Mapping):
        raise InvalidStructuralTag(f"tag {index} must be a Tag or a dict with begin, schema and end")
    contents = [key for key in ("schema", "regex", "grammar") if tag.get(key) is not None]
    if len(contents) != 1:
        raise InvalidStructuralTag(f"tag {index} needs exactly one of schema, regex and grammar")
    value = tag[contents[0]]
    content = {"schema": lambda: JsonSchema(value), "regex": lambda: Regex(value),
               "grammar": lambda: Grammar.from_text(value)}[contents[0]]()
    return Tag(tag.get("begin"), content, tag.get("end", ""))  # type: ignore[arg-type]


def _check_triggers(tags: tuple[Tag, ...], triggers: Sequence[str] | None) -> tuple[str, ...]:
    if triggers is None:
        triggers = list(dict.fromkeys(tag.begin for tag in tags))
    if isinstance(triggers, (str, bytes)) or not isinstance(triggers, Sequence) or not triggers:
        raise InvalidStructuralTag("triggers must be a non-empty list of strings")
    if not all(isinstance(t, str) and t for t in triggers):
        raise InvalidStructuralTag(f"every trigger must be a non-empty string, got {list(triggers)!r}")
    chosen = tuple(dict.fromkeys(triggers))
    for a in chosen:
        for b in chosen:
            if a != b and a in b:
                raise InvalidStructuralTag(f"trigger {a!r} is inside trigger {b!r}; triggers must not contain each "
                                           "other (use the shorter one for both tags)")
    for tag in tags:
        if not any(tag.begin.startswith(t) for t in chosen):
            raise InvalidStructuralTag(f"tag begin {tag.begin!r} does not start with any trigger "
                                       f"({', '.join(map(repr, chosen))})")
    unused = [t for t in chosen if not any(tag.begin.startswith(t) for tag in tags)]
    if unused:
        raise InvalidStructuralTag(f"trigger {unused[0]!r} starts no tag's begin; drop it or add a tag for it")
    return chosen


# --- pieces shared with the tool-call formats ------------------------------------------------------


def lark_regex(pattern: str) -> str:
    """``pattern`` as a Lark regex literal ``/.../`` (a ``/`` inside escaped; a newline as ``\\n``)."""
    escaped = re.sub(r"(?<!\\)((?:\\\\)*)/", r"\1\\/", pattern).replace("\n", "\\n").replace("\r", "\\r")
    return f"/{escaped}/"


def _literal_regex(text: str) -> str:
    """``text`` as a regex that matches it literally (inside a Lark ``/.../``)."""
    return escape_regex(text).replace("/", "\\/").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")


def _any_of(triggers: Sequence[str]) -> str:
    return "(?:" + "|".join(_literal_regex(t) for t in triggers) + ")"


def text_without(triggers: Sequence[str]) -> str:
    """A Lark terminal body: any text (possibly empty) that holds none of ``triggers``."""
    return f"/(?s:.*)/ & ~/(?s:.*{_any_of(triggers)}.*)/"


def text_then(trigger: str, triggers: Sequence[str]) -> str:
    """A Lark terminal body: text that holds none of ``triggers``, then ``trigger``, as one lexeme
    (the lexer cannot end the text anywhere else)."""
    return f"/(?s:.*){_literal_regex(trigger)}/ & ~/(?s:.*{_any_of(triggers)}(?s:.+))/"


def special_tokens_in(vocabulary: Any, texts: Sequence[str]) -> dict[str, int]:
    """The special tokens of ``vocabulary`` whose text occurs in one of ``texts`` (Qwen 3's
    ``<tool_call>``), by text: a model writes such a marker as that one token, which a grammar must
    name to allow (llguidance never lets special tokens through otherwise)."""
    found: dict[str, int] = {}
    for token_id in sorted(vocabulary.special_ids):
        raw = vocabulary.token_bytes[token_id]
        if len(raw) < 3:
            continue
        text = raw.decode("utf-8", errors="replace")
        if text not in found and any(text in piece for piece in texts):
            found[text] = token_id
    return found


def lark_literal(text: str, *, specials: Mapping[str, int]) -> str:
    """``text`` as Lark: a string, where a special token's text inside it (``specials``) may be
    written as that token or spelled out."""
    if not specials:
        return json.dumps(text, ensure_ascii=False)
    pattern = "|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True))
    parts = []
    for piece in re.split(f"({pattern})", text):
        if piece in specials:
            parts.append(f"({json.dumps(piece, ensure_ascii=False)} | <[{specials[piece]}]>)")
        elif piece:
            parts.append(json.dumps(piece, ensure_ascii=False))
    return " ".join(parts)


def embedded_json(schema: Any, policy: WhitespacePolicy) -> str:
    """A schema for ``%json``, carrying the whitespace policy the way llguidance reads it."""
    from .backends.llguidance_backend import _json_options  # one source of the options

    if isinstance(schema, bool):
        schema = {} if schema else {"not": {}}
    return json.dumps({**schema, "x-guidance": _json_options(policy)}, ensure_ascii=False)


# --- the response_format shapes ----------------------------------------------------------------------

_XGRAMMAR_CONTENTS = ("json_schema", "regex", "const_string", "any_text")


def from_response_format(fmt: Mapping[str, Any]) -> StructuralTag:
    """The ``StructuralTag`` of a ``response_format`` of type ``structural_tag``, in vLLM's shape
    (``{"structures": [{"begin", "schema", "end"}], "triggers": [...]}``) or XGrammar's
    (``{"format": {"type": "triggered_tags", "triggers", "tags": [{"begin", "content", "end"}],
    "at_least_one", "stop_after_first"}}``, contents ``json_schema``, ``regex``, ``const_string`` and
    ``any_text``). Anything else raises ``InvalidStructuralTag`` saying what is supported."""
    if not isinstance(fmt, Mapping):
        raise InvalidStructuralTag("a structural_tag response_format must be an object")
    if fmt.get("format") is not None:
        if fmt.get("structures") is not None:
            raise InvalidStructuralTag("give either structures and triggers (vLLM) or format (XGrammar), not both")
        return _from_xgrammar(fmt["format"])
    structures = fmt.get("structures")
    if not isinstance(structures, list) or not structures:
        raise InvalidStructuralTag("a structural_tag response_format needs a non-empty list of structures "
                                   '({"begin", "schema", "end"}) and their triggers')
    tags = []
    for i, structure in enumerate(structures):
        if not isinstance(structure, Mapping) or "schema" not in structure or "begin" not in structure:
            raise InvalidStructuralTag(f"structures[{i}] must be an object with begin, schema and end")
        tags.append(Tag(structure["begin"], structure["schema"], structure.get("end", "")))
    if fmt.get("triggers") is None:
        raise InvalidStructuralTag("a structural_tag response_format needs triggers: the strings the structures' "
                                   "begins start with")
    return StructuralTag(tags, fmt["triggers"])


def _from_xgrammar(form: Any) -> StructuralTag:
    if not isinstance(form, Mapping) or form.get("type") != "triggered_tags":
        kind = form.get("type") if isinstance(form, Mapping) else type(form).__name__
        raise InvalidStructuralTag(f"structural_tag format of type {kind!r} is not supported; use "
                                   "'triggered_tags' (or vLLM's structures and triggers)")
    tags = form.get("tags")
    if not isinstance(tags, list) or not tags:
        raise InvalidStructuralTag("a triggered_tags format needs a non-empty list of tags")
    return StructuralTag([_xgrammar_tag(tag, i) for i, tag in enumerate(tags)], form.get("triggers"),
                         at_least_one=bool(form.get("at_least_one", False)),
                         stop_after_first=bool(form.get("stop_after_first", False)))


def _xgrammar_tag(tag: Any, index: int) -> Tag:
    if not isinstance(tag, Mapping) or tag.get("type", "tag") != "tag" or "begin" not in tag:
        raise InvalidStructuralTag(f"tags[{index}] must be {{\"type\": \"tag\", \"begin\", \"content\", \"end\"}}")
    end = tag.get("end", "")
    if not isinstance(end, str):
        raise InvalidStructuralTag(f"tags[{index}].end must be one string")
    content = tag.get("content")
    kind = content.get("type") if isinstance(content, Mapping) else None
    if kind == "json_schema":
        spec: Any = JsonSchema(content.get("json_schema", True))
    elif kind == "regex" and isinstance(content.get("pattern"), str):
        spec = Regex(content["pattern"])
    elif kind == "const_string" and isinstance(content.get("value"), str):
        spec = Regex(escape_regex(content["value"]))
    elif kind == "any_text":
        if not end:
            raise InvalidStructuralTag(f"tags[{index}]: any_text needs a non-empty end")
        spec = Regex(r"[\s\S]*")
    else:
        raise InvalidStructuralTag(f"tags[{index}].content of type {kind!r} is not supported; use one of "
                                   f"{', '.join(_XGRAMMAR_CONTENTS)}")
    return Tag(tag["begin"], spec, end)
