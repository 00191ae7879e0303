import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from tenants.keys import hash_key
from tenants.models import ApiKey, Tenant

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_tenant_create_prints_the_tenant_and_its_new_key():
    output = run(
        "tenant",
        "create",
        "acme",
        "--weight",
        "2",
        "--quota-units",
        "8",
        "--burst-units",
        "4",
        "--classes",
        "interactive",
        "standard",
    )
    assert "Created tenant acme." in output
    assert "8 units = 2.0 GiB" in output
    key_line = next(line.strip() for line in output.splitlines() if line.strip().startswith("gs-"))
    assert ApiKey.objects.get(hashed_key=hash_key(key_line)).tenant.slug == "acme"
    tenant = Tenant.objects.get(slug="acme")
    assert (tenant.weight, tenant.burst_units, tenant.allowed_classes) == (
        2,
        4,
        ["interactive", "standard"],
    )


def test_tenant_create_json_is_readable_by_a_script():
    data = json.loads(run("tenant", "create", "acme", "--quota-units", "8", "--json"))
    assert data["slug"] == "acme"
    assert data["quota_units"] == 8
    assert data["api_key"]["key"].startswith("gs-")


def test_tenant_create_explains_what_is_wrong():
    with pytest.raises(CommandError, match="weight: Weight must be greater than 0"):
        run("tenant", "create", "acme", "--quota-units", "8", "--weight", "0")
    with pytest.raises(CommandError, match="Unknown request class 'batch'"):
        run("tenant", "create", "acme", "--quota-units", "8", "--classes", "batch")
    assert not Tenant.objects.exists()


def test_tenant_list_shows_people_a_table_and_scripts_json():
    run("tenant", "create", "acme", "--quota-units", "8", "--no-key")
    run("tenant", "create", "globex", "--quota-units", "2", "--no-key")
    table = run("tenant", "list")
    assert table.splitlines()[0].split()[:3] == ["SLUG", "ACTIVE", "WEIGHT"]
    assert "globex" in table
    assert "2 units = 0.50 GiB" in table
    data = json.loads(run("tenant", "list", "--json"))
    assert [t["slug"] for t in data] == ["acme", "globex"]


def test_tenant_update_changes_only_what_was_given():
    run("tenant", "create", "acme", "--quota-units", "8", "--rpm", "60", "--no-key")
    data = json.loads(
        run("tenant", "update", "acme", "--quota-units", "16", "--rpm", "0", "--json")
    )
    assert data["quota_units"] == 16
    assert data["rpm_limit"] is None
    assert data["weight"] == 1
    run("tenant", "update", "acme", "--deactivate")
    assert Tenant.objects.get(slug="acme").is_active is False
    with pytest.raises(CommandError, match="Nothing to change"):
        run("tenant", "update", "acme")
    with pytest.raises(CommandError, match="No tenant 'nobody'"):
        run("tenant", "update", "nobody", "--weight", "2")


def test_key_create_list_and_revoke():
    run(
        "tenant",
        "create",
        "acme",
        "--quota-units",
        "8",
        "--classes",
        "interactive",
        "standard",
        "--no-key",
    )
    created = json.loads(
        run("key", "create", "acme", "--name", "ci", "--class", "interactive", "--json")
    )
    assert created["key"].startswith("gs-")
    assert created["default_class"] == "interactive"
    listing = run("key", "list", "acme")
    assert "ci" in listing
    assert created["key"] not in listing
    revoked = run("key", "revoke", "acme", str(created["id"]))
    assert f"Revoked key {created['id']}" in revoked
    assert json.loads(run("key", "list", "acme", "--json"))[0]["revoked_at"] is not None


def test_key_create_with_an_expiry_models_and_limits_of_its_own():
    run("tenant", "create", "acme", "--quota-units", "8", "--no-key")
    created = json.loads(
        run("key", "create", "acme", "--expires", "2099-01-01T00:00", "--models", "llama",
            "--rpm", "60", "--tpm", "6000", "--json")
    )  # fmt: skip
    assert created["expires_at"] == "2099-01-01T00:00:00+00:00"
    assert (created["allowed_models"], created["rpm_limit"], created["tpm_limit"]) == (
        ["llama"], 60, 6000,
    )  # fmt: skip
    with pytest.raises(CommandError, match="in the future"):
        run("key", "create", "acme", "--expires", "2000-01-01")


def test_key_revoke_of_another_tenants_key_is_not_found():
    run("tenant", "create", "acme", "--quota-units", "8", "--no-key")
    other = json.loads(run("tenant", "create", "globex", "--quota-units", "8", "--json"))
    with pytest.raises(CommandError, match="No API key"):
        run("key", "revoke", "acme", str(other["api_key"]["id"]))
    assert not ApiKey.objects.get(pk=other["api_key"]["id"]).is_revoked


def test_an_operator_puts_tenants_in_one_prefix_cache_group_and_takes_one_out():
    run("tenant", "create", "acme", "--quota-units", "8", "--cache-group", "research", "--no-key")
    run("tenant", "create", "globex", "--quota-units", "8", "--no-key")
    run("tenant", "update", "globex", "--cache-group", "research")
    assert Tenant.objects.get(slug="globex").cache_group == "research"
    run("tenant", "update", "acme", "--cache-group", "")
    assert Tenant.objects.get(slug="acme").cache_group == ""
    with pytest.raises(CommandError, match="cache_group"):
        run("tenant", "update", "acme", "--cache-group", "not a slug")


def test_an_operator_enables_optional_request_fields_for_one_tenant():
    run("tenant", "create", "acme", "--quota-units", "8", "--no-key",
        "--enable-fields", "prompt_logprobs", "structured_outputs")  # fmt: skip
    assert Tenant.objects.get(slug="acme").enabled_fields == [
        "prompt_logprobs",
        "structured_outputs",
    ]
    run("tenant", "update", "acme", "--enable-fields")
    assert Tenant.objects.get(slug="acme").enabled_fields == []
    with pytest.raises(CommandError, match="Unknown field 'kv_transfer_params'"):
        run("tenant", "update", "acme", "--enable-fields", "kv_transfer_params")
