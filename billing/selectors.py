"""Reading money: prices, budgets, and spend computed from the usage ledger.

Spend is read through the tenant always (`spend(tenant, ...)`): one tenant's rows never
reach another's report. The ledger is summed in the database per hour and model (and per
the grouping asked for); each hour's sums are priced in Python at the version of the price
in effect at the start of that hour, since prices change on whole hours
(`billing.services.price_set`).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Literal

from django.conf import settings
from django.db.models import Q, QuerySet, Sum
from django.db.models.functions import TruncHour

from billing.models import BudgetAlert, MoneyBudget, Price
from billing.money import ANY_MODEL, PriceBook, Usage, cost, rounded
from plumbing.errors import NotFound
from tenants.models import ApiKey, Tenant, UsageRecord

GroupBy = Literal["day", "model", "key", "end_user"]
GROUPINGS: tuple[GroupBy, ...] = ("day", "model", "key", "end_user")
_GROUP_FIELD = {"model": "model", "key": "api_key_id", "end_user": "end_user"}


@dataclass(frozen=True)
class SpendRow:
    """Spend of one group (a day, a model, a key, an end user; `group` None: the total)."""

    group: str | None
    usage: Usage
    money: Decimal
    currency: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "requests": self.usage.requests,
            "prompt_tokens": self.usage.prompt_tokens,
            "completion_tokens": self.usage.completion_tokens,
            "total_tokens": self.usage.prompt_tokens + self.usage.completion_tokens,
            "unit_hours": str(rounded(self.usage.unit_hours)),
            "money": str(rounded(self.money)),
            "currency": self.currency,
        }


def currency() -> str:
    return str(settings.GPUSHARE_CURRENCY)


# --- prices -------------------------------------------------------------------------------


def price_list(*, at: datetime | None = None) -> list[Price]:
    """The price of each model in effect at `at` (default now), by model name."""
    at = at or datetime.now(tz=UTC)
    current: dict[str, Price] = {}
    for price in Price.objects.filter(effective_from__lte=at).order_by("model", "-effective_from"):
        current.setdefault(price.model, price)
    return list(current.values())


def price_history(*, model: str) -> QuerySet[Price]:
    return Price.objects.filter(model=model).order_by("-effective_from")


def price_get(*, model: str) -> Price:
    """The model's price in effect now (not `*`'s), or NotFound."""
    price = (
        Price.objects.filter(model=model, effective_from__lte=datetime.now(tz=UTC))
        .order_by("-effective_from")
        .first()
    )
    if price is None:
        raise NotFound(f"No price for model '{model}'.")
    return price


def price_book(models: Iterable[str]) -> PriceBook:
    return PriceBook(Price.objects.filter(model__in={*models, ANY_MODEL}))


# --- spend --------------------------------------------------------------------------------


def _ledger(
    tenant: Tenant, since: datetime, until: datetime, api_key: ApiKey | None
) -> QuerySet[UsageRecord]:
    rows = UsageRecord.objects.filter(tenant=tenant, finished_at__gte=since, finished_at__lt=until)
    if api_key is not None:
        rows = rows.filter(api_key=api_key)
    return rows


def _key_names(tenant: Tenant) -> dict[int, str]:
    return {k.pk: f"{k.pk}:{k.name}" for k in ApiKey.objects.filter(tenant=tenant)}


def spend(
    tenant: Tenant,
    since: datetime,
    until: datetime,
    group_by: GroupBy | None = None,
    *,
    api_key: ApiKey | None = None,
) -> list[SpendRow]:
    """The tenant's spend over [since, until) (of one of its keys, with `api_key`): one row
    per group, in the group's order, or one row (group None) without `group_by`. A group is
    a day (`2026-12-07`), a model, a key (`<id>:<name>`, `-` for rows of no key) or an end
    user (`''`: requests that named none)."""
    field = _GROUP_FIELD.get(group_by or "")
    names = ["model", "hour", *([field] if field else [])]
    sums = (
        _ledger(tenant, since, until, api_key)
        .annotate(hour=TruncHour("finished_at", tzinfo=UTC))
        .values(*names)
        .annotate(
            n=Sum("requests"),
            prompt=Sum("prompt_tokens"),
            completion=Sum("completion_tokens"),
            unit_seconds=Sum("reserved_unit_seconds"),
        )
        .order_by()
    )
    rows = list(sums)
    book = price_book({row["model"] for row in rows})
    keys = _key_names(tenant) if group_by == "key" else {}
    groups: dict[str | None, tuple[Usage, Decimal]] = {}
    for row in rows:
        usage = Usage(
            row["n"] or 0, row["prompt"] or 0, row["completion"] or 0, row["unit_seconds"] or 0.0
        )
        money = cost(usage, book.at(row["model"], row["hour"]))
        group = _group_of(group_by, row, field, keys)
        used, spent = groups.get(group, (Usage(), Decimal(0)))
        groups[group] = (used + usage, spent + money)
    if group_by is None and not groups:
        groups[None] = (Usage(), Decimal(0))
    unit = currency()
    return [SpendRow(g, u, m, unit) for g, (u, m) in sorted(groups.items(), key=_order)]


def _group_of(
    group_by: GroupBy | None, row: dict[str, Any], field: str | None, keys: dict[int, str]
) -> str | None:
    if group_by is None:
        return None
    if group_by == "day":
        return f"{row['hour'].astimezone(UTC):%Y-%m-%d}"
    value = row[field or ""]
    if group_by == "key":
        return keys.get(value, str(value)) if value is not None else "-"
    return str(value)


def _order(item: tuple[str | None, Any]) -> str:
    return item[0] or ""


def spend_total(
    tenant: Tenant, since: datetime, until: datetime, *, api_key: ApiKey | None = None
) -> SpendRow:
    return spend(tenant, since, until, api_key=api_key)[0]


def spend_csv(rows: Iterable[SpendRow], *, group_by: str | None) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    columns = (
        "requests",
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
        "unit_hours",
        "money",
        "currency",
    )
    writer.writerow((group_by or "group", *columns))
    for row in rows:
        values = row.as_dict()
        writer.writerow((values["group"] or "total", *(values[c] for c in columns)))
    return out.getvalue()


# --- budgets ------------------------------------------------------------------------------


def budget_list(*, tenant: Tenant | None = None) -> QuerySet[MoneyBudget]:
    budgets = MoneyBudget.objects.select_related("tenant", "api_key")
    return budgets.filter(tenant=tenant) if tenant is not None else budgets


def budget_get(*, tenant: Tenant, api_key: ApiKey | None = None) -> MoneyBudget:
    budget = MoneyBudget.objects.filter(
        Q(api_key=api_key) if api_key is not None else Q(api_key__isnull=True), tenant=tenant
    ).first()
    if budget is None:
        scope = f"key {api_key.pk} of " if api_key is not None else ""
        raise NotFound(f"No money budget for {scope}tenant '{tenant.slug}'.")
    return budget


def budget_alerts(*, budget: MoneyBudget) -> QuerySet[BudgetAlert]:
    return budget.alerts.all()
