from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.utils import timezone

from plumbing.errors import InvalidApiKey
from tenants import services
from tenants.keys import hash_key
from tenants.models import ApiKey, Tenant

pytestmark = pytest.mark.django_db


def test_a_new_tenant_gets_the_operators_default_classes_and_never_interactive_unasked(settings):
    tenant = services.tenant_create(slug="acme", quota_units=8, burst_units=4, weight=2)
    assert tenant.name == "acme"
    assert tenant.allowed_classes == ["standard", "offline"]
    assert tenant.allowed_models == []
    assert tenant.quota_display == "8 units = 2.0 GiB"
    granted = services.tenant_create(slug="initech", allowed_classes=["interactive", "standard"])
    assert granted.allowed_classes == ["interactive", "standard"]
    settings.GPUSHARE_DEFAULT_CLASSES = ["standard"]
    assert services.tenant_create(slug="globex").allowed_classes == ["standard"]
    assert Tenant(slug="hooli").allowed_classes == ["standard"]  # the admin's and the API's


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"weight": 0}, "weight", "Weight must be greater than 0"),
        ({"weight": -1.5}, "weight", "Weight must be greater than 0"),
        ({"quota_units": -1}, "quota_units", "greater than or equal to 0"),
        ({"burst_units": -3}, "burst_units", "greater than or equal to 0"),
        (
            {"allowed_classes": ["standard", "batch"]},
            "allowed_classes",
            "Unknown request class 'batch'",
        ),
        ({"allowed_classes": []}, "allowed_classes", "at least one class"),
        ({"allowed_models": "llama"}, "allowed_models", "list of names"),
        ({"slug": "not a slug"}, "slug", "valid"),
    ],
)
def test_it_rejects_invalid_tenants_with_a_clear_message(changes, field, message):
    fields = {"slug": "acme", "quota_units": 8, **changes}
    with pytest.raises(ValidationError) as caught:
        services.tenant_create(**fields)
    assert message in " ".join(caught.value.message_dict[field])
    assert not Tenant.objects.exists()


def test_it_rejects_a_duplicate_slug():
    services.tenant_create(slug="acme", quota_units=1)
    with pytest.raises(ValidationError) as caught:
        services.tenant_create(slug="acme", quota_units=1)
    assert "slug" in caught.value.message_dict


def test_update_validates_and_keeps_the_old_values_on_error():
    tenant = services.tenant_create(slug="acme", quota_units=8)
    with pytest.raises(ValidationError):
        services.tenant_update(tenant=tenant, weight=0)
    tenant.refresh_from_db()
    assert tenant.weight == 1.0
    services.tenant_update(tenant=tenant, quota_units=16, weight=3)
    tenant.refresh_from_db()
    assert (tenant.quota_units, tenant.weight) == (16, 3)


def test_update_refuses_fields_that_are_not_policy():
    tenant = services.tenant_create(slug="acme", quota_units=8)
    with pytest.raises(ValueError, match="slug"):
        services.tenant_update(tenant=tenant, slug="other")


def test_the_raw_key_never_reaches_the_database(owner, django_assert_num_queries):
    issued = services.api_key_create(tenant=owner, name="ci")
    assert issued.raw_key.startswith("gs-")
    assert len(issued.raw_key) > 40
    stored = ApiKey.objects.get(pk=issued.api_key.pk)
    assert stored.hashed_key == hash_key(issued.raw_key)
    assert issued.raw_key[:11] == stored.prefix
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM tenants_apikey")
        rows = cursor.fetchall()
    assert not any(issued.raw_key in str(value) for row in rows for value in row)


def test_a_key_authenticates_as_its_tenant_and_records_its_use(owner):
    issued = services.api_key_create(tenant=owner, name="ci")
    api_key = services.api_key_authenticate(raw_key=issued.raw_key)
    assert api_key.tenant == owner
    api_key.refresh_from_db()
    assert api_key.last_used_at is not None


@pytest.mark.parametrize("mangle", ["revoke", "unknown", "inactive"])
def test_revoked_unknown_and_inactive_keys_are_refused_alike(owner, mangle):
    issued = services.api_key_create(tenant=owner, name="ci")
    raw = issued.raw_key
    if mangle == "revoke":
        services.api_key_revoke(api_key=issued.api_key)
    elif mangle == "unknown":
        raw = raw[:-2] + ("AA" if raw[-2:] != "AA" else "BB")
    else:
        services.tenant_update(tenant=owner, is_active=False)
    with pytest.raises(InvalidApiKey, match="Incorrect API key"):
        services.api_key_authenticate(raw_key=raw)


def test_revoking_twice_keeps_the_first_time(owner):
    issued = services.api_key_create(tenant=owner, name="ci")
    first = services.api_key_revoke(api_key=issued.api_key).revoked_at
    again = services.api_key_revoke(api_key=issued.api_key).revoked_at
    assert first == again is not None


def test_a_key_cannot_default_to_a_class_its_tenant_may_not_use():
    tenant = services.tenant_create(slug="batchless", quota_units=1, allowed_classes=["standard"])
    with pytest.raises(ValidationError, match="may not use class 'offline'"):
        services.api_key_create(tenant=tenant, name="x", default_class="offline")
    with pytest.raises(ValidationError):
        services.api_key_create(tenant=tenant, name="x", default_class="urgent")


def test_a_key_defaults_to_the_first_allowed_class_when_standard_is_not_allowed():
    only_interactive = services.tenant_create(
        slug="chat-only", quota_units=1, allowed_classes=["interactive"]
    )
    assert services.api_key_create(tenant=only_interactive, name="k").api_key.default_class == (
        "interactive"
    )
    everything = services.tenant_create(slug="all-classes", quota_units=1)
    assert services.api_key_create(tenant=everything, name="k").api_key.default_class == "standard"


def test_a_key_stops_working_when_it_expires_even_while_cached(owner, monkeypatch):
    soon = timezone.now() + timedelta(seconds=60)
    issued = services.api_key_create(tenant=owner, name="ci", expires_at=soon)
    assert services.api_key_authenticate(raw_key=issued.raw_key) == issued.api_key
    monkeypatch.setattr(timezone, "now", lambda: soon + timedelta(seconds=1))
    with pytest.raises(InvalidApiKey) as caught:
        services.api_key_authenticate(raw_key=issued.raw_key)
    assert caught.value.code == "expired_api_key"


def test_a_key_is_refused_an_expiry_in_the_past_and_models_outside_its_tenants(owner):
    with pytest.raises(ValidationError, match="in the future"):
        services.api_key_create(
            tenant=owner, name="ci", expires_at=timezone.now() - timedelta(seconds=1)
        )
    services.tenant_update(tenant=owner, allowed_models=["llama"])
    with pytest.raises(ValidationError, match="may not use 'qwen'"):
        services.api_key_create(tenant=owner, name="ci", allowed_models=["qwen"])
    key = services.api_key_create(tenant=owner, name="ci", allowed_models=["llama"]).api_key
    assert key.allows_model("llama")
    assert not key.allows_model("qwen")
