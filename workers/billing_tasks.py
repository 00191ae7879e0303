"""The budget check's task (what it does is `billing.alerts`'): run by each worker's ticker
every GPUSHARE_BUDGET_CHECK_INTERVAL_S, and startable by name for an operator who wants a
check now."""

from __future__ import annotations

from celery import shared_task

from billing.alerts import budgets_check as check_budgets


@shared_task(name="workers.budgets_check")
def budgets_check() -> int:
    """Alerts the budgets that reached a threshold; how many did."""
    return len(check_budgets())
