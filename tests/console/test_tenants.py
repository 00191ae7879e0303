"""The console's tenant pages through Django's test client: permissions, data, forms."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.test import Client
from redis import Redis

from scheduler.adapters.models import Adapter
from tenants.models import ApiKey, Tenant
from tenants.services import IssuedKey, api_key_create, api_key_revoke

CONSOLE_PAGES = [
    "/console/",
    "/console/tenants/",
    "/console/tenants/acme/",
    "/console/tenants/acme/edit/",
    "/console/tenants/new/",
    "/console/live/overview/",
    "/console/engines/",
    "/console/queues/",
    "/console/live/queues/",
    "/console/batches/",
    "/console/reports/",
    "/console/requests/?id=0123",
    "/console/planner/",
    "/console/units/?quota_units=8",
]


@pytest.fixture
def member(db: None) -> User:
    return User.objects.create_user("member", "m@example.com", "pw-member", is_staff=False)


@pytest.mark.parametrize("url", CONSOLE_PAGES)
def test_anonymous_visitors_are_sent_to_the_login_page(client: Client, owner: Tenant, url: str):
    response = client.get(url)

    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/?next=")
    assert url.split("?")[0] in response["Location"].replace("%2F", "/")


@pytest.mark.parametrize("url", CONSOLE_PAGES)
def test_a_user_who_is_not_staff_is_refused(client: Client, member: User, owner: Tenant, url: str):
    client.force_login(member)

    response = client.get(url)

    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


@pytest.mark.parametrize("url", CONSOLE_PAGES)
def test_staff_see_every_page(console: Client, owner: Tenant, redis_db: Redis, url: str):
    response = console.get(url)

    assert response.status_code == 200
    if "units" not in url and "live" not in url:  # fragments for htmx, not pages
        assert b"Tenants" in response.content  # the navigation


def test_a_user_who_is_not_staff_cannot_create_or_revoke_keys(
    client: Client, member: User, owner_key: IssuedKey
):
    client.force_login(member)

    created = client.post("/console/tenants/acme/keys/", {"name": "x", "default_class": "standard"})
    revoked = client.post(f"/console/tenants/acme/keys/{owner_key.api_key.pk}/revoke/")

    assert created.status_code == revoked.status_code == 302
    assert ApiKey.objects.filter(tenant__slug="acme").count() == 1
    owner_key.api_key.refresh_from_db()
    assert owner_key.api_key.revoked_at is None


def test_no_page_is_a_placeholder_any_more(console: Client, redis_db: Redis):
    for url in CONSOLE_PAGES:
        assert b"arrives with" not in console.get(url).content, url


def test_the_list_shows_each_tenant_with_its_quota_in_units_and_gib(
    console: Client, owner: Tenant, outsider: Tenant, owner_key: IssuedKey, teammate_key: IssuedKey
):
    api_key_revoke(api_key=api_key_create(tenant=owner, name="old").api_key)

    page = console.get("/console/tenants/").content.decode()

    assert page.index(">acme<") < page.index(">globex<")  # by slug
    assert "8 units = 2.0 GiB" in page
    assert "4 units = 1.0 GiB" in page
    assert '<td class="num">2 / 3</td>' in page  # live / all keys of acme
    assert '<td class="num">0 / 0</td>' in page


def test_the_list_filters_inactive_tenants(console: Client, owner: Tenant, outsider: Tenant):
    outsider.is_active = False
    outsider.save()

    page = console.get("/console/tenants/?show=active").content.decode()

    assert "acme" in page
    assert "globex" not in page


def test_an_unknown_tenant_is_404(console: Client):
    assert console.get("/console/tenants/nobody/").status_code == 404


def test_the_tenant_page_lists_keys_by_prefix_never_the_hash(console: Client, owner_key: IssuedKey):
    page = console.get("/console/tenants/acme/").content.decode()

    assert owner_key.api_key.prefix in page
    assert owner_key.api_key.hashed_key not in page
    assert owner_key.raw_key not in page
    assert "Latency percentiles" in page  # the usage charts


def test_the_tenant_page_shows_a_keys_own_models_and_limits(console: Client, owner: Tenant):
    from tenants.services import api_key_create

    api_key_create(tenant=owner, name="narrow", allowed_models=["llama"], rpm_limit=30)
    page = console.get("/console/tenants/acme/").content.decode()

    assert "models llama; 30 rpm" in page


def test_the_tenant_page_shows_its_quota_and_limits(console: Client, owner: Tenant):
    owner.allowed_classes = ["interactive", "standard"]
    owner.burst_units = 4
    owner.rpm_limit = 600
    owner.token_budget = 1_000_000
    owner.save()

    page = console.get("/console/tenants/acme/").content.decode()

    facts = page[page.index('<dl class="facts">') : page.index("</dl>")]
    for shown in (
        "8 units = 2.0 GiB",
        "4 units = 1.0 GiB",
        "interactive, standard",
        "<dd>600</dd>",
        "1000000 per month",
        "<dd>all</dd>",  # models
    ):
        assert shown in facts


def test_creating_a_key_shows_it_once(console: Client, owner: Tenant):
    response = console.post(
        "/console/tenants/acme/keys/", {"name": "web backend", "default_class": "interactive"}
    )

    assert response.status_code == 200
    assert response["Cache-Control"] == "no-store"
    raw = re.search(r'<code id="raw-key">(gs-[^<]+)</code>', response.content.decode())
    assert raw is not None
    key = ApiKey.objects.get(tenant=owner, name="web backend")
    assert key.default_class == "interactive"
    assert raw.group(1).startswith(key.prefix)
    assert raw.group(1) not in console.get("/console/tenants/acme/").content.decode()


def test_a_key_for_a_class_the_tenant_may_not_use_is_refused_next_to_the_field(
    console: Client, owner: Tenant
):
    owner.allowed_classes = ["standard"]
    owner.save()

    response = console.post(
        "/console/tenants/acme/keys/", {"name": "batch", "default_class": "offline"}
    )

    assert response.status_code == 400
    assert "may not use class" in response.content.decode()
    assert not ApiKey.objects.filter(name="batch").exists()


def test_revoking_a_key_needs_a_post(console: Client, owner_key: IssuedKey):
    url = f"/console/tenants/acme/keys/{owner_key.api_key.pk}/revoke/"

    assert console.get(url).status_code == 405
    response = console.post(url, follow=True)

    owner_key.api_key.refresh_from_db()
    assert owner_key.api_key.revoked_at is not None
    assert "revoked" in response.content.decode()


def test_revoking_needs_a_csrf_token(staff_user: User, owner_key: IssuedKey):
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff_user)

    response = client.post(f"/console/tenants/acme/keys/{owner_key.api_key.pk}/revoke/")

    assert response.status_code == 403
    owner_key.api_key.refresh_from_db()
    assert owner_key.api_key.revoked_at is None


def test_another_tenants_key_cannot_be_revoked_through_this_tenant(
    console: Client, owner: Tenant, outsider_key: IssuedKey
):
    response = console.post(f"/console/tenants/acme/keys/{outsider_key.api_key.pk}/revoke/")

    assert response.status_code == 404
    outsider_key.api_key.refresh_from_db()
    assert outsider_key.api_key.revoked_at is None


def _edit_data(**changes: object) -> dict[str, object]:
    data: dict[str, object] = {
        "name": "Acme",
        "is_active": "on",
        "weight": "2",
        "quota_units": "16",
        "burst_units": "4",
        "allowed_classes": ["interactive", "standard"],
        "allowed_models": "llama-3-8b, qwen2-7b",
        "rpm_limit": "600",
        "tpm_limit": "",
        "token_budget": "",
        "budget_period": "month",
    }
    data.update(changes)
    return data


def test_editing_saves_quota_weight_limits_and_classes(console: Client, owner: Tenant):
    response = console.post("/console/tenants/acme/edit/", _edit_data())

    assert response.status_code == 302
    owner.refresh_from_db()
    assert owner.weight == 2
    assert owner.quota_units == 16
    assert owner.burst_units == 4
    assert owner.allowed_classes == ["interactive", "standard"]
    assert owner.allowed_models == ["llama-3-8b", "qwen2-7b"]
    assert owner.rpm_limit == 600
    assert owner.tpm_limit is None


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"weight": "0"}, "Weight must be greater than 0"),
        ({"quota_units": "-3"}, "greater than or equal to 0"),
        ({"quota_units": "lots"}, "Enter a whole number"),
        ({"allowed_classes": []}, "at least one class"),
    ],
)
def test_a_bad_value_is_refused_with_the_error_next_to_its_field(
    console: Client, owner: Tenant, changes: dict[str, object], message: str
):
    response = console.post("/console/tenants/acme/edit/", _edit_data(**changes))

    assert response.status_code == 200
    page = response.content.decode()
    field = next(iter(changes))
    blocks = page.split('<div class="field')
    (own,) = [block for block in blocks if f'id="id_{field}' in block]
    assert own.startswith(" has-error")
    assert message in own
    owner.refresh_from_db()
    assert owner.quota_units == 8
    assert owner.weight == 1


def test_creating_a_tenant_goes_through_the_service(console: Client):
    response = console.post(
        "/console/tenants/new/",
        _edit_data(slug="initech", name="", allowed_models="", rpm_limit=""),
    )

    assert response.status_code == 302
    tenant = Tenant.objects.get(slug="initech")
    assert tenant.name == "initech"
    assert tenant.quota_units == 16


def test_a_taken_slug_is_refused(console: Client, owner: Tenant):
    response = console.post("/console/tenants/new/", _edit_data(slug="acme"))

    assert response.status_code == 200
    assert "already exists" in response.content.decode()


@pytest.mark.parametrize(
    ("query", "shown"),
    [
        ("quota_units=8", "8 units = 2.0 GiB"),
        ("burst_units=1", "1 unit = 0.25 GiB"),
        ("quota_units=-1", ""),
        ("quota_units=lots", ""),
        ("", ""),
    ],
)
def test_the_units_preview_names_the_memory_a_count_means(console: Client, query: str, shown: str):
    assert console.get(f"/console/units/?{query}").content.decode() == shown


def test_the_tenant_page_lists_its_adapters_held_against_its_quota(
    console: Client, owner: Tenant, outsider: Tenant
):
    for tenant, name in ((owner, "acme-support"), (outsider, "theirs")):
        Adapter.objects.create(
            name=name, tenant=tenant, base_model="llama", rank=8, size_bytes=1000, units=1,
            storage_prefix=f"adapters/{tenant.pk}/x",
        )  # fmt: skip
    page = console.get("/console/tenants/acme/").content.decode()
    adapters = re.search(r'<dd id="adapters">(.*?)</dd>', page)
    assert adapters is not None
    assert adapters.group(1) == (
        "<code>acme-support</code> of llama (1 unit = 0.25 GiB), held against the quota"
    )
