import pytest
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from rest_framework.test import APIClient

from staff.tokens import admin_token_create, admin_token_revoke
from tenants.models import ApiKey, Tenant
from tests.conftest import bearer_client

pytestmark = pytest.mark.django_db


def test_staff_can_create_read_update_and_delete_a_tenant(staff_client):
    created = staff_client.post(
        "/api/v1/tenants/",
        {"slug": "acme", "quota_units": 8, "weight": 2, "allowed_classes": ["standard"]},
        format="json",
    )
    assert created.status_code == 201, created.content
    assert created.json()["quota"] == "8 units = 2.0 GiB"
    listed = staff_client.get("/api/v1/tenants/").json()
    assert [t["slug"] for t in listed["results"]] == ["acme"]
    patched = staff_client.patch("/api/v1/tenants/acme/", {"weight": 5}, format="json")
    assert patched.json()["weight"] == 5
    assert staff_client.delete("/api/v1/tenants/acme/").status_code == 204
    assert not Tenant.objects.exists()


def test_invalid_tenants_get_field_errors(staff_client):
    response = staff_client.post(
        "/api/v1/tenants/",
        {"slug": "acme", "weight": 0, "allowed_classes": ["urgent"]},
        format="json",
    )
    assert response.status_code == 400
    body = response.json()
    assert "Weight must be greater than 0" in body["weight"][0]
    assert "Unknown request class 'urgent'" in body["allowed_classes"][0]


def test_quota_can_be_read_and_changed(staff_client, owner):
    response = staff_client.patch(
        "/api/v1/tenants/acme/quota/", {"quota_units": 12, "burst_units": 4}, format="json"
    )
    assert response.status_code == 200
    assert response.json()["quota"] == "12 units = 3.0 GiB"
    owner.refresh_from_db()
    assert (owner.quota_units, owner.burst_units) == (12, 4)
    bad = staff_client.patch("/api/v1/tenants/acme/quota/", {"quota_units": -1}, format="json")
    assert bad.status_code == 400


def test_a_created_key_is_shown_once_and_then_only_its_prefix(staff_client, owner):
    created = staff_client.post("/api/v1/tenants/acme/keys/", {"name": "ci"}, format="json")
    assert created.status_code == 201
    raw = created.json()["key"]
    assert raw.startswith("gs-")
    listed = staff_client.get("/api/v1/tenants/acme/keys/").json()["results"]
    assert listed[0]["prefix"] == raw[:11]
    assert "key" not in listed[0]
    assert raw not in str(listed)


def test_staff_make_a_key_with_an_expiry_models_and_limits_of_its_own(staff_client, owner):
    body = {"name": "ci", "expires_at": "2099-01-01T00:00:00Z", "allowed_models": ["llama"],
            "rpm_limit": 60, "tpm_limit": 6000}  # fmt: skip
    created = staff_client.post("/api/v1/tenants/acme/keys/", body, format="json").json()
    assert created["expires_at"] == "2099-01-01T00:00:00Z"
    assert (created["allowed_models"], created["rpm_limit"], created["tpm_limit"]) == (
        ["llama"], 60, 6000,
    )  # fmt: skip
    past = {"name": "old", "expires_at": "2000-01-01T00:00:00Z"}
    refused = staff_client.post("/api/v1/tenants/acme/keys/", past, format="json")
    assert refused.status_code == 400
    assert "in the future" in str(refused.json())


def test_staff_revokes_a_key(staff_client, owner_key):
    url = f"/api/v1/tenants/acme/keys/{owner_key.api_key.pk}/revoke/"
    assert staff_client.post(url).json()["revoked"] is True
    assert ApiKey.objects.get(pk=owner_key.api_key.pk).is_revoked


def test_a_key_of_another_tenant_is_not_found_under_this_tenant(staff_client, owner, outsider_key):
    # Every lookup goes through the tenant: an id from elsewhere does not exist here.
    url = f"/api/v1/tenants/acme/keys/{outsider_key.api_key.pk}/"
    assert staff_client.get(url).status_code == 404
    assert staff_client.delete(url).status_code == 404
    assert not ApiKey.objects.get(pk=outsider_key.api_key.pk).is_revoked


