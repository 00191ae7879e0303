"""The arithmetic of money: what usage costs at a price, which version of a price applies
at a moment, and which alert thresholds a spend has reached. Pure: no database."""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Protocol

ANY_MODEL = "*"
MILLION = Decimal(1_000_000)
SECONDS_PER_HOUR = Decimal(3600)
# Reports show money to a millionth: a short request costs fractions of a cent.
PLACES = Decimal("0.000001")
THRESHOLDS = (50, 80, 100)


class PriceLike(Protocol):
    model: str
    input_per_million: Decimal
    output_per_million: Decimal
    unit_hour: Decimal
    effective_from: datetime


@dataclass(frozen=True)
class Usage:
    """What a group of ledger rows used: the spend's inputs."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    unit_seconds: float = 0.0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.requests + other.requests,
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.unit_seconds + other.unit_seconds,
        )

    @property
    def unit_hours(self) -> Decimal:
        # Through repr: the float's shortest spelling, not its binary expansion.
        return Decimal(repr(self.unit_seconds)) / SECONDS_PER_HOUR


def cost(usage: Usage, price: PriceLike | None) -> Decimal:
    """Input tokens x input price + output tokens x output price (both per million) +
    reserved unit-hours x the unit-hour price; unrounded. No price: nothing."""
    if price is None:
        return Decimal(0)
    tokens = (
        usage.prompt_tokens * price.input_per_million
        + usage.completion_tokens * price.output_per_million
    ) / MILLION
    return tokens + usage.unit_hours * price.unit_hour


def rounded(amount: Decimal) -> Decimal:
    return amount.quantize(PLACES, rounding=ROUND_HALF_UP)


class PriceBook:
    """Every version of the prices asked about, to answer which applies to a model at a
    moment: the latest of the model's own that took effect by then, else the latest of `*`'s,
    else none (the model costs nothing)."""

    def __init__(self, prices: Iterable[PriceLike]) -> None:
        self._versions: dict[str, list[PriceLike]] = {}
        for price in sorted(prices, key=lambda p: p.effective_from):
            self._versions.setdefault(price.model, []).append(price)
        self._starts = {
            model: [p.effective_from for p in versions]
            for model, versions in self._versions.items()
        }

    def at(self, model: str, moment: datetime) -> PriceLike | None:
        return self._own(model, moment) or self._own(ANY_MODEL, moment)

    def _own(self, model: str, moment: datetime) -> PriceLike | None:
        starts = self._starts.get(model)
        if not starts:
            return None
        index = bisect.bisect_right(starts, moment) - 1
        return self._versions[model][index] if index >= 0 else None


def thresholds_reached(spent: Decimal, amount: Decimal) -> list[int]:
    """The alert thresholds (percent of `amount`) that `spent` has reached."""
    if amount <= 0:
        return list(THRESHOLDS)
    return [t for t in THRESHOLDS if spent * 100 >= amount * t]
