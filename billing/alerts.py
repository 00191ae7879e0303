"""The budget check: each money budget's spend this period against its amount, alerts at
50, 80 and 100 % (each once per period), and the hard stops' marks.

A periodic job of each worker's ticker (`workers/periodic.py`, every
GPUSHARE_BUDGET_CHECK_INTERVAL_S), also the Celery task `workers.budgets_check`. An alert is
a `BudgetAlert` row first: its unique constraint (budget, period, threshold) lets one check
in the whole platform send it, whichever worker ran it, and never twice in a period. Then it
is sent: an email through Django's mail to the budget's addresses, and a JSON POST to its
webhook (docs/PRICES.md has the payload). A send that fails is logged and kept on the row
(`webhook_status`); it is not retried.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import httpx
from django.conf import settings
from django.core.mail import send_mail
from django.db import IntegrityError, transaction

from billing.models import BudgetAlert, MoneyBudget
from billing.money import rounded, thresholds_reached
from billing.selectors import currency, spend_total
from tenants.reports import period_next, period_start

log = logging.getLogger(__name__)
SIGNATURE_HEADER = "X-Gpushare-Signature"


@dataclass(frozen=True)
class Crossing:
    """Thresholds a budget reached for the first time this period."""

    budget: MoneyBudget
    thresholds: list[int]
    spent: Decimal
    period_start: datetime
    period_end: datetime


def budgets_check(now: datetime | None = None) -> list[Crossing]:
    """Checks every budget once: the alerts it must send, sent; the stops, marked."""
    now = now or datetime.now(tz=UTC)
    crossings = []
    for budget in MoneyBudget.objects.select_related("tenant", "api_key"):
        crossing = budget_check(budget, now)
        if crossing is not None:
            crossings.append(crossing)
            alert_send(crossing)
    return crossings


def budget_check(budget: MoneyBudget, now: datetime) -> Crossing | None:
    """One budget's thresholds newly reached this period (None: none), recorded; its hard
    stop's mark, set or cleared."""
    start = period_start(budget.period, now)  # type: ignore[arg-type]
    end = period_next(budget.period, start)  # type: ignore[arg-type]
    spent = spend_total(budget.tenant, start, end, api_key=budget.api_key).money
    exhausted = end if budget.hard_stop and spent >= budget.amount else None
    if budget.exhausted_until != exhausted:
        budget.exhausted_until = exhausted
        budget.save(update_fields=["exhausted_until"])  # moves the stops' change mark
    new = [t for t in thresholds_reached(spent, budget.amount) if _first(budget, start, t, spent)]
    return Crossing(budget, new, spent, start, end) if new else None


def _first(budget: MoneyBudget, start: datetime, threshold: int, spent: Decimal) -> bool:
    """Records the threshold's alert; False when one was recorded already this period."""
    if BudgetAlert.objects.filter(budget=budget, period_start=start, threshold=threshold).exists():
        return False
    try:
        with transaction.atomic():
            BudgetAlert.objects.create(
                budget=budget, period_start=start, threshold=threshold, spend=rounded(spent)
            )
    except IntegrityError:  # another worker's check recorded it first
        return False
    return True


def alert_payload(crossing: Crossing) -> dict[str, Any]:
    budget = crossing.budget
    return {
        "event": "budget.threshold_reached",
        "tenant": budget.tenant.slug,
        "api_key": (
            {"id": budget.api_key.pk, "name": budget.api_key.name, "prefix": budget.api_key.prefix}
            if budget.api_key is not None
            else None
        ),
        "threshold_percent": max(crossing.thresholds),
        "thresholds_percent": crossing.thresholds,
        "spend": str(rounded(crossing.spent)),
        "amount": str(budget.amount),
        "currency": currency(),
        "period": budget.period,
        "period_start": crossing.period_start.isoformat(),
        "period_end": crossing.period_end.isoformat(),
        "hard_stop": budget.hard_stop,
        "stopped": budget.exhausted_until is not None,
    }


def alert_send(crossing: Crossing) -> None:
    """The alert by email and webhook, each as the budget has them; what happened is kept on
    the alerts' rows."""
    budget, payload = crossing.budget, alert_payload(crossing)
    alerts = BudgetAlert.objects.filter(
        budget=budget, period_start=crossing.period_start, threshold__in=crossing.thresholds
    )
    if budget.alert_emails:
        try:
            send_mail(
                _subject(payload),
                _email_text(payload),
                None,  # DEFAULT_FROM_EMAIL
                budget.alert_emails,
            )
            alerts.update(emailed=True)
        except Exception:  # SMTP away: logged, not retried
            log.exception("budget alert email for %s failed", budget)
    if budget.webhook_url:
        alerts.update(webhook_status=webhook_post(budget.webhook_url, payload)[:200])


def _subject(payload: dict[str, Any]) -> str:
    scope = payload["tenant"] + (f" key {payload['api_key']['name']}" if payload["api_key"] else "")
    return (
        f"[gpushare] {scope}: {payload['threshold_percent']}% of the budget per "
        f"{payload['period']} spent"
    )


def _email_text(payload: dict[str, Any]) -> str:
    lines = [
        f"Spend of {payload['spend']} {payload['currency']} has reached "
        f"{payload['threshold_percent']}% of the budget of {payload['amount']} "
        f"{payload['currency']} for the {payload['period']} from {payload['period_start']}.",
    ]
    if payload["stopped"]:
        lines.append(f"Requests are refused until {payload['period_end']} (hard stop).")
    elif payload["hard_stop"]:
        lines.append("At 100% requests will be refused until the period ends (hard stop).")
    return "\n\n".join(lines) + "\n"


def webhook_post(url: str, payload: dict[str, Any]) -> str:
    """POSTs the payload as JSON, signed with GPUSHARE_BUDGET_WEBHOOK_SECRET when set
    (`X-Gpushare-Signature: sha256=<HMAC of the body>`); the answer's status, or the error."""
    body = json.dumps(payload, sort_keys=True).encode()
    headers = {"Content-Type": "application/json", "User-Agent": "gpushare-budget-alerts"}
    secret = settings.GPUSHARE_BUDGET_WEBHOOK_SECRET
    if secret:
        digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
        headers[SIGNATURE_HEADER] = f"sha256={digest}"
    try:
        response = httpx.post(
            url, content=body, headers=headers, timeout=settings.GPUSHARE_BUDGET_WEBHOOK_TIMEOUT_S
        )
    except httpx.HTTPError as exc:
        log.warning("budget webhook %s failed: %s", url, exc)
        return f"error: {exc}"
    if response.status_code >= 400:
        log.warning("budget webhook %s answered %d", url, response.status_code)
    return str(response.status_code)
