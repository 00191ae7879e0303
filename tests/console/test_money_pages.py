"""The prices page, the audit log page and the spend on a tenant's page."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.test import Client
from django.urls import reverse

from audit.models import AuditEvent
from billing.services import budget_set, price_set
from tenants.models import Tenant
from tenants.services import IssuedKey, tenant_update
from tests.billing.ledger import charge


def test_the_prices_page_lists_the_prices_in_effect_and_the_budgets(console: Client, owner: Tenant):
    price_set(model="llama", input_per_million="0.25", output_per_million="1")
    budget_set(tenant=owner, amount="40", hard_stop=True)
    html = console.get(reverse("console:prices")).content.decode()
    assert 'data-model="llama"' in html
    assert "0.250000" in html
    assert "40.000000" in html


def test_the_tenant_page_shows_this_months_spend_by_model(
    console: Client, owner: Tenant, owner_key: IssuedKey
):
    price_set(
        model="llama",
        input_per_million="2",
        effective_from=datetime.now(tz=UTC) - timedelta(days=40),
    )
    charge(owner, datetime.now(tz=UTC) - timedelta(seconds=5), prompt=3_000_000)
    html = console.get(reverse("console:tenant", args=["acme"])).content.decode()
    total = html[html.index('id="spend-total"') :]
    assert "6.000000" in total[: total.index("</tr>")]


def test_the_audit_page_shows_changes_filtered_by_action(console: Client, owner: Tenant):
    tenant_update(tenant=owner, quota_units=12)
    price_set(model="llama", input_per_million="1")
    html = console.get(reverse("console:audit")).content.decode()
    assert 'data-action="tenant.update"' in html
    assert 'data-action="price.set"' in html
    assert "quota_units" in html
    filtered = console.get(reverse("console:audit"), {"action": "price."}).content.decode()
    assert 'data-action="price.set"' in filtered
    assert 'data-action="tenant.update"' not in filtered


def test_an_engine_drained_from_the_console_is_in_the_audit_log(console: Client, engine):
    console.post("/console/engines/llama-a/drain/", REMOTE_ADDR="192.0.2.7")
    event = AuditEvent.objects.get(action="engine.drain")
    assert (event.object_id, event.actor, event.via, event.remote_addr) == (
        "llama-a",
        "operator",
        "console",
        "192.0.2.7",
    )
    assert event.after == {"status": "draining"}
