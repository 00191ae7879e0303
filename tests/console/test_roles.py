"""What each staff role may do in the console: every console URL, found through the URL
resolver (a new page is in the table below or this test fails), asked with GET and POST by a
user of each role, answers 403 where the role does not hold the page's permission and
anything else where it does. Staff in no role get 403 everywhere; non-staff, the login page.
The role's tenant edit form keeps the fields the role may not change."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import URLPattern, get_resolver, reverse
from django.utils import timezone

from scheduler.batches.files import file_create
from scheduler.models import Batch, BatchStatus, Engine, FilePurpose
from tenants.models import Tenant
from tenants.services import api_key_create
from tests.factories import TenantFactory
from tests.support.sent_tasks import SentTasks

pytestmark = pytest.mark.django_db

ROLES = ("viewer", "operator", "admin")  # each holds what the one before it holds
# The lowest role that may use each console page (GET and POST alike).
MINIMUM_ROLE = {
    "overview": "viewer",
    "overview-live": "viewer",
    "tenants": "viewer",
    "tenant-create": "admin",
    "units-preview": "viewer",
    "tenant": "viewer",
    "tenant-edit": "operator",
    "key-create": "admin",
    "key-revoke": "admin",
    "engines": "viewer",
    "engine": "viewer",
    "engine-action": "operator",
    "queues": "viewer",
    "queues-live": "viewer",
    "batches": "viewer",
    "batch": "viewer",
    "batch-cancel": "operator",
    "batch-file": "admin",  # a tenant's data
    "reports": "viewer",
    "request-lookup": "viewer",
    "planner": "viewer",
    "prices": "viewer",
    "audit": "viewer",
}


def console_routes() -> list[str]:
    patterns = get_resolver().namespace_dict["console"][1].url_patterns
    return [p.name for p in patterns if isinstance(p, URLPattern) and p.name]


def test_every_console_page_has_a_role_in_the_table() -> None:
    assert sorted(console_routes()) == sorted(MINIMUM_ROLE)


@pytest.fixture
def world(engine: Engine, sent_tasks: SentTasks, settings: Any, tmp_path: Path) -> dict[str, Any]:
    """A tenant with a key, the console's engine, a running batch with its input file: the
    objects every page's URL names."""
    settings.GPUSHARE_BATCH_FILES_DIR = tmp_path / "files"
    acme = TenantFactory.create(slug="acme")
    key = api_key_create(tenant=acme, name="ci").api_key
    source = file_create(
        tenant=acme, purpose=FilePurpose.BATCH, filename="in.jsonl", chunks=[b"{}\n"]
    )
    batch = Batch.objects.create(
        public_id="batch_roles", tenant=acme, endpoint="/v1/chat/completions",
        input_file_id=source.public_id, status=BatchStatus.IN_PROGRESS,
        expires_at=timezone.now() + timedelta(hours=24),
    )  # fmt: skip
    return {
        "slug": acme.slug,
        "key_id": key.pk,
        "name": engine.name,
        "action": "drain",
        "batch_id": batch.public_id,
        "file_id": source.public_id,
    }


def url_of(name: str, world: dict[str, Any]) -> str:
    pattern = next(p for p in get_resolver().namespace_dict["console"][1].url_patterns
                   if getattr(p, "name", None) == name)  # fmt: skip
    kwargs = {arg: world[arg] for arg in pattern.pattern.converters}
    return reverse(f"console:{name}", kwargs=kwargs)


def form_for(name: str) -> dict[str, str]:
    if name in ("tenant-create", "tenant-edit"):
        return {"slug": "roles-new", "name": "x", "weight": "1", "quota_units": "1",
                "burst_units": "0", "budget_period": "month"}  # fmt: skip
    if name == "key-create":
        return {"name": "k", "default_class": "standard"}
    return {}


@pytest.mark.parametrize("name", sorted(MINIMUM_ROLE))
@pytest.mark.parametrize("role", [None, *ROLES, "superuser"])
def test_a_role_reaches_the_pages_its_permissions_allow(
    name: str,
    role: str | None,
    world: dict[str, Any],
    staff_member: Callable[[str | None], User],
    client: Client,
) -> None:
    client.force_login(staff_member(role))
    allowed = role == "superuser" or (
        role is not None and ROLES.index(role) >= ROLES.index(MINIMUM_ROLE[name])
    )
    url = url_of(name, world)
    for method in ("get", "post"):
        response = getattr(client, method)(url, form_for(name) if method == "post" else {})
        if allowed:
            assert response.status_code != 403, (method, url, role)
            assert response.status_code < 500, (method, url, role)
        else:
            assert response.status_code == 403, (method, url, role, response.status_code)


@pytest.mark.parametrize("name", sorted(MINIMUM_ROLE))
def test_a_user_who_is_not_staff_is_sent_to_the_login_page(
    name: str, world: dict[str, Any], client: Client
) -> None:
    User.objects.create_user("visitor", password="pw")
    client.login(username="visitor", password="pw")
    response = client.get(url_of(name, world))
    assert response.status_code == 302
    assert "/login/" in response["Location"]


def test_an_operator_changes_a_tenants_limits_but_not_its_fields_or_classes(
    staff_member: Callable[[str | None], User], client: Client
) -> None:
    acme = TenantFactory.create(
        slug="acme", allowed_classes=["standard"], enabled_fields=[], quota_units=2
    )
    client.force_login(staff_member("operator"))
    form = {"name": "renamed", "weight": "3", "quota_units": "9", "burst_units": "1",
            "budget_period": "month", "allowed_classes": ["standard", "interactive"],
            "enabled_fields": ["prompt_logprobs"], "cache_group": "shared"}  # fmt: skip
    response = client.post(reverse("console:tenant-edit", args=["acme"]), form)
    assert response.status_code == 302
    acme.refresh_from_db()
    assert (acme.weight, acme.quota_units, acme.burst_units) == (3, 9, 1)
    assert acme.allowed_classes == ["standard"]
    assert acme.enabled_fields == []
    assert (acme.name, acme.cache_group) != ("renamed", "shared")


def test_the_tenant_page_hides_the_actions_a_viewer_may_not_take(
    staff_member: Callable[[str | None], User], client: Client
) -> None:
    acme: Tenant = TenantFactory.create(slug="acme")
    api_key_create(tenant=acme, name="ci")
    client.force_login(staff_member("viewer"))
    html = client.get(reverse("console:tenant", args=["acme"])).content.decode()
    assert reverse("console:key-create", args=["acme"]) not in html
    assert reverse("console:tenant-edit", args=["acme"]) not in html
    client.force_login(staff_member("admin"))
    html = client.get(reverse("console:tenant", args=["acme"])).content.decode()
    assert reverse("console:key-create", args=["acme"]) in html
