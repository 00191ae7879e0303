"""Hard stops at admission: a tenant (or key) whose money budget has `hard_stop` and whose
spend reached the amount this period is refused, like a used-up token budget (429
`insufficient_quota`), until the period ends.

The budget check (`billing.alerts`) decides, every GPUSHARE_BUDGET_CHECK_INTERVAL_S, from
the ledger, and marks the budget `exhausted_until` the period's end; admission only reads
those marks, from a per-process cache versioned by billing's change mark, so a request
costs no database read and, while no budget changed, no Redis read beyond the cache's
version check. A budget is therefore enforced within the check's interval plus
GPUSHARE_AUTH_CACHE_S of being reached: spend may pass the amount by what a tenant uses in
that time.
"""

from __future__ import annotations

from datetime import UTC, datetime

from django.conf import settings

from plumbing.change_marks import ChangeMark, cache_by_marks
from plumbing.ttlcache import TtlCache
from tenants.limits import BudgetExhausted

# (kind, id) -> until when it is stopped; kind "tenant" or "key".
Stops = dict[tuple[str, int], datetime]


class MoneyBudgetExhausted(BudgetExhausted):
    """A spending budget with a hard stop is used up (429 insufficient_quota)."""


def billing_changes() -> ChangeMark:
    """Counts saves of money budgets (billing/signals.py): the version of the stops' cache."""
    return ChangeMark("billing", recheck_s=settings.GPUSHARE_CHANGE_RECHECK_S)


_stops: TtlCache[Stops] = cache_by_marks(settings.GPUSHARE_AUTH_CACHE_S, billing_changes)


def _load() -> Stops:
    from billing.models import MoneyBudget

    stops: Stops = {}
    now = datetime.now(tz=UTC)
    marked = MoneyBudget.objects.filter(hard_stop=True, exhausted_until__gt=now)
    rows = marked.values_list("tenant_id", "api_key_id", "exhausted_until")
    for tenant_id, key_id, until in rows:
        if until is not None:
            stops[("key", key_id) if key_id else ("tenant", tenant_id)] = until
    return stops


def money_admit(*, tenant_id: int, api_key_id: int | None) -> None:
    """Raises MoneyBudgetExhausted when the tenant or the key is stopped now. From the
    cache: on an event loop it raises SynchronousOnlyOperation when the cache must be read
    again, and the caller asks again in a thread (`plumbing.ttlcache`)."""
    stops = _stops.get_or_compute("stops", _load)
    if not stops:
        return
    now = datetime.now(tz=UTC)
    for scope, ident in (("tenant", tenant_id), ("key", api_key_id)):
        until = stops.get((scope, ident or 0))
        if until is not None and until > now:
            whose = "the tenant's" if scope == "tenant" else "this API key's"
            raise MoneyBudgetExhausted(
                f"Spending budget of {whose} is used up until {until:%Y-%m-%d %H:%M} UTC; "
                "ask the platform's operators to raise it."
            )


def clear_cache() -> None:
    _stops.clear()
