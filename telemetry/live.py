"""Live values: Redis hashes the samplers write each tick and that expire when nobody refreshes
them, so a reader never shows a stale number as current."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

import redis
from django.conf import settings
from redis.typing import EncodableT, FieldT

PREFIX = "gs:telemetry:"

T = TypeVar("T")


def live_ttl_s() -> int:
    return int(3 * float(settings.GPUSHARE_TELEMETRY_INTERVAL_S) + 30)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def read_hash(client: redis.Redis, key: str) -> dict[str, str]:
    return {_text(k): _text(v) for k, v in client.hgetall(key).items()}


def as_float(value: bytes | str | None) -> float | None:
    if value is None or value in ("", b""):
        return None
    return float(value)


def live_mapping(values: Mapping[str, float | None]) -> dict[FieldT, EncodableT]:
    """Only the values we have: an absent field stays absent in Redis too."""
    return {name: repr(float(v)) for name, v in values.items() if v is not None}
