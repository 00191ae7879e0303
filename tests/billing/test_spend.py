"""Spend from the ledger: at the price in effect each hour, grouped, and per tenant only."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from billing.selectors import spend, spend_total
from billing.services import price_set
from plumbing.errors import DomainError
from tenants.models import Tenant
from tenants.services import IssuedKey
from tests.billing.ledger import charge

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
DAY = (T0 - timedelta(hours=10), T0 + timedelta(hours=14))


@pytest.fixture
def prices(db: None) -> None:
    price_set(
        model="llama",
        input_per_million="1",
        output_per_million="4",
        unit_hour="0.5",
        effective_from=T0 - timedelta(days=1),
    )
    price_set(model="*", input_per_million="10", effective_from=T0 - timedelta(days=1))


def test_spend_sums_tokens_and_unit_hours_at_their_prices(owner: Tenant, prices: None):
    charge(owner, T0, prompt=1_000_000, completion=500_000, unit_seconds=7200)
    charge(owner, T0 + timedelta(minutes=5), prompt=500_000, requests=2)
    total = spend_total(owner, *DAY)
    assert total.usage.requests == 3
    # 1.5 M input x 1 + 0.5 M output x 4 + 2 unit-hours x 0.5
    assert total.money == Decimal("4.5")
    assert total.as_dict()["money"] == "4.500000"
    assert total.as_dict()["unit_hours"] == "2.000000"


def test_a_price_change_leaves_earlier_hours_at_the_old_price(owner: Tenant, prices: None):
    charge(owner, T0 + timedelta(minutes=30), prompt=1_000_000)
    price_set(
        model="llama", input_per_million="3", effective_from=T0 + timedelta(hours=1, minutes=20)
    )
    charge(owner, T0 + timedelta(hours=1, minutes=10), prompt=1_000_000)  # the new hour's price
    assert spend_total(owner, *DAY).money == Decimal(1 + 3)


def test_spend_groups_by_day_model_key_and_end_user(
    owner: Tenant, owner_key: IssuedKey, prices: None
):
    key = owner_key.api_key
    charge(owner, T0, prompt=1_000_000, api_key=key, end_user="ann")
    charge(owner, T0 + timedelta(days=1), model="mistral", prompt=1_000_000, end_user="bob")
    since, until = T0 - timedelta(days=1), T0 + timedelta(days=2)
    by_day = {r.group: r.money for r in spend(owner, since, until, "day")}
    assert by_day == {"2026-12-01": Decimal(1), "2026-12-02": Decimal(10)}  # `*` prices mistral
    by_model = {r.group: r.usage.prompt_tokens for r in spend(owner, since, until, "model")}
    assert by_model == {"llama": 1_000_000, "mistral": 1_000_000}
    by_key = {r.group: r.money for r in spend(owner, since, until, "key")}
    assert by_key == {f"{key.pk}:owner": Decimal(1), "-": Decimal(10)}
    by_user = {r.group: r.money for r in spend(owner, since, until, "end_user")}
    assert by_user == {"ann": Decimal(1), "bob": Decimal(10)}
    only_key = spend_total(owner, since, until, api_key=key)
    assert only_key.money == Decimal(1)


def test_one_tenants_spend_never_holds_anothers_rows(owner: Tenant, outsider: Tenant, prices: None):
    charge(owner, T0, prompt=1_000_000)
    charge(outsider, T0, prompt=7_000_000)
    assert spend_total(owner, *DAY).usage.prompt_tokens == 1_000_000
    assert spend_total(outsider, *DAY).money == Decimal(7)


def test_an_unpriced_model_costs_nothing_and_an_empty_range_is_a_zero_row(owner: Tenant):
    charge(owner, T0, model="free", prompt=1000)
    total = spend_total(owner, *DAY)
    assert (total.usage.prompt_tokens, total.money) == (1000, 0)
    empty = spend(owner, T0 + timedelta(days=5), T0 + timedelta(days=6))
    assert [(r.group, r.usage.requests, r.money) for r in empty] == [(None, 0, 0)]


def test_prices_are_refused_when_negative_or_not_numbers(db: None):
    with pytest.raises(DomainError, match="zero or more"):
        price_set(model="llama", input_per_million="-1")
    with pytest.raises(DomainError, match="must be a number"):
        price_set(model="llama", output_per_million="lots")
