"""JSON as the platform reads it from clients and passes it between its own processes.

A request's JSON is read and written about a dozen times on its way (the client's body, the
job's payload in the web and again in the worker, the body sent to the engine and its
answer, the `done` event, the ledger row, the reply): with the standard library, a fifth of
the worker's Python time and a seventh of the web's. orjson reads a chat answer in about a
third of the standard library's time and writes it in about three fifths
(docs/decisions/0008-the-request-path-spends-cpu-once.md).

The two disagree at the edges, and the platform must not change a request on the way:
- orjson writes NaN and Infinity as null, and reads integers beyond 64 bits as floats;
  `loads_request` refuses all three in what clients send (they are not JSON numbers any
  engine takes), so they never reach the payload.
- What orjson will not write (a lone surrogate, an integer beyond 64 bits, a key that is
  not a string) is written by the standard library instead, and what it will not read
  (NaN, a lone surrogate escaped) is read by it: whatever the standard library passes
  between the processes, this passes too.
"""

from __future__ import annotations

import json
import math
from typing import Any

import orjson

# The integers an engine's fields can hold (seed, token ids, logit_bias keys): signed and
# unsigned 64 bits, also what orjson writes and reads exactly.
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1


def dumps_bytes(value: Any) -> bytes:
    """`value` as compact JSON, UTF-8 encoded."""
    try:
        return orjson.dumps(value)
    except TypeError:  # see the module docstring
        return json.dumps(value, separators=(",", ":")).encode()


def dumps(value: Any) -> str:
    """`value` as compact JSON text."""
    return dumps_bytes(value).decode()


def loads(data: str | bytes) -> Any:
    """JSON the platform wrote, or an engine did."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:  # see the module docstring; invalid JSON still raises
        return json.loads(data)


def holds_lone_surrogate(value: Any) -> bool:
    """Whether a string in `value` holds a lone UTF-16 surrogate ("\\ud800" in JSON), which no
    UTF-8 text can hold."""
    try:
        orjson.dumps(value)  # refuses one, as UTF-8 must
        return False
    except TypeError:  # that, or something else orjson will not write: ask the slow way
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False


def loads_request(text: str) -> Any:
    """A client's JSON, refusing with ValueError (as for JSON that does not parse) the numbers
    the platform could not pass on unchanged: NaN, Infinity, a float that overflows, an
    integer beyond 64 bits."""
    return json.loads(
        text, parse_constant=_no_constant, parse_float=_finite_float, parse_int=_int_64_bits
    )


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"the number {text[:40]} is too large")
    return value


def _int_64_bits(text: str) -> int:
    if len(text) > 21:  # 2**64 has 20 digits: no need to convert a longer one to refuse it
        raise ValueError(f"the integer {text[:40]}... does not fit in 64 bits")
    value = int(text)
    if not _INT_MIN <= value <= _INT_MAX:
        raise ValueError(f"the integer {text} does not fit in 64 bits")
    return value
