"""Fixtures shared by every suite: users, API clients, tenants and the real Redis."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import redis
from django.conf import settings
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from scheduler import worker_tasks
from staff.roles import Role, role_assign
from staff.tokens import admin_token_create
from tenants.models import Tenant
from tenants.services import IssuedKey, api_key_create
from tests.factories import TenantFactory
from tests.support.sent_tasks import SentTasks


@pytest.fixture(autouse=True)
def fresh_process_caches() -> None:
    """Each test starts with the request path's per-process caches empty: an entry a test
    left (a route to an engine whose row was rolled back) would otherwise outlive it."""
    from billing import stops
    from scheduler.online import admission as online
    from tenants import services
    from workers import dispatch

    for cache in (
        online._routes, online._synced_tenants, online._adapters, services._live_keys,
        dispatch._engines,
    ):  # fmt: skip
        cache.clear()
    stops.clear_cache()


@pytest.fixture
def staff_user(db: None) -> User:
    """A staff user in the admin role: it may do everything the console and admin API do
    (tests/console/test_roles.py holds what each role may)."""
    user = User.objects.create_user("operator", "op@example.com", "pw-operator", is_staff=True)
    role_assign(user=user, role=Role.ADMIN)
    return user


@pytest.fixture
def staff_client(staff_user: User) -> APIClient:
    client = APIClient()
    token = admin_token_create(user=staff_user).raw_token
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


@pytest.fixture
def staff_member(db: None) -> Callable[[str | None], User]:
    """A user per role name ("viewer", "operator", "admin"), "superuser", or None: staff in
    no role."""

    def make(role: str | None) -> User:
        name = f"staff-{role or 'norole'}"
        if role == "superuser":
            return User.objects.create_superuser(name, f"{name}@example.com", "pw")
        user = User.objects.create_user(name, f"{name}@example.com", "pw", is_staff=True)
        if role is not None:
            role_assign(user=user, role=Role(role))
        return user

    return make


@pytest.fixture
def owner(db: None) -> Tenant:
    """The tenant under test. `teammate` shares it; `outsider` is another tenant."""
    return TenantFactory.create(slug="acme", quota_units=8)


@pytest.fixture
def owner_key(owner: Tenant) -> IssuedKey:
    return api_key_create(tenant=owner, name="owner")


@pytest.fixture
def teammate_key(owner: Tenant) -> IssuedKey:
    return api_key_create(tenant=owner, name="teammate")


@pytest.fixture
def outsider(db: None) -> Tenant:
    return TenantFactory.create(slug="globex", quota_units=4)


@pytest.fixture
def outsider_key(outsider: Tenant) -> IssuedKey:
    return api_key_create(tenant=outsider, name="outsider")


def bearer_client(issued: IssuedKey) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.raw_key}")
    return client


@pytest.fixture
def redis_db() -> Iterator[redis.Redis]:
    """The real Redis at REDIS_URL, emptied before and after the test."""
    client = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def sent_tasks(monkeypatch: pytest.MonkeyPatch) -> SentTasks:
    """The worker tasks sent by name, recorded instead of reaching a broker."""
    sent = SentTasks()
    monkeypatch.setattr(worker_tasks, "current_app", sent)
    return sent
