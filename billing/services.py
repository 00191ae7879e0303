"""Writes about money: prices and budgets. Keyword-only, validated, transactional, and each
change an audit event."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import EmailValidator
from django.db import transaction

from audit.services import audit_record, snapshot
from billing.models import MoneyBudget, Price
from plumbing.errors import DomainError, NotFound
from tenants.models import ApiKey, BudgetPeriod, Tenant


def money(value: Any, *, param: str) -> Decimal:
    """A non-negative amount from a number or its text, or a DomainError naming `param`."""
    try:
        amount = Decimal(str(value))
    except (InvalidOperation, ValueError):
        raise DomainError(f"'{param}' must be a number, got {value!r}.", param=param) from None
    if not amount.is_finite() or amount < 0:
        raise DomainError(f"'{param}' must be zero or more, got {value}.", param=param)
    return amount


def whole_hour(moment: datetime | None) -> datetime:
    """The hour `moment` falls in (UTC): a price takes effect on a whole hour."""
    moment = (moment or datetime.now(tz=UTC)).astimezone(UTC)
    return moment.replace(minute=0, second=0, microsecond=0)


@transaction.atomic
def price_set(
    *,
    model: str,
    input_per_million: Any = 0,
    output_per_million: Any = 0,
    unit_hour: Any = 0,
    effective_from: datetime | None = None,
) -> Price:
    """A model's price from the start of the hour of `effective_from` (default: this hour,
    so usage from the top of the hour on is charged at it). Setting a price again for the
    same hour replaces that version; earlier versions stay, and so does the spend charged
    at them."""
    model = model.strip()
    if not model:
        raise DomainError("A price needs a model name (or * for any model).", param="model")
    start = whole_hour(effective_from)
    values = {
        "input_per_million": money(input_per_million, param="input_per_million"),
        "output_per_million": money(output_per_million, param="output_per_million"),
        "unit_hour": money(unit_hour, param="unit_hour"),
    }
    price = Price.objects.select_for_update().filter(model=model, effective_from=start).first()
    before = snapshot(price)
    if price is None:
        price = Price(model=model, effective_from=start, **values)
    else:
        for name, value in values.items():
            setattr(price, name, value)
    try:
        price.full_clean()
    except ValidationError as exc:
        raise DomainError("; ".join(exc.messages)) from None
    price.save()
    price.refresh_from_db()
    audit_record(
        action="price.set", instance=price, object_id=model, before=before, after=snapshot(price)
    )
    return price


@transaction.atomic
def price_delete(*, model: str) -> int:
    """Removes every version of a model's price: its usage, past and future, then costs
    what `*` says (or nothing). How many versions went."""
    versions = list(Price.objects.filter(model=model))
    if not versions:
        raise NotFound(f"No price for model '{model}'.")
    for price in versions:
        audit_record(action="price.delete", instance=price, object_id=model, before=snapshot(price))
    Price.objects.filter(model=model).delete()
    return len(versions)


BUDGET_FIELDS = frozenset({"amount", "period", "hard_stop", "alert_emails", "webhook_url"})


def _check_emails(emails: Any) -> list[str]:
    if not isinstance(emails, list) or not all(isinstance(e, str) for e in emails):
        raise DomainError("'alert_emails' must be a list of addresses.", param="alert_emails")
    validate = EmailValidator()
    for email in emails:
        try:
            validate(email)
        except ValidationError:
            raise DomainError(f"Not an email address: {email!r}.", param="alert_emails") from None
    return emails


@transaction.atomic
def budget_set(*, tenant: Tenant, api_key: ApiKey | None = None, **fields: Any) -> MoneyBudget:
    """Creates or changes the money budget of a tenant (or of one of its keys). A new budget
    needs `amount`; the other fields keep their values when not given."""
    unknown = set(fields) - BUDGET_FIELDS
    if unknown:
        raise DomainError(f"Unknown budget fields: {', '.join(sorted(unknown))}.")
    if api_key is not None and api_key.tenant_id != tenant.pk:
        raise NotFound(f"No key {api_key.pk} for tenant '{tenant.slug}'.")
    # api_key None: the tenant's own budget (Django reads `= None` as IS NULL).
    budget = MoneyBudget.objects.select_for_update().filter(tenant=tenant, api_key=api_key).first()
    before = snapshot(budget)
    if budget is None:
        if "amount" not in fields:
            raise DomainError("A new budget needs an amount.", param="amount")
        budget = MoneyBudget(tenant=tenant, api_key=api_key)
    if "amount" in fields:
        fields["amount"] = money(fields["amount"], param="amount")
        if fields["amount"] <= 0:
            raise DomainError("'amount' must be more than zero.", param="amount")
    if "period" in fields and fields["period"] not in BudgetPeriod.values:
        raise DomainError(
            f"'period' must be one of {', '.join(BudgetPeriod.values)}.", param="period"
        )
    if "alert_emails" in fields:
        fields["alert_emails"] = _check_emails(fields["alert_emails"])
    for name, value in fields.items():
        setattr(budget, name, value)
    try:
        budget.full_clean()
    except ValidationError as exc:
        raise DomainError("; ".join(exc.messages)) from None
    if before is not None and {"amount", "period", "hard_stop"} & set(fields):
        budget.exhausted_until = None  # the next budget check decides again
    budget.save()
    budget.refresh_from_db()  # the stored values (decimals at their places) for the log
    audit_record(
        action="budget.create" if before is None else "budget.update",
        instance=budget,
        before=before,
        after=snapshot(budget),
    )
    return budget


@transaction.atomic
def budget_delete(*, budget: MoneyBudget) -> None:
    audit_record(action="budget.delete", instance=budget, before=snapshot(budget))
    budget.delete()
