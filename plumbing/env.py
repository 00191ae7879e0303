"""Tiny typed readers for settings from environment variables.

Every setting has a default that runs a fresh checkout; production overrides them.
"""

import os

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from exc


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return float(raw)
    except ValueError as exc:
        raise ValueError(f"{name} must be a number, got {raw!r}") from exc


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{name} must be a boolean (1/0, true/false), got {raw!r}")


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_numbers(name: str, default: dict[str, float]) -> dict[str, float]:
    """`name=value` pairs, comma-separated (`interactive=300,standard=2000`); empty: none."""
    raw = os.environ.get(name)
    if raw is None:
        return dict(default)
    numbers: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        key, sep, value = item.partition("=")
        try:
            if not sep or not key.strip():
                raise ValueError
            numbers[key.strip()] = float(value)
        except ValueError:
            raise ValueError(
                f"{name} must be name=number pairs separated by commas, got {raw!r}"
            ) from None
    return numbers
