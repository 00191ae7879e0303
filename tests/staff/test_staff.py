"""Staff roles from the command line, the roles' groups after migrations, and DRF's raw
tokens turned into digests by the migration (on the database DATABASE_URL names)."""

from __future__ import annotations

import hashlib
import io
import json

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from rest_framework.test import APIClient

from staff.models import AdminToken
from staff.roles import ROLE_PERMISSIONS, Role, role_of

pytestmark = pytest.mark.django_db


def staff(*args: str) -> str:
    out = io.StringIO()
    call_command("staff", *args, stdout=out)
    return out.getvalue()


def test_each_roles_group_holds_its_permissions_and_the_admins_every_models() -> None:
    for role, perms in ROLE_PERMISSIONS.items():
        group = Group.objects.get(name=role.value)
        held = {f"{p.content_type.app_label}.{p.codename}" for p in group.permissions.all()}
        assert {p.value for p in perms} <= held
    admin = Group.objects.get(name=Role.ADMIN.value)
    assert admin.permissions.filter(codename="change_tenant").exists()  # the Django admin's
    assert (
        not Group.objects.get(name=Role.OPERATOR.value)
        .permissions.filter(codename="change_tenant")
        .exists()
    )


def test_staff_add_gives_one_role_and_list_and_remove_show_and_take_it() -> None:
    User.objects.create_superuser("root", "root@example.com", "pw")
    staff("add", "alice", "--role", "viewer")
    staff("add", "alice", "--role", "operator")
    alice = User.objects.get(username="alice")
    assert alice.is_staff
    assert role_of(alice) == "operator"
    assert list(alice.groups.values_list("name", flat=True)) == ["operator"]
    staff("token", "create", "alice")
    listed = json.loads(staff("list", "--json"))
    assert listed == [
        {"user": "alice", "role": "operator", "active": True, "tokens": 1},
        {"user": "root", "role": "superuser", "active": True, "tokens": 0},
    ]
    staff("remove", "alice")
    alice.refresh_from_db()
    assert (alice.is_staff, role_of(alice)) == (False, None)


def test_a_token_revoked_from_the_command_line_opens_nothing() -> None:
    staff("add", "bob", "--role", "admin")
    issued = json.loads(staff("token", "create", "bob", "--name", "ci", "--json"))
    assert "token" not in json.loads(staff("token", "list", "bob", "--json"))[0]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued['token']}")
    assert client.get("/api/v1/tenants/").status_code == 200
    staff("token", "revoke", str(issued["id"]))
    assert client.get("/api/v1/tenants/").status_code == 401


@pytest.mark.django_db(transaction=True)
def test_the_migration_keeps_drf_tokens_working_as_digests_and_drops_the_raw_table() -> None:
    user = User.objects.create_user("legacy", is_staff=True)
    raw = "0123456789abcdef0123456789abcdef01234567"  # DRF's 40 hex digits
    executor = MigrationExecutor(connection)
    executor.migrate([("staff", "0001_initial")])  # before the roles, as an upgrade runs
    with connection.cursor() as cursor:  # DRF authtoken's table, as its migrations made it
        cursor.execute(
            "CREATE TABLE authtoken_token (key varchar(40) PRIMARY KEY, "
            "created timestamp with time zone NOT NULL, user_id integer NOT NULL UNIQUE)"
            if connection.vendor == "postgresql"
            else "CREATE TABLE authtoken_token (key varchar(40) PRIMARY KEY, "
            "created datetime NOT NULL, user_id integer NOT NULL UNIQUE)"
        )
        cursor.execute(
            "INSERT INTO authtoken_token VALUES (%s, %s, %s)", [raw, "2025-01-02 03:04:05", user.pk]
        )
    executor = MigrationExecutor(connection)
    executor.migrate([("staff", "0003_admin_tokens_from_authtoken")])

    assert "authtoken_token" not in connection.introspection.table_names()
    stored = AdminToken.objects.get(user=user)
    assert (stored.hashed_key, stored.prefix) == (hashlib.sha256(raw.encode()).hexdigest(), raw[:8])
    assert stored.created_at.year == 2025
    assert Group.objects.get(name="admin").user_set.filter(pk=user.pk).exists()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {raw}")
    assert client.get("/api/v1/tenants/").status_code == 200
