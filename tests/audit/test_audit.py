"""The audit log: written for each kind of change by whoever made it and from where, read
and exported by staff, and append-only."""

from __future__ import annotations

import csv
import io
from typing import Any

import pytest
from django.contrib.admin.sites import site
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction
from django.test import RequestFactory
from rest_framework.test import APIClient

from audit.context import command_actor
from audit.models import AppendOnly, AuditEvent
from audit.services import audit_record
from billing.services import budget_set, price_set
from scheduler.models import Pool
from scheduler.services import pool_create, pool_update
from tenants.models import Tenant
from tenants.services import IssuedKey


def last(action: str) -> AuditEvent:
    event = AuditEvent.objects.filter(action=action).first()
    assert event is not None, f"no {action} event"
    return event


def b(event: AuditEvent) -> dict[str, Any]:
    assert event.before is not None
    return event.before


def a(event: AuditEvent) -> dict[str, Any]:
    assert event.after is not None
    return event.after


def test_the_admin_api_records_tenant_quota_and_key_changes_with_actor_and_address(
    staff_client: APIClient, staff_user: User
):
    created = staff_client.post(
        "/api/v1/tenants/",
        {"slug": "initech", "quota_units": 4},
        format="json",
        REMOTE_ADDR="10.1.2.3",
    )
    assert created.status_code == 201
    event = last("tenant.create")
    assert (event.actor, event.via, event.remote_addr) == ("operator", "api", "10.1.2.3")
    assert event.before is None
    assert a(event)["slug"] == "initech"
    staff_client.patch("/api/v1/tenants/initech/quota/", {"quota_units": 9}, format="json")
    update = last("tenant.update")
    assert (b(update)["quota_units"], a(update)["quota_units"]) == (4, 9)
    assert update.changed_fields == ["quota_units"]
    key = staff_client.post("/api/v1/tenants/initech/keys/", {"name": "ci"}, format="json").json()
    assert "hashed_key" not in a(last("apikey.create"))  # no secret's digest in the log
    staff_client.post(f"/api/v1/tenants/initech/keys/{key['id']}/revoke/")
    revoke = last("apikey.revoke")
    assert b(revoke)["revoked_at"] is None
    assert a(revoke)["revoked_at"] is not None
    staff_client.delete("/api/v1/tenants/initech/")
    assert b(last("tenant.delete"))["slug"] == "initech"


def test_prices_budgets_and_pools_are_recorded(owner: Tenant):
    price_set(model="llama", input_per_million="1")
    price_set(model="llama", input_per_million="2")
    change = last("price.set")
    assert (b(change)["input_per_million"], a(change)["input_per_million"]) == (
        "1.000000",
        "2.000000",
    )
    budget_set(tenant=owner, amount="10")
    budget_set(tenant=owner, amount="20", hard_stop=True)
    assert a(last("budget.update"))["hard_stop"] is True
    pool = pool_create(served_model_name="llama", model_path="/m", footprint_units=4)
    pool_update(pool=pool, hot_size=2)
    assert a(last("pool.update"))["hot_size"] == 2
    assert last("pool.create").object_id == "llama"
    assert last("price.set").actor == "system"  # no request, no command: the platform


def test_a_management_command_records_its_os_user(db):
    call_command("tenant", "create", "hooli", "--quota-units", "2", stdout=io.StringIO())
    event = last("tenant.create")
    assert event.actor == command_actor().name
    assert event.actor.startswith("cli:")
    assert event.via == "cli"


def test_the_django_admin_records_its_saves(staff_user: User, owner: Tenant):
    pool = Pool.objects.create(served_model_name="mistral", model_path="/m", footprint_units=4)
    request = RequestFactory().post("/admin/scheduler/pool/")
    request.user = staff_user
    pool.hot_size = 3
    site._registry[Pool].save_model(request, pool, form=None, change=True)
    event = last("pool.update")
    assert (b(event)["hot_size"], a(event)["hot_size"]) == (1, 3)
    assert event.actor == "operator"
    assert event.via == "admin"


def test_the_admin_apis_revoke_action_is_recorded(client, staff_user: User, owner_key: IssuedKey):
    client.force_login(staff_user)
    response = client.post(
        "/admin/tenants/apikey/",
        {"action": "revoke_keys", "_selected_action": [owner_key.api_key.pk]},
    )
    assert response.status_code == 302
    assert last("apikey.revoke").via == "admin"


def test_staff_export_the_log_as_json_and_csv_filtered(staff_member, owner: Tenant):
    price_set(model="llama", input_per_million="1")
    budget_set(tenant=owner, amount="5")
    viewer = APIClient()
    viewer.force_authenticate(staff_member("viewer"))
    body = viewer.get("/api/v1/audit/?action=price.").json()
    assert [e["action"] for e in body["results"]] == ["price.set"]
    response = viewer.get("/api/v1/audit/?format=csv&object_type=moneybudget")
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert [r["action"] for r in rows] == ["budget.create"]
    assert '"amount": "5.000000"' in rows[0]["after"]
    assert APIClient().get("/api/v1/audit/").status_code == 401
    nobody = APIClient()
    nobody.force_authenticate(staff_member(None))
    assert nobody.get("/api/v1/audit/").status_code == 403


def test_events_cannot_be_changed_or_deleted(db):
    event = audit_record(action="tenant.update", object_type="tenant", object_id="1")
    event.actor = "someone else"
    with pytest.raises(AppendOnly):
        event.save()
    with pytest.raises(AppendOnly):
        event.delete()
    with pytest.raises(AppendOnly):
        AuditEvent.objects.filter(pk=event.pk).update(actor="x")
    with pytest.raises(AppendOnly):
        AuditEvent.objects.filter(pk=event.pk).delete()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the trigger is PostgreSQL's")
def test_the_database_refuses_to_rewrite_an_event_whatever_sends_it(db):
    event = audit_record(action="tenant.update", object_type="tenant", object_id="1")
    for statement in (
        "UPDATE audit_auditevent SET actor = 'x' WHERE id = %s",
        "DELETE FROM audit_auditevent WHERE id = %s",
    ):
        with pytest.raises(DatabaseError), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(statement, [event.pk])
    assert AuditEvent.objects.get(pk=event.pk).actor == "system"


def test_a_change_that_rolls_back_leaves_no_event(owner: Tenant):
    def set_then_fail() -> None:
        with transaction.atomic():
            budget_set(tenant=owner, amount="5")
            raise RuntimeError

    with pytest.raises(RuntimeError):
        set_then_fail()
    assert not AuditEvent.objects.filter(action="budget.create").exists()
