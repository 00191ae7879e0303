"""The arithmetic of money: cost at a price, which price version applies, alert thresholds."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from billing.money import PriceBook, Usage, cost, rounded, thresholds_reached

T0 = datetime(2026, 12, 1, tzinfo=UTC)


@dataclass
class P:
    model: str
    input_per_million: Decimal
    output_per_million: Decimal
    unit_hour: Decimal
    effective_from: datetime


def price(model: str = "m", i: str = "0", o: str = "0", u: str = "0", at: datetime = T0) -> P:
    return P(model, Decimal(i), Decimal(o), Decimal(u), at)


def test_cost_is_tokens_times_prices_per_million_plus_unit_hours_times_their_price():
    usage = Usage(
        requests=3, prompt_tokens=1_500_000, completion_tokens=250_000, unit_seconds=5400.0
    )
    # 1.5 M x 0.50 + 0.25 M x 2.00 + 1.5 unit-hours x 0.10 = 0.75 + 0.50 + 0.15
    assert cost(usage, price(i="0.50", o="2.00", u="0.10")) == Decimal("1.40")


def test_cost_keeps_fractions_of_a_cent_exactly_and_rounds_half_up_to_a_millionth():
    one_request = Usage(1, 7, 3, 0.0)
    exact = cost(one_request, price(i="0.15", o="0.60"))
    assert exact == Decimal("0.00000285")  # 7 x 0.15e-6 + 3 x 0.6e-6
    assert rounded(exact) == Decimal("0.000003")


def test_no_price_costs_nothing_and_usage_adds_up():
    assert cost(Usage(1, 10, 10, 1.0), None) == 0
    assert Usage(1, 2, 3, 0.5) + Usage(2, 3, 4, 1.5) == Usage(3, 5, 7, 2.0)


def test_the_price_book_answers_the_version_in_effect_and_falls_back_to_any_model():
    book = PriceBook(
        [
            price("m", i="1", at=T0),
            price("m", i="2", at=T0 + timedelta(hours=5)),
            price("*", i="9", at=T0),
        ]
    )
    assert book.at("m", T0 - timedelta(hours=1)) is None  # before any version
    found = book.at("m", T0 + timedelta(hours=4))
    assert found is not None
    assert found.input_per_million == 1
    found = book.at("m", T0 + timedelta(hours=5))
    assert found is not None
    assert found.input_per_million == 2
    other = book.at("other", T0 + timedelta(hours=1))
    assert other is not None
    assert other.input_per_million == 9


def test_thresholds_are_reached_at_50_80_and_100_percent():
    amount = Decimal("10.00")
    assert thresholds_reached(Decimal("4.99"), amount) == []
    assert thresholds_reached(Decimal("5.00"), amount) == [50]
    assert thresholds_reached(Decimal("7.999999"), amount) == [50]
    assert thresholds_reached(Decimal("8"), amount) == [50, 80]
    assert thresholds_reached(Decimal("10"), amount) == [50, 80, 100]
    assert thresholds_reached(Decimal("25"), amount) == [50, 80, 100]
