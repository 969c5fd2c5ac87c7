"""``cdsl-struct serve``'s process setup: the malloc arena cap and the ways to leave it off."""

import sys

import pytest

from cdsl_struct.server.cli import MALLOC_ARENAS_ENV, bound_malloc_arenas

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")


@linux_only
def test_arenas_are_capped_by_default_and_by_the_variable(monkeypatch):
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    monkeypatch.delenv(MALLOC_ARENAS_ENV, raising=False)
    assert bound_malloc_arenas() == 2
    monkeypatch.setenv(MALLOC_ARENAS_ENV, "4")
    assert bound_malloc_arenas() == 4


@pytest.mark.parametrize(("name", "value"), [(MALLOC_ARENAS_ENV, "0"), ("MALLOC_ARENA_MAX", "8")])
def test_no_cap_when_switched_off_or_set_by_glibcs_own_variable(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    assert bound_malloc_arenas() is None
