"""``GenerationParams``: one frozen, validated description of how a request decodes, shared by the
library, the server's protocol layer, bulk jobs and the CLI."""

import argparse
import dataclasses
import math

import pytest

from cdsl_struct.errors import InvalidArgument
from cdsl_struct.options import Method
from cdsl_struct.params import GenerationParams, add_param_arguments, params_from_args


def test_defaults_and_normalisation():
    params = GenerationParams(method="cdsl", stop="END")
    assert params.method is Method.CDSL and params.stop == ("END",)
    assert GenerationParams(stop=["a", "b"]).stop == ("a", "b")
    assert GenerationParams().max_tokens == 256 and not GenerationParams().penalised
    assert GenerationParams(frequency_penalty=0.5).penalised


def test_frozen():
    params = GenerationParams()
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.max_tokens = 3  # type: ignore[misc]


@pytest.mark.parametrize(("changes", "param"), [
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": True}, "max_tokens"),
    ({"max_tokens": 2.0}, "max_tokens"),
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": math.nan}, "temperature"),
    ({"temperature": math.inf}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"seed": 1.5}, "seed"),
    ({"seed": False}, "seed"),
    ({"stop": ["a", ""]}, "stop"),
    ({"stop": ["a"] * 5}, "stop"),
    ({"stop": 3}, "stop"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"logprobs": 21}, "logprobs"),
    ({"logprobs": -1}, "logprobs"),
    ({"method": "beam"}, "method"),
])
def test_every_bad_value_names_its_field(changes, param):
    with pytest.raises(InvalidArgument) as caught:
        GenerationParams(**changes)
    assert caught.value.param == param
    with pytest.raises(InvalidArgument):  # a change to valid params is checked the same way
        GenerationParams.of(GenerationParams(), **changes)


def test_of_applies_changes_and_refuses_unknown_names():
    base = GenerationParams(max_tokens=10, seed=1)
    changed = GenerationParams.of(base, temperature=0.5)
    assert (changed.max_tokens, changed.seed, changed.temperature) == (10, 1, 0.5)
    assert base.temperature == 0.0 and GenerationParams.of(base) is base
    with pytest.raises(InvalidArgument, match="unknown generation parameter 'max_token'") as caught:
        GenerationParams.of(base, max_token=5)
    assert caught.value.param == "max_token"
    with pytest.raises(InvalidArgument, match="GenerationParams"):
        GenerationParams.of({"max_tokens": 3})  # type: ignore[arg-type]


def test_round_trips_through_plain_data():
    params = GenerationParams(method="cdlh", max_tokens=7, stop=("x",), logprobs=2, seed=2**70)
    data = params.to_dict()
    assert data["method"] == "cdlh" and data["stop"] == ["x"]
    assert GenerationParams.from_dict(data) == params


def test_command_line_options_build_the_same_params():
    parser = argparse.ArgumentParser()
    add_param_arguments(parser)
    assert params_from_args(parser.parse_args([])) == GenerationParams()
    args = parser.parse_args(["--method", "target", "--max-tokens", "9", "--temperature", "0.3", "--seed", "4",
                              "--stop", "a", "--stop", "b", "--presence-penalty", "0.5"])
    assert params_from_args(args) == GenerationParams(method="target", max_tokens=9, temperature=0.3, seed=4,
                                                      stop=("a", "b"), presence_penalty=0.5)
    with pytest.raises(InvalidArgument):
        params_from_args(parser.parse_args(["--top-p", "0"]))
