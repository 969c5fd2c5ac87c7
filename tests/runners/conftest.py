"""Fixtures of the static runner's tests."""

import pytest

from tests.models.solo import tiny_llama


@pytest.fixture(scope="module")
def model():
    """A tiny random Llama (grouped key/value heads), one per test module."""
    return tiny_llama()
