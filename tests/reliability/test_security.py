"""Security: keys are kept only as SHA-256 digests and looked up by an indexed equality on
the digest (so the time a lookup takes says nothing about how much of a guessed key's
prefix is right); one tenant's key never reaches another tenant's files, batches or usage
(404, as for objects that do not exist); the console is for staff only and its forms are
CSRF-protected."""

from __future__ import annotations

import hashlib
import io
import json
import re
import sqlite3
from contextlib import closing
from typing import Any

import httpx
import psycopg
import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from staff.roles import Role, role_assign
from tenants.models import ApiKey
from tenants.services import api_key_authenticate
from tests.factories import TenantFactory
from tests.reliability.conftest import MODEL, Stack
from tests.reliability.helpers import chat_body, make_tenant, post

# --- keys -----------------------------------------------------------------------------------


def test_no_table_of_the_platform_holds_a_raw_key(stack: Stack) -> None:
    platform = stack.platform
    slug, key = make_tenant(platform)
    with httpx.Client(base_url=platform.base_url) as http:
        assert post(http, key, chat_body(8)).status == 200  # the key used: ledger, last_used_at
    secret = key[len("gs-") :]
    if stack.database.url.startswith("sqlite:"):
        tables, holding, stored, indexes = _sqlite_scan(stack.database.url, secret, slug)
    else:
        tables, holding, stored, indexes = _postgres_scan(stack.database.url, secret, slug)
    assert len(tables) > 10
    assert holding == []
    assert stored == [(hashlib.sha256(key.encode()).hexdigest(), key[:11])]
    assert any("UNIQUE" in d and "hashed_key" in d for (d,) in indexes), indexes


Scan = tuple[list[str], list[str], list[tuple[Any, ...]], list[tuple[str]]]
STORED_KEY_SQL = (
    "SELECT k.hashed_key, k.prefix FROM tenants_apikey k JOIN tenants_tenant t "
    "ON t.id = k.tenant_id WHERE t.slug = {}"
)


def _postgres_scan(url: str, secret: str, slug: str) -> Scan:
    """Every table, those whose rows hold `secret` as text, the tenant's stored key, and the
    key table's index definitions."""
    with psycopg.connect(url) as conn:
        tables = [row[0] for row in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
        )]  # fmt: skip
        holding = [
            table
            for table in tables
            if conn.execute(
                f'SELECT count(*) FROM "{table}" t WHERE t::text LIKE %s', [f"%{secret}%"]
            ).fetchone()[0]  # type: ignore[index]
        ]
        stored = conn.execute(STORED_KEY_SQL.format("%s"), [slug]).fetchall()
        indexes = conn.execute(
            "SELECT indexdef FROM pg_indexes WHERE tablename = 'tenants_apikey'"
        ).fetchall()
    return tables, holding, stored, indexes


def _sqlite_scan(url: str, secret: str, slug: str) -> Scan:
    """The same on SQLite (`make test` without DATABASE_URL): each row's columns as text."""
    with closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as conn:
        tables = [row[0] for row in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        )]  # fmt: skip
        holding = [
            table
            for table in tables
            if any(
                secret in " ".join(map(str, row))
                for row in conn.execute(f'SELECT * FROM "{table}"')
            )
        ]
        stored = conn.execute(STORED_KEY_SQL.format("?"), [slug]).fetchall()
        unique = [name for name, is_unique in conn.execute(
            "SELECT name, \"unique\" FROM pragma_index_list('tenants_apikey')"
        ) if is_unique]  # fmt: skip
        indexes = [
            (f"UNIQUE ({', '.join(c[2] for c in conn.execute(f'PRAGMA index_info({n!r})'))})",)
            for n in unique
        ]
    return tables, holding, stored, indexes


@pytest.mark.django_db
def test_no_table_holds_a_raw_admin_token() -> None:
    """Staff's admin API tokens, minted by the CLI and used, are in no table of the database
    (SQLite or PostgreSQL, as DATABASE_URL says): only their digest and first characters."""
    from django.core.management import call_command

    from staff.models import AdminToken

    call_command("staff", "add", "token-op", "--role", "viewer", stdout=io.StringIO())
    out = io.StringIO()
    call_command("staff", "token", "create", "token-op", "--json", stdout=out)
    raw = json.loads(out.getvalue())["token"]
    # Used: its last_used_at written, the request's rows (sessions, ledger) written too.
    assert Client().get("/api/v1/tenants/", HTTP_AUTHORIZATION=f"Bearer {raw}").status_code == 200
    secret = raw[len("gsa-") :]
    tables = connection.introspection.table_names(include_views=False)
    holding = []
    with connection.cursor() as cursor:
        for table in tables:
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")
            if any(secret in " ".join(map(str, row)) for row in cursor.fetchall()):
                holding.append(table)
    assert len(tables) > 10
    assert holding == []
    stored = AdminToken.objects.get()
    assert (stored.hashed_key, stored.prefix) == (
        hashlib.sha256(raw.encode()).hexdigest(),
        raw[:12],
    )
    assert "authtoken_token" not in tables  # DRF's table of raw tokens


