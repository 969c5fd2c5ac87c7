"""Tasks with known answers for ``python -m benchmarks quality``, built reproducibly from MaskBench cases.

Each usable case (a flat or lightly nested valid instance with a few short scalar values, a
schema of modest size) becomes a passage that states every value of the instance, one sentence
per field in a shuffled order, and up to three tasks on that passage:

- ``extract``: the schema's JSON, scored by exact match per field (leaf);
- ``choice``: one boolean or enum field, answered with one of its options;
- ``regex``: one integer or date field, answered with the value alone (and an optional period).

Cases go to the ``tune`` or ``report`` half by a hash of their id (``split_of``); everything
random is seeded by the case id, so the same data always gives the same tasks.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdsl_struct.bench.maskbench import read_jsonl

SOURCES = ("Glaiveai2K", "Github_trivial", "Github_easy", "Kubernetes", "Snowplow", "JME", "WashingtonPost",
           "MCPspec", "Github_medium")
"""MaskBench files the tasks come from (their flat and lightly nested schemas)."""
MAX_SCHEMA_CHARS = 800
PROSE_KEYWORDS = frozenset({"description", "title", "$schema", "$id", "examples", "$comment"})
MAX_VALUE_CHARS = 40
MIN_FIELDS, MAX_FIELDS = 2, 6
INTEGER = r"-?[0-9]{1,15}\.?"
DATE = r"[0-9]{4}-[0-9]{2}-[0-9]{2}\.?"
"""Regex answers may end with a period: forbidding the model's natural ending makes it pad the
number instead (``10`` for ``1``, ``100000000000000`` for ``5``); the period is not scored."""
TEMPLATES = ("The {key} is {value}.", "Its {key} is {value}.", "The value of {key} is {value}.")

EXTRACT_PROMPT = ("Text: {text}\nWrite the values the text states as one JSON object with these keys: {keys}.\n"
                  "Answer with the JSON object only.")
CHOICE_PROMPT = "Text: {text}\nQuestion: what is the {key}? Choose one of: {options}.\nAnswer with the option only."
REGEX_PROMPT = "Text: {text}\nQuestion: what is the {key}? Answer with the {kind} only."

Path_ = tuple[str, ...]


@dataclass
class Task:
    """One prompt with a known answer. ``fields`` maps a leaf path to its value (extract), or
    holds one entry (choice, regex); ``constraint`` is the schema, the options or the regex."""

    id: str
    kind: str
    prompt: str
    constraint: Any
    fields: dict[Path_, Any] = field(default_factory=dict)
    source: str = ""


def split_of(case_id: str) -> str:
    """``"tune"`` or ``"report"``: the half a case belongs to, from a hash of its id."""
    return "tune" if hashlib.sha256(case_id.encode()).digest()[0] % 2 == 0 else "report"


def leaves(value: dict[str, Any], prefix: Path_ = ()) -> dict[Path_, Any]:
    """Every scalar of a (nested) object, by its key path."""
    found: dict[Path_, Any] = {}
    for key, item in value.items():
        if isinstance(item, dict):
            found.update(leaves(item, (*prefix, key)))
        else:
            found[(*prefix, key)] = item
    return found


def _usable_instance(data: Any) -> bool:
    if not isinstance(data, dict) or not data:
        return False
    for item in data.values():
        if isinstance(item, dict):
            if not item or any(not _usable_scalar(v) for v in item.values()):
                return False
        elif not _usable_scalar(item):
            return False
    return MIN_FIELDS <= len(leaves(data)) <= MAX_FIELDS


def _usable_scalar(value: Any) -> bool:
    if isinstance(value, str):
        return 0 < len(value) <= MAX_VALUE_CHARS and value.strip() == value and "\n" not in value
    return isinstance(value, (bool, int)) or (isinstance(value, float) and abs(value) < 1e9)


def render_value(value: Any) -> str:
    """How a value reads in prose: strings as they are, the rest as JSON."""
    return value if isinstance(value, str) else json.dumps(value)


def key_phrase(path: Path_) -> str:
    """``("level", "comparison")`` -> ``"comparison of the level"``."""
    return path[-1] if len(path) == 1 else f"{path[-1]} of the {' '.join(path[:-1])}"


def passage(values: dict[Path_, Any], rng: random.Random) -> str:
    """One sentence per field, in a shuffled order."""
    sentences = [rng.choice(TEMPLATES).format(key=key_phrase(path), value=render_value(value))
                 for path, value in values.items()]
    rng.shuffle(sentences)
    return " ".join(sentences)


def _subschema(schema: dict[str, Any], path: Path_) -> dict[str, Any] | None:
    node: Any = schema
    for key in path:
        props = node.get("properties") if isinstance(node, dict) else None
        if not isinstance(props, dict) or not isinstance(props.get(key), dict):
            return None
        node = props[key]
    return node


def _choice_options(schema: dict[str, Any], path: Path_, value: Any) -> list[str] | None:
    if isinstance(value, bool):
        return ["true", "false"]
    sub = _subschema(schema, path)
    enum = sub.get("enum") if sub else None
    if (isinstance(value, str) and isinstance(enum, list) and 2 <= len(enum) <= 8
            and all(isinstance(e, str) and e for e in enum) and value in enum):
        return list(dict.fromkeys(enum))
    return None


def schema_for_prompt(schema: Any) -> Any:
    """The schema as shown in a prompt: keywords that only annotate (descriptions, titles) left
    out to keep prompts short; the constraint itself is always the whole schema."""
    if isinstance(schema, dict):
        return {k: schema_for_prompt(v) for k, v in schema.items()
                if not (k in PROSE_KEYWORDS and isinstance(v, (str, list)))}
    if isinstance(schema, list):
        return [schema_for_prompt(v) for v in schema]
    return schema


def describe_keys(schema: dict[str, Any], data: dict[str, Any], prefix: Path_ = ()) -> str:
    """The instance's keys with their schema types, e.g. ``name (string), size (object: w (number))``.

    Prompts name the keys rather than show the whole schema: shown a JSON Schema, the embedded
    135M model copies the schema instead of filling it in, free or constrained."""
    parts = []
    for key, value in data.items():
        sub = _subschema(schema, (*prefix, key)) or {}
        kind = sub.get("type")
        kind = next((k for k in kind if k != "null"), None) if isinstance(kind, list) else kind
        if isinstance(value, dict):
            parts.append(f"{key} (object: {describe_keys(schema, value, (*prefix, key))})")
        else:
            parts.append(f"{key} ({kind})" if isinstance(kind, str) else key)
    return ", ".join(parts)


def tasks_for_case(case: dict[str, Any], kinds: tuple[str, ...]) -> list[Task]:
    """The tasks one MaskBench case gives (none when it has no usable instance)."""
    schema_text = json.dumps(schema_for_prompt(case["schema"]), ensure_ascii=False)
    if len(schema_text) > MAX_SCHEMA_CHARS:
        return []
    data = next((t["data"] for t in case["tests"] if t.get("valid") and _usable_instance(t["data"])), None)
    if data is None:
        return []
    rng = random.Random(case["id"])
    values = leaves(data)
    text = passage(values, rng)
    source = case["id"].split("---")[0].split("_")[0]
    tasks: list[Task] = []
    if "extract" in kinds:
        prompt = EXTRACT_PROMPT.format(text=text, keys=describe_keys(case["schema"], data))
        tasks.append(Task(f"{case['id']}#extract", "extract", prompt,
                          case["schema"], dict(values), source))
    paths = list(values)
    rng.shuffle(paths)
    if "choice" in kinds:
        for path in paths:
            options = _choice_options(case["schema"], path, values[path])
            if options:
                answer = render_value(values[path])
                prompt = CHOICE_PROMPT.format(text=text, key=key_phrase(path), options=", ".join(options))
                tasks.append(Task(f"{case['id']}#choice", "choice", prompt, options, {path: answer}, source))
                break
    if "regex" in kinds:
        for path in paths:
            value = values[path]
            if isinstance(value, int) and not isinstance(value, bool):
                pattern, what = INTEGER, "number"
            elif isinstance(value, str) and re.fullmatch(DATE, value):
                pattern, what = DATE, "date"
            else:
                continue
            prompt = REGEX_PROMPT.format(text=text, key=key_phrase(path), kind=what)
            tasks.append(Task(f"{case['id']}#regex", "regex", prompt, pattern, {path: str(value)}, source))
            break
    return tasks


def build_tasks(data_dir: str | Path, split: str, limit_cases: int,
                kinds: tuple[str, ...] = ("extract", "choice", "regex")) -> list[Task]:
    """Tasks of the first ``limit_cases`` usable cases of ``split`` (ordered by a hash of the id)."""
    if split not in ("tune", "report"):
        raise ValueError(f"split must be 'tune' or 'report', got {split!r}")
    cases = []
    for name in SOURCES:
        path = Path(data_dir) / f"{name}.jsonl.gz"
        if path.exists():
            cases.extend(c for c in read_jsonl(path) if split_of(c["id"]) == split)
    if not cases:
        raise FileNotFoundError(f"no MaskBench cases of {', '.join(SOURCES)} under {data_dir}")
    cases.sort(key=lambda c: hashlib.sha256(f"order:{c['id']}".encode()).hexdigest())
    tasks: list[Task] = []
    used = 0
    for case in cases:
        found = tasks_for_case(case, kinds)
        if found:
            tasks.extend(found)
            used += 1
            if used >= limit_cases:
                break
    return tasks