def test_unknown_tenant_is_404(staff_client):
    assert staff_client.get("/api/v1/tenants/nobody/").status_code == 404


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", "/api/v1/tenants/acme/"),
        ("patch", "/api/v1/tenants/acme/quota/"),
        ("get", "/api/v1/tenants/acme/keys/"),
        ("post", "/api/v1/tenants/acme/keys/"),
        ("delete", "/api/v1/tenants/acme/"),
    ],
)
def test_a_tenant_key_cannot_read_or_change_anything_in_the_admin_api(
    method, path, owner, outsider_key
):
    client = bearer_client(outsider_key)
    response = getattr(client, method)(path, {"quota_units": 999}, format="json")
    assert response.status_code in (401, 403)
    owner.refresh_from_db()
    assert owner.quota_units == 8
    assert Tenant.objects.filter(slug="acme").exists()


def test_a_non_staff_user_is_refused(db, owner):
    from django.contrib.auth.models import User

    user = User.objects.create_user("tenant-user", password="pw")
    client = APIClient()
    client.force_authenticate(user)
    assert client.get("/api/v1/tenants/").status_code == 403


def test_the_schema_documents_the_admin_api(client):
    response = client.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    assert "/api/v1/tenants/{slug}/quota/" in paths
    assert "/api/v1/tenants/{slug}/keys/{key_id}/revoke/" in paths
    docs = client.get("/api/docs/")
    assert docs.status_code == 200
    assert b"swagger" in docs.content.lower()


def test_a_tenant_with_usage_history_is_kept_with_a_clear_409(staff_client, owner):
    from datetime import UTC, datetime

    from tenants.models import UsageRecord

    UsageRecord.objects.create(
        request_id="r1", tenant=owner, model="m", request_class="standard", outcome="success",
        finished_at=datetime(2026, 11, 30, tzinfo=UTC),
    )  # fmt: skip
    response = staff_client.delete("/api/v1/tenants/acme/")
    assert response.status_code == 409
    assert "deactivate it instead" in response.json()["detail"]
    assert Tenant.objects.filter(slug="acme").exists()


# --- roles ------------------------------------------------------------------------------------

ROLES = ("viewer", "operator", "admin")  # each holds what the one before it holds
# The lowest role that may send each method of each admin API route.
MINIMUM_ROLE = {
    ("tenant-list", "get"): "viewer",
    ("tenant-list", "post"): "admin",
    ("tenant-detail", "get"): "viewer",
    ("tenant-detail", "patch"): "operator",  # quotas and limits; other fields: admin (below)
    ("tenant-detail", "delete"): "admin",
    ("tenant-quota", "get"): "viewer",
    ("tenant-quota", "put"): "operator",
    ("tenant-quota", "patch"): "operator",
    ("tenant-keys", "get"): "viewer",
    ("tenant-keys", "post"): "admin",
    ("tenant-key-detail", "get"): "viewer",
    ("tenant-key-detail", "delete"): "admin",
    ("tenant-key-revoke", "post"): "admin",
    ("tenant-usage", "get"): "viewer",
    ("tenant-usage-csv", "get"): "viewer",
    ("tenant-spend", "get"): "viewer",
    ("tenant-budget", "get"): "viewer",
    ("tenant-budget", "put"): "operator",
    ("tenant-budget", "patch"): "operator",
    ("tenant-budget", "delete"): "operator",
    ("tenant-key-budget", "get"): "viewer",
    ("tenant-key-budget", "put"): "operator",
    ("tenant-key-budget", "patch"): "operator",
    ("tenant-key-budget", "delete"): "operator",
    ("price-list", "get"): "viewer",
    ("price-list", "post"): "admin",
    ("price-detail", "get"): "viewer",
    ("price-detail", "put"): "admin",
    ("price-detail", "delete"): "admin",
    ("audit", "get"): "viewer",
}
BODIES = {
    ("tenant-list", "post"): {"slug": "roles-new"},
    ("tenant-detail", "patch"): {"weight": 2},
    ("tenant-quota", "put"): {"quota_units": 4},
    ("tenant-quota", "patch"): {"quota_units": 4},
    ("tenant-keys", "post"): {"name": "k"},
    ("tenant-budget", "put"): {"amount": "5"},
    ("tenant-budget", "patch"): {"amount": "5"},
    ("tenant-key-budget", "put"): {"amount": "5"},
    ("tenant-key-budget", "patch"): {"amount": "5"},
    ("price-list", "post"): {"model": "m", "input_per_million": "1", "output_per_million": "2"},
    ("price-detail", "put"): {"input_per_million": "1", "output_per_million": "2"},
}


