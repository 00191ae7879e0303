"""`manage.py price`, `spend`, `budget` and `audit`."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import CommandError, call_command

from audit.models import AuditEvent
from tenants.models import Tenant
from tests.billing.ledger import charge


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_price_set_and_list(db):
    run("price", "set", "llama", "--input", "0.2", "--output", "0.6", "--unit-hour", "0.01")
    [price] = json.loads(run("price", "list", "--json"))
    assert price["model"] == "llama"
    assert price["unit_hour"] == "0.010000"
    assert "llama" in run("price", "list")
    with pytest.raises(CommandError, match="zero or more"):
        run("price", "set", "llama", "--input", "-3")
    assert AuditEvent.objects.filter(action="price.set", via="cli").count() == 1


def test_spend_of_a_tenant_for_the_day_as_a_table_csv_and_json(owner: Tenant, outsider: Tenant):
    run(
        "price",
        "set",
        "llama",
        "--input",
        "4",
        "--from",
        (datetime.now(tz=UTC) - timedelta(days=1)).isoformat(),
    )
    charge(owner, datetime.now(tz=UTC), prompt=250_000)
    charge(outsider, datetime.now(tz=UTC), prompt=9_000_000)
    table = run("spend", "--tenant", "acme", "--period", "day")
    assert "1.000000" in table
    rows = list(
        csv.DictReader(
            io.StringIO(
                run("spend", "--tenant", "acme", "--period", "day", "--group-by", "model", "--csv")
            )
        )
    )
    assert [(r["model"], r["money"]) for r in rows] == [("llama", "1.000000")]
    [total] = json.loads(run("spend", "--tenant", "acme", "--period", "day", "--json"))
    assert total["prompt_tokens"] == 250_000
    with pytest.raises(CommandError, match="nobody"):
        run("spend", "--tenant", "nobody")


def test_budget_set_show_and_check(owner: Tenant, redis_db):
    run(
        "price",
        "set",
        "llama",
        "--input",
        "10",
        "--from",
        (datetime.now(tz=UTC) - timedelta(days=1)).isoformat(),
    )
    run(
        "budget",
        "set",
        "acme",
        "--amount",
        "2",
        "--period",
        "day",
        "--hard-stop",
        "--email",
        "ops@example.com",
    )
    shown = json.loads(run("budget", "show", "acme", "--json"))
    assert (shown["amount"], shown["hard_stop"], shown["alert_emails"]) == (
        "2.000000",
        True,
        ["ops@example.com"],
    )
    charge(owner, datetime.now(tz=UTC), prompt=150_000)  # 1.5 of 2: 50 %
    [alert] = json.loads(run("budget", "check", "--json"))
    assert alert["thresholds"] == [50]
    assert json.loads(run("budget", "check", "--json")) == []
    with pytest.raises(CommandError, match="needs an amount"):
        run("budget", "set", "acme", "--key", str(_key(owner)), "--period", "day")


def _key(tenant: Tenant) -> int:
    from tenants.services import api_key_create

    return api_key_create(tenant=tenant, name="k").api_key.pk


def test_audit_list_filters_by_action(owner: Tenant):
    run("price", "set", "llama", "--input", "1")
    run("budget", "set", "acme", "--amount", "3")
    listed = json.loads(run("audit", "list", "--action", "budget.", "--json"))
    assert [e["action"] for e in listed] == ["budget.create"]
    assert listed[0]["actor"].startswith("cli:")
    assert "price.set" in run("audit", "list")
