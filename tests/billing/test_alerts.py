"""The budget check: alerts at 50, 80 and 100 % once per period, by email (Django's locmem
backend) and by webhook (a real HTTP server the test starts), and the hard stop."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest
from django.core import mail

from billing.alerts import SIGNATURE_HEADER, budgets_check
from billing.models import BudgetAlert
from billing.services import budget_set, price_set
from billing.stops import MoneyBudgetExhausted, clear_cache, money_admit
from tenants.models import Tenant
from tenants.services import IssuedKey
from tests.billing.ledger import charge

# Noon of the day the tests run: the hard stop is checked against the clock, so the day a
# budget is exhausted must be today.
NOW = datetime.now(tz=UTC).replace(hour=12, minute=0, second=0, microsecond=0)


class Hook:
    """A local HTTP server that keeps what it is POSTed."""

    def __init__(self) -> None:
        received: list[tuple[dict[str, str], bytes]] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                received.append((dict(self.headers), body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.received = received
        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hook() -> Iterator[Hook]:
    server = Hook()
    yield server
    server.close()


@pytest.fixture
def priced(db: None) -> None:
    # 10 per million input tokens: 100 000 tokens cost 1.
    price_set(model="llama", input_per_million="10", effective_from=NOW - timedelta(days=30))


def test_each_threshold_alerts_once_per_period_by_email_and_webhook(
    owner: Tenant, priced: None, hook: Hook, settings, redis_db
):
    settings.GPUSHARE_BUDGET_WEBHOOK_SECRET = "s3cret"
    budget_set(
        tenant=owner,
        amount="10",
        period="day",
        alert_emails=["ops@example.com"],
        webhook_url=hook.url,
    )
    charge(owner, NOW - timedelta(hours=1), prompt=400_000)  # 4 of 10
    assert budgets_check(NOW) == []
    charge(owner, NOW - timedelta(minutes=30), prompt=450_000)  # 8.5 of 10: 50 and 80
    [crossing] = budgets_check(NOW)
    assert crossing.thresholds == [50, 80]
    assert len(mail.outbox) == 1
    assert mail.outbox[0].to == ["ops@example.com"]
    assert mail.outbox[0].subject == "[gpushare] acme: 80% of the budget per day spent"
    headers, body = hook.received[0]
    payload = json.loads(body)
    assert payload["threshold_percent"] == 80
    assert payload["thresholds_percent"] == [50, 80]
    assert payload["spend"] == "8.500000"
    assert payload["tenant"] == "acme"
    expected = hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()
    assert headers[SIGNATURE_HEADER] == f"sha256={expected}"
    # Checked again: nothing new to say.
    assert budgets_check(NOW + timedelta(minutes=1)) == []
    assert len(mail.outbox) == 1
    assert len(hook.received) == 1
    assert set(BudgetAlert.objects.values_list("threshold", "webhook_status", "emailed")) == {
        (50, "204", True),
        (80, "204", True),
    }
    # The next day is a new period: the same spend there alerts again.
    charge(owner, NOW + timedelta(days=1), prompt=600_000)
    [next_day] = budgets_check(NOW + timedelta(days=1, hours=1))
    assert next_day.thresholds == [50]


def test_a_hard_stop_refuses_the_tenant_until_the_period_ends(
    owner: Tenant, owner_key: IssuedKey, priced: None, redis_db
):
    budget_set(tenant=owner, amount="1", period="day", hard_stop=True)
    key = owner_key.api_key
    charge(owner, NOW - timedelta(hours=1), prompt=150_000, api_key=key)  # 1.5 of 1
    [crossing] = budgets_check(NOW)
    assert crossing.thresholds == [50, 80, 100]
    crossing.budget.refresh_from_db()
    assert crossing.budget.exhausted_until == NOW.replace(hour=0) + timedelta(days=1)
    clear_cache()
    with pytest.raises(MoneyBudgetExhausted) as refused:
        money_admit(tenant_id=owner.pk, api_key_id=key.pk)
    assert refused.value.http_status == 429
    assert refused.value.code == "insufficient_quota"


def test_a_keys_hard_stop_refuses_that_key_only(
    owner: Tenant, owner_key: IssuedKey, teammate_key: IssuedKey, priced: None, redis_db
):
    budget_set(tenant=owner, api_key=owner_key.api_key, amount="1", hard_stop=True)
    charge(owner, datetime.now(tz=UTC), prompt=200_000, api_key=owner_key.api_key)
    budgets_check()
    clear_cache()
    with pytest.raises(MoneyBudgetExhausted):
        money_admit(tenant_id=owner.pk, api_key_id=owner_key.api_key.pk)
    money_admit(tenant_id=owner.pk, api_key_id=teammate_key.api_key.pk)  # not stopped


def test_without_hard_stop_the_budget_only_alerts(
    owner: Tenant, owner_key: IssuedKey, priced: None, redis_db
):
    budget_set(tenant=owner, amount="1", period="day")
    charge(owner, datetime.now(tz=UTC), prompt=500_000, api_key=owner_key.api_key)
    [crossing] = budgets_check()
    assert crossing.thresholds == [50, 80, 100]
    clear_cache()
    money_admit(tenant_id=owner.pk, api_key_id=owner_key.api_key.pk)  # admitted


def test_an_unreachable_webhook_is_recorded_and_does_not_stop_the_check(
    owner: Tenant, outsider: Tenant, priced: None, redis_db
):
    budget_set(tenant=owner, amount="1", period="day", webhook_url="http://127.0.0.1:9/none")
    budget_set(tenant=outsider, amount="1", period="day", alert_emails=["b@example.com"])
    charge(owner, NOW, prompt=100_000)
    charge(outsider, NOW, prompt=100_000)
    assert len(budgets_check(NOW + timedelta(minutes=1))) == 2
    statuses = set(
        BudgetAlert.objects.filter(budget__tenant=owner).values_list("webhook_status", flat=True)
    )
    assert all(s.startswith("error") for s in statuses)
    assert len(mail.outbox) == 1
