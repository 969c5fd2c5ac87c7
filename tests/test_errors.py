"""One error tree: every exception the package defines for its users lives in ``errors.py``, is a
``CdslError`` and is exported by ``cdsl_struct``; the ones that were ``ValueError``s stay so."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import cdsl_struct
from cdsl_struct import errors

ROOT = Path(cdsl_struct.__file__).parent

#: exceptions that never reach a library user: control flow inside one module, and the server's
#: HTTP answer (``APIError``: what a route raises to send a 4xx/5xx body)
INTERNAL = {"EngineRejected", "WorkerCrashed", "_Expired", "Cancelled", "APIError", "_Incomplete"}


def _exception_classes(tree: ast.Module) -> list[str]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            bases = {base.id if isinstance(base, ast.Name) else getattr(base, "attr", "") for base in node.bases}
            if any(base.endswith(("Error", "Exception")) or base in {"CdslError", "InvalidToken", "CompileError",
                                                                       "RequestCancelled"} for base in bases):
                names.append(node.name)
    return names


def test_every_user_facing_exception_is_defined_in_errors_py():
    strays = {}
    for path in ROOT.rglob("*.py"):
        if path.name == "errors.py" and path.parent == ROOT:
            continue
        found = [n for n in _exception_classes(ast.parse(path.read_text(encoding="utf-8"))) if n not in INTERNAL]
        if found:
            strays[str(path.relative_to(ROOT))] = found
    assert strays == {}


def test_each_is_a_cdsl_error_and_exported():
    defined = [obj for _, obj in inspect.getmembers(errors, inspect.isclass)
               if issubclass(obj, BaseException) and obj.__module__ == errors.__name__]
    assert len(defined) >= 20
    for error in defined:
        assert issubclass(error, cdsl_struct.CdslError), error
        assert getattr(cdsl_struct, error.__name__) is error and error.__name__ in cdsl_struct.__all__, error
    for was_a_value_error in ("InvalidArgument", "ConflictingConstraints", "InvalidToolCall", "PromptTooLong",
                              "InputError"):
        assert issubclass(getattr(cdsl_struct, was_a_value_error), ValueError)
