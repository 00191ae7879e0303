"""The platform's JSON (plumbing/wire.py): orjson where it agrees with the standard library,
the standard library where it does not, and a client's numbers that could not pass on
unchanged refused."""

from __future__ import annotations

import json
import math

import pytest

from plumbing import wire

BODY = {
    "model": "m",
    "messages": [{"role": "user", "content": "héllo \u2028 😀"}],
    "temperature": 0.7,
    "seed": 2**64 - 1,
    "logit_bias": {"50256": -100},
    "stop": None,
}


def test_what_it_writes_reads_back_the_same_and_is_what_the_standard_library_reads():
    text = wire.dumps(BODY)
    assert wire.loads(text) == BODY
    assert json.loads(text) == BODY
    assert wire.dumps_bytes(BODY) == text.encode()
    assert wire.loads(text.encode()) == BODY


@pytest.mark.parametrize(
    "value",
    [{"seed": 2**70}, {"content": "\ud800 half a pair"}, {1: "a key that is not a string"}],
    ids=["integer beyond 64 bits", "lone surrogate", "int key"],
)
def test_what_orjson_will_not_write_is_written_by_the_standard_library(value):
    text = wire.dumps(value)
    assert text == json.dumps(value, separators=(",", ":"))
    assert wire.dumps_bytes(value) == text.encode()
    assert wire.loads(text) == json.loads(text)  # read back whole: no float, no error


def test_what_orjson_will_not_read_is_read_by_the_standard_library():
    assert math.isnan(wire.loads('{"x": NaN}')["x"])
    assert wire.loads('"\\ud800"') == "\ud800"
    with pytest.raises(ValueError, match="Expecting"):  # invalid JSON still raises
        wire.loads("{not json")


@pytest.mark.parametrize(
    "text",
    ['{"t": NaN}', '{"t": Infinity}', '{"t": -Infinity}', '{"t": 1e999}', '{"t": -1e400}',
     f'{{"seed": {2**64}}}', f'{{"seed": {-(2**63) - 1}}}', '{"seed": 1' + "0" * 400 + "}"],
)  # fmt: skip
def test_a_clients_number_that_could_not_pass_on_unchanged_is_refused(text):
    with pytest.raises(ValueError, match=r"not a JSON number|too large|64 bits"):
        wire.loads_request(text)


def test_a_clients_ordinary_json_reads_as_the_standard_library_reads_it():
    text = json.dumps({**BODY, "low": -(2**63), "f": 1e308, "tiny": 5e-324, "dup": 1})
    assert wire.loads_request(text) == json.loads(text)
    assert wire.loads_request('{"a": 1, "a": 2}') == {"a": 2}


@pytest.mark.parametrize(
    ("value", "holds"),
    [({"c": "fine ☃"}, False), ({"c": ["x", {"d": "\udc00"}]}, True),
     ({"seed": 2**70, "c": "fine"}, False), ({"seed": 2**70, "c": "\ud800"}, True)],
)  # fmt: skip
def test_a_lone_surrogate_is_found_wherever_it_is(value, holds):
    assert wire.holds_lone_surrogate(value) is holds
