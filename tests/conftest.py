"""Fixtures shared by every suite: users, API clients, tenants and the real Redis."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from django.conf import settings
from django.contrib.auth.models import User
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from scheduler import worker_tasks
from tenants.models import Tenant
from tenants.services import IssuedKey, api_key_create
from tests.factories import TenantFactory
from tests.support.sent_tasks import SentTasks


@pytest.fixture(autouse=True)
def fresh_process_caches() -> None:
    """Each test starts with the request path's per-process caches empty: an entry a test
    left (a route to an engine whose row was rolled back) would otherwise outlive it."""
    from scheduler.online import admission as online
    from tenants import services
    from workers import dispatch

    for cache in (online._routes, online._synced_tenants, services._live_keys, dispatch._engines):
        cache.clear()


@pytest.fixture
def staff_user(db: None) -> User:
    return User.objects.create_user("operator", "op@example.com", "pw-operator", is_staff=True)


@pytest.fixture
def staff_client(staff_user: User) -> APIClient:
    client = APIClient()
    token = Token.objects.create(user=staff_user)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


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