@pytest.mark.django_db
def test_a_key_is_looked_up_by_its_digest_with_one_indexed_equality() -> None:
    from tenants.services import api_key_create

    issued = api_key_create(tenant=TenantFactory.create(slug="sec-owner"), name="k")
    # A guess with the right first 30 characters: the lookup is by the digest of the whole
    # guess, so a right prefix leads the database to no nearer row than a wrong one.
    guess = issued.raw_key[:30] + ("A" if issued.raw_key[30] != "A" else "B") + issued.raw_key[31:]
    assert ApiKey._meta.get_field("hashed_key").unique  # a unique B-tree index
    for raw, found in ((issued.raw_key, True), (guess, False)):
        with CaptureQueriesContext(connection) as queries:
            try:
                api_key_authenticate(raw_key=raw)
                ok = True
            except Exception:
                ok = False
        assert ok is found
        lookups = [q["sql"] for q in queries.captured_queries if "tenants_apikey" in q["sql"]]
        lookups = [sql for sql in lookups if sql.lstrip().upper().startswith("SELECT")]
        assert len(lookups) == 1, lookups
        sql = lookups[0]
        digest = hashlib.sha256(raw.encode()).hexdigest()
        assert re.search(r'"hashed_key" = \'?' + digest, sql), sql
        assert "LIKE" not in sql.upper()
        assert raw not in sql
        assert raw[:11] not in sql


# --- isolation ------------------------------------------------------------------------------


def _batch_file() -> bytes:
    body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": body}
    return (json.dumps(line) + "\n").encode()


def test_one_tenants_key_never_reaches_another_tenants_files_batches_or_usage(
    stack: Stack,
) -> None:
    platform = stack.platform
    owner_slug, owner = make_tenant(platform)
    teammate_key = platform.manage_json("key", "create", owner_slug, "--name", "mate")["key"]
    _, outsider = make_tenant(platform)

    def as_(key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"}

    with httpx.Client(base_url=platform.base_url, timeout=60) as http:
        uploaded = http.post(
            "/v1/files", headers=as_(owner), data={"purpose": "batch"},
            files={"file": ("in.jsonl", _batch_file())},
        ).json()  # fmt: skip
        file_id = uploaded["id"]
        batch = http.post(
            "/v1/batches", headers=as_(owner),
            json={"input_file_id": file_id, "endpoint": "/v1/chat/completions",
                  "completion_window": "24h"},
        ).json()  # fmt: skip
        batch_id = batch["id"]
        assert post(http, owner, chat_body(8)).status == 200

        attempts: list[tuple[str, str, dict[str, Any]]] = [
            ("GET", f"/v1/files/{file_id}", {}),
            ("GET", f"/v1/files/{file_id}/content", {}),
            ("DELETE", f"/v1/files/{file_id}", {}),
            ("GET", f"/v1/batches/{batch_id}", {}),
            ("POST", f"/v1/batches/{batch_id}/cancel", {}),
            ("POST", "/v1/batches", {"json": {"input_file_id": file_id, "completion_window":
                                              "24h", "endpoint": "/v1/chat/completions"}}),
        ]  # fmt: skip
        for method, path, extra in attempts:
            response = http.request(method, path, headers=as_(outsider), **extra)
            assert response.status_code == 404, (method, path, response.status_code)
            assert response.json()["error"]["type"] == "invalid_request_error", response.text
        listed = http.get("/v1/files", headers=as_(outsider)).json()["data"]
        assert file_id not in {f["id"] for f in listed}
        batches = http.get("/v1/batches", headers=as_(outsider)).json()["data"]
        assert batch_id not in {b["id"] for b in batches}
        # The teammate (another key of the owner) does see them.
        assert http.get(f"/v1/files/{file_id}", headers=as_(teammate_key)).status_code == 200
        assert http.get(f"/v1/batches/{batch_id}", headers=as_(teammate_key)).status_code == 200

        def usage(key: str) -> dict[str, Any]:
            result: dict[str, Any] = http.get("/v1/usage", headers=as_(key)).json()
            return result

        assert owner_slug in json.dumps(usage(owner))
        assert owner_slug not in json.dumps(usage(outsider))
        # The admin API is not reachable with a tenant key.
        admin = http.get(f"/api/v1/tenants/{owner_slug}/usage/", headers=as_(outsider))
        assert admin.status_code in (401, 403)


# --- console --------------------------------------------------------------------------------

CONSOLE_PAGES = ["overview", "tenants", "tenant-create", "engines", "queues", "batches",
                 "reports", "planner"]  # fmt: skip


@pytest.mark.django_db
def test_the_console_requires_staff() -> None:
    User.objects.create_user("visitor", password="pw-visitor", is_staff=False)
    anonymous, member = Client(), Client()
    assert member.login(username="visitor", password="pw-visitor")
    for name in CONSOLE_PAGES:
        url = reverse(f"console:{name}")
        for client in (anonymous, member):
            response = client.get(url)
            assert response.status_code == 302, (url, response.status_code)
            assert "/login/" in response["Location"]


@pytest.mark.django_db
def test_console_forms_refuse_a_post_without_its_csrf_token() -> None:
    role_assign(user=User.objects.create_user("op", password="pw-op"), role=Role.ADMIN)
    browser = Client(enforce_csrf_checks=True)
    assert browser.login(username="op", password="pw-op")
    url = reverse("console:tenant-create")
    form = {"slug": "csrf-victim", "name": "victim", "weight": "1", "quota_units": "1",
            "burst_units": "0"}  # fmt: skip
    refused = browser.post(url, form)
    assert refused.status_code == 403
    assert b"CSRF" in refused.content
    page = browser.get(url)
    assert page.status_code == 200
    token = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', page.content)
    assert token is not None  # the form carries its token
    accepted = browser.post(url, {**form, "csrfmiddlewaretoken": token.group(1).decode()})
    assert accepted.status_code != 403
