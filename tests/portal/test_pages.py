"""The tenant portal's pages through Django's test client: each shows its tenant's own
things, and a person never sees another tenant's keys, usage, files, batches or requests
(one test per page)."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from audit.models import AuditEvent
from billing.models import MoneyBudget
from billing.services import budget_set, price_set
from scheduler.batches import files
from scheduler.batches import service as batches
from scheduler.models import Batch
from tenants.memberships import membership_grant
from tenants.models import ApiKey, MemberRole, Tenant, UsageRecord
from tenants.services import api_key_create

pytestmark = pytest.mark.django_db

LINE = b'{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {}}\n'


@dataclass
class Side:
    """One tenant's things, as the tests look for them in pages."""

    tenant: Tenant
    key: ApiKey
    request_id: str
    batch: Batch


def _side(tenant: Tenant, sent_tasks: object) -> Side:
    key = api_key_create(tenant=tenant, name=f"{tenant.slug}-ci").api_key
    UsageRecord.objects.create(
        request_id=f"req-{tenant.slug}", tenant=tenant, api_key=key, model=f"model-{tenant.slug}",
        request_class="standard", outcome="success", prompt_tokens=11, completion_tokens=7,
        end_user=f"user-of-{tenant.slug}", finished_at=timezone.now(),
    )  # fmt: skip
    stored = files.file_upload(
        tenant=tenant, purpose="batch", filename="in.jsonl", chunks=iter([LINE])
    )
    batch = batches.batch_create(
        tenant=tenant, api_key=None, input_file_id=stored.public_id,
        endpoint="/v1/completions", completion_window="24h",
    )  # fmt: skip
    return Side(tenant, key, f"req-{tenant.slug}", batch)


@pytest.fixture
def world(owner, outsider, sent_tasks, settings, tmp_path) -> tuple[Side, Side]:
    settings.GPUSHARE_BATCH_FILES_DIR = tmp_path / "files"
    return _side(owner, sent_tasks), _side(outsider, sent_tasks)


def _person(tenant: Tenant, name: str, role: str = MemberRole.MEMBER) -> Client:
    user = User.objects.create_user(name, f"{name}@example.com", "pw-portal-person")
    membership_grant(user=user, tenant=tenant, role=role)
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def alice(owner) -> Client:
    """A member of acme (the owner tenant), in no other."""
    return _person(owner, "alice")


def test_a_visitor_is_sent_to_sign_in(world):
    answer = Client().get("/portal/t/acme/keys/")
    assert answer.status_code == 302
    assert answer["Location"].startswith("/portal/login/?next=")


def test_the_home_page_sends_a_person_to_their_only_tenant(alice):
    answer = alice.get("/portal/")
    assert answer["Location"] == "/portal/t/acme/"


def test_limits_show_the_tenants_own_and_another_tenant_is_not_found(world, alice):
    page = alice.get("/portal/t/acme/").content.decode()
    assert "8 units" in page
    assert '<dd id="active-batches">1</dd>' in page  # its own batch, not globex's too
    assert alice.get("/portal/t/globex/").status_code == 404


def test_keys_show_only_the_tenants_keys_and_another_tenants_cannot_be_revoked(world, alice):
    mine, theirs = world
    page = alice.get("/portal/t/acme/keys/").content.decode()
    assert mine.key.prefix in page
    assert theirs.key.prefix not in page
    assert alice.get("/portal/t/globex/keys/").status_code == 404
    # Another tenant's key id under one's own tenant is not found, and stays live.
    assert alice.post(f"/portal/t/acme/keys/{theirs.key.pk}/revoke/").status_code == 404
    assert alice.post(f"/portal/t/globex/keys/{theirs.key.pk}/revoke/").status_code == 404
    theirs.key.refresh_from_db()
    assert theirs.key.revoked_at is None


def test_a_new_key_is_shown_once_with_its_limits_and_a_viewer_may_not_make_one(world, alice, owner):
    answer = alice.post(
        "/portal/t/acme/keys/new/",
        {"name": "ci", "default_class": "standard", "rpm_limit": "30", "tpm_limit": ""},
    )
    assert answer.status_code == 200
    key = ApiKey.objects.get(tenant=owner, name="ci")
    assert key.rpm_limit == 30
    assert key.tpm_limit is None
    assert key.prefix in answer.content.decode()
    viewer = _person(owner, "victor", MemberRole.VIEWER)
    assert viewer.post("/portal/t/acme/keys/new/", {"name": "x"}).status_code == 403