def admin_api_routes() -> list[tuple[str | None, str, URLPattern]]:
    """(name, method, pattern) of every route under /api/v1/, from the URL resolver."""
    found = []
    for top in get_resolver().url_patterns:
        if not (isinstance(top, URLResolver) and str(top.pattern) == "api/v1/"):
            continue
        for pattern in top.url_patterns:
            assert isinstance(pattern, URLPattern)
            view = pattern.callback.view_class  # type: ignore[attr-defined]
            for method in ("get", "post", "put", "patch", "delete"):
                if hasattr(view, method):
                    found.append((pattern.name, method, pattern))
    return found


def test_every_admin_api_route_and_method_has_a_role_in_the_table():
    assert sorted((n, m) for n, m, _ in admin_api_routes()) == sorted(MINIMUM_ROLE)


@pytest.mark.parametrize(("name", "method"), sorted(MINIMUM_ROLE))
@pytest.mark.parametrize("role", [None, *ROLES, "superuser"])
def test_a_role_reaches_the_admin_api_its_permissions_allow(
    name, method, role, staff_member, owner, owner_key
):
    client = APIClient()
    token = admin_token_create(user=staff_member(role)).raw_token
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    route = next(p for n, m, p in admin_api_routes() if (n, m) == (name, method))
    world = {"slug": owner.slug, "key_id": owner_key.api_key.pk, "model": "m"}
    url = reverse(name, kwargs={arg: world[arg] for arg in route.pattern.converters})
    response = getattr(client, method)(url, BODIES.get((name, method), {}), format="json")
    allowed = role == "superuser" or (
        role is not None and ROLES.index(role) >= ROLES.index(MINIMUM_ROLE[name, method])
    )
    if allowed:
        assert response.status_code not in (401, 403), (method, url, role, response.content)
        assert response.status_code < 500
    else:
        assert response.status_code == 403, (method, url, role)
        assert response["Content-Type"] == "application/json"
        assert "detail" in response.json()


def test_an_operator_changes_limits_but_a_tenants_fields_need_the_admin_role(staff_member, owner):
    client = APIClient()
    client.credentials(
        HTTP_AUTHORIZATION=f"Token {admin_token_create(user=staff_member('operator')).raw_token}"
    )
    limits = client.patch("/api/v1/tenants/acme/", {"rpm_limit": 60}, format="json")
    assert limits.status_code == 200
    for field, value in (("enabled_fields", ["prompt_logprobs"]),
                         ("allowed_classes", ["interactive"]), ("is_active", False)):  # fmt: skip
        refused = client.patch("/api/v1/tenants/acme/", {field: value}, format="json")
        assert refused.status_code == 403, field
        assert "staff.change_tenant_access" in refused.json()["detail"]
    owner.refresh_from_db()
    assert (owner.rpm_limit, owner.enabled_fields, owner.is_active) == (60, [], True)


# --- tokens -----------------------------------------------------------------------------------


@pytest.mark.parametrize("keyword", ["Bearer", "Token"])
def test_an_admin_token_opens_the_api_until_it_is_revoked(keyword, staff_user):
    issued = admin_token_create(user=staff_user, name="ci")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"{keyword} {issued.raw_token}")
    assert client.get("/api/v1/tenants/").status_code == 200
    issued.token.refresh_from_db()
    assert issued.token.last_used_at is not None
    admin_token_revoke(token=issued.token)
    refused = client.get("/api/v1/tenants/")
    assert refused.status_code == 401
    assert refused["WWW-Authenticate"] == "Bearer"


def test_an_unknown_token_or_a_tenant_key_does_not_open_the_admin_api(owner_key):
    for header in ("Bearer gsa-nothing", f"Bearer {owner_key.raw_key}", "Token", "Bearer a b"):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=header)
        assert client.get("/api/v1/tenants/").status_code == 401, header
