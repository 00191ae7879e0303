"""Prices, spend and budgets over HTTP: JSON and CSV, who may do what, and isolation."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from billing.services import price_set
from tenants.models import Tenant
from tenants.services import IssuedKey
from tests.billing.ledger import charge
from tests.conftest import bearer_client

NOW = datetime.now(tz=UTC)


def as_role(staff_member: Callable[[str | None], User], role: str) -> APIClient:
    client = APIClient()
    client.force_authenticate(staff_member(role))
    return client


@pytest.fixture
def priced(owner: Tenant, outsider: Tenant, owner_key: IssuedKey) -> None:
    price_set(
        model="llama",
        input_per_million="2",
        output_per_million="6",
        effective_from=NOW - timedelta(days=2),
    )
    charge(
        owner,
        NOW - timedelta(minutes=1),
        prompt=500_000,
        completion=100_000,
        api_key=owner_key.api_key,
    )
    charge(outsider, NOW - timedelta(minutes=1), prompt=9_000_000)


def test_a_viewer_reads_a_tenants_spend_as_json_and_csv(staff_member, priced):
    viewer = as_role(staff_member, "viewer")
    body = viewer.get("/api/v1/tenants/acme/spend/?period=day&group_by=model").json()
    # 0.5 M x 2 + 0.1 M x 6
    assert body["total"]["money"] == "1.600000"
    assert body["currency"] == "USD"
    assert [g["group"] for g in body["groups"]] == ["llama"]
    response = viewer.get("/api/v1/tenants/acme/spend/?period=day&format=csv")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert rows == [
        {
            "group": "total",
            "requests": "1",
            "prompt_tokens": "500000",
            "completion_tokens": "100000",
            "total_tokens": "600000",
            "unit_hours": "0.000000",
            "money": "1.600000",
            "currency": "USD",
        }
    ]


def test_only_admins_change_prices(staff_member, db):
    price = {"model": "llama", "input_per_million": "0.5", "output_per_million": "1.5"}
    for role in ("viewer", "operator"):
        refused = as_role(staff_member, role).post("/api/v1/prices/", price, format="json")
        assert refused.status_code == 403, role
    admin = as_role(staff_member, "admin")
    created = admin.post("/api/v1/prices/", price, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["input_per_million"] == "0.500000"
    listed = as_role(staff_member, "superuser").get("/api/v1/prices/").json()
    assert [p["model"] for p in listed] == ["llama"]
    changed = admin.put(
        "/api/v1/prices/llama/",
        {"input_per_million": "0.7", "output_per_million": "2"},
        format="json",
    )
    assert changed.status_code == 200
    assert admin.get("/api/v1/prices/llama/").json()[0]["input_per_million"] == "0.700000"
    not_an_object = admin.put("/api/v1/prices/llama/", [None, None], format="json")
    assert not_an_object.status_code == 400, not_an_object.content
    bad = admin.post("/api/v1/prices/", {**price, "input_per_million": "-1"}, format="json")
    assert bad.status_code == 400
    assert admin.delete("/api/v1/prices/llama/").status_code == 204
    assert admin.get("/api/v1/prices/llama/").status_code == 404


def test_operators_set_budgets_and_viewers_do_not(staff_member, owner_key: IssuedKey):
    budget = {
        "amount": "50",
        "period": "day",
        "hard_stop": True,
        "alert_emails": ["ops@example.com"],
    }
    viewer = as_role(staff_member, "viewer")
    assert viewer.put("/api/v1/tenants/acme/budget/", budget, format="json").status_code == 403
    operator = as_role(staff_member, "operator")
    set_ = operator.put("/api/v1/tenants/acme/budget/", budget, format="json")
    assert set_.status_code == 200, set_.content
    assert set_.json()["hard_stop"] is True
    key_url = f"/api/v1/tenants/acme/keys/{owner_key.api_key.pk}/budget/"
    assert operator.put(key_url, {"amount": "5"}, format="json").json()["api_key"] == (
        owner_key.api_key.pk
    )
    assert viewer.get("/api/v1/tenants/acme/budget/").json()["amount"] == "50.000000"
    bad = operator.put("/api/v1/tenants/acme/budget/", {"amount": "0"}, format="json")
    assert bad.status_code == 400


def test_a_key_of_another_tenant_has_no_budget_here(staff_member, owner, outsider_key):
    operator = as_role(staff_member, "operator")
    url = f"/api/v1/tenants/acme/keys/{outsider_key.api_key.pk}/budget/"
    assert operator.put(url, {"amount": "5"}, format="json").status_code == 404


def test_a_tenant_reads_its_own_spend_only(priced, owner_key: IssuedKey, outsider_key: IssuedKey):
    mine = bearer_client(owner_key).get("/v1/spend?period=day").json()
    assert mine["tenant"] == "acme"
    assert mine["total"]["prompt_tokens"] == 500_000
    theirs = bearer_client(outsider_key).get("/v1/spend?period=day").json()
    assert theirs["total"]["money"] == "18.000000"
    # Another tenant's key id is not found through this tenant.
    peek = bearer_client(outsider_key).get(f"/v1/spend?key={owner_key.api_key.pk}")
    assert peek.status_code == 404
    assert "error" in peek.json()
    csv_text = bearer_client(owner_key).get("/v1/spend?period=day&format=csv").content.decode()
    assert "500000" in csv_text
    assert "9000000" not in csv_text


def test_spend_without_credentials_is_refused(db):
    assert APIClient().get("/api/v1/tenants/acme/spend/").status_code == 401
    assert APIClient().get("/v1/spend").status_code == 401