def test_a_key_made_with_a_budget_has_it_and_the_keys_page_shows_it(world, alice, owner):
    answer = alice.post(
        "/portal/t/acme/keys/new/",
        {"name": "capped", "default_class": "standard", "budget_amount": "5",
         "budget_period": "day", "budget_hard_stop": "on"},
    )  # fmt: skip
    assert answer.status_code == 200
    key = ApiKey.objects.get(tenant=owner, name="capped")
    budget = MoneyBudget.objects.get(api_key=key)
    assert (budget.tenant, budget.amount, budget.period, budget.hard_stop) == (
        owner, Decimal("5"), "day", True,
    )  # fmt: skip
    assert AuditEvent.objects.filter(action="budget.create", object_id=str(budget.pk)).exists()
    page = alice.get("/portal/t/acme/keys/").content.decode()
    assert "5.00 USD / day, stops" in page
    # A budget the billing refuses leaves no key behind.
    refused = alice.post(
        "/portal/t/acme/keys/new/",
        {"name": "refused", "default_class": "standard", "budget_amount": "0"},
    )
    assert refused.status_code == 400
    assert not ApiKey.objects.filter(tenant=owner, name="refused").exists()


def test_usage_shows_the_tenants_spend_and_budgets_only(world, alice, owner, outsider):
    price_set(model="model-acme", input_per_million=1_000_000, output_per_million=2_000_000)
    price_set(model="model-globex", input_per_million=9_000_000)
    budget_set(tenant=owner, amount="50", period="month")
    budget_set(tenant=outsider, amount="777", period="month")
    page = alice.get("/portal/t/acme/usage/").content.decode()
    # 11 prompt tokens at 1 and 7 completion tokens at 2 per token: 25.
    assert '<dd id="range-spend">25.0000 USD</dd>' in page
    assert '<dd id="today-spend">25.0000 USD</dd>' in page
    assert '<td class="num spend">25.0000</td>' in page  # by day, model, key and end user
    assert "25.0000 (50 %)" in page  # the tenant's monthly budget of 50
    assert "777" not in page
    assert "99.0000" not in page  # globex's 11 tokens at 9


def test_usage_shows_only_the_tenants_requests(world, alice):
    page = alice.get("/portal/t/acme/usage/").content.decode()
    # A line a series over the week, the days without requests at zero.
    assert '<polyline class="series" data-series="tokens per day"' in page
    assert "model-acme" in page
    assert "user-of-acme" in page
    assert "acme-ci" in page
    assert "model-globex" not in page
    assert "user-of-globex" not in page
    assert alice.get("/portal/t/globex/usage/").status_code == 404


def test_batches_and_their_files_are_only_the_tenants(world, alice):
    mine, theirs = world
    page = alice.get("/portal/t/acme/batches/").content.decode()
    assert mine.batch.public_id in page
    assert theirs.batch.public_id not in page
    assert alice.get(f"/portal/t/acme/batches/{mine.batch.public_id}/").status_code == 200
    assert alice.get(f"/portal/t/acme/batches/{theirs.batch.public_id}/").status_code == 404
    own_file = f"/portal/t/acme/batches/{mine.batch.public_id}/files/{mine.batch.input_file_id}/"
    assert b"".join(alice.get(own_file).streaming_content) == LINE
    # Their file, under one's own batch, or under theirs: not found either way.
    for path in (
        f"/portal/t/acme/batches/{mine.batch.public_id}/files/{theirs.batch.input_file_id}/",
        f"/portal/t/acme/batches/{theirs.batch.public_id}/files/{theirs.batch.input_file_id}/",
    ):
        assert alice.get(path).status_code == 404


def test_a_batch_made_in_the_portal_runs_through_the_batches_service(world, alice, owner):
    from django.core.files.uploadedfile import SimpleUploadedFile

    answer = alice.post(
        "/portal/t/acme/batches/new/",
        {"file": SimpleUploadedFile("b.jsonl", LINE), "endpoint": "/v1/completions"},
    )
    assert answer.status_code == 302
    created = Batch.objects.filter(tenant=owner).order_by("-pk").first()
    assert created is not None
    assert answer["Location"] == f"/portal/t/acme/batches/{created.public_id}/"


def test_find_a_request_finds_only_the_tenants(world, alice):
    mine, theirs = world
    found = alice.get(f"/portal/t/acme/requests/?id={mine.request_id}").content.decode()
    assert 'id="request-record"' in found
    missing = alice.get(f"/portal/t/acme/requests/?id={theirs.request_id}").content.decode()
    assert 'id="request-missing"' in missing
    assert "model-globex" not in missing


def test_people_show_the_tenants_members_and_only_owners_invite(world, alice, outsider, owner):
    _person(outsider, "bob")
    page = alice.get("/portal/t/acme/members/").content.decode()
    assert "alice@example.com" in page
    assert "bob@example.com" not in page
    assert alice.post("/portal/t/acme/members/invite/", {"email": "c@x.io"}).status_code == 403
    olivia = _person(owner, "olivia", MemberRole.OWNER)
    answer = olivia.post(
        "/portal/t/acme/members/invite/", {"email": "Carol@Example.com", "role": "viewer"}
    )
    assert "/portal/invitations/" in answer.content.decode()
    assert alice.get("/portal/t/globex/members/").status_code == 404
