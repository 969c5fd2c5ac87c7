"""Fixtures of the model tests."""

import pytest

from tests.models.solo import tiny_llama


@pytest.fixture(scope="module")
def model():
    """A tiny random Llama, one per test module (a runner may switch its attention implementation)."""
    return tiny_llama()
