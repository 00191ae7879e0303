"""Fixtures of the console's tests: a staff user's client, and one GPU engine the fair queue
knows (`llama-a` serving `llama`, tenant `acme` with a policy)."""

from __future__ import annotations

import pytest
import redis
from django.contrib.auth.models import User
from django.test import Client

from capacity.units import GIB
from fairqueue import TenantPolicy
from scheduler.models import Device, DeviceKind, Engine, EngineStatus
from scheduler.pools.policies import fair_queue


@pytest.fixture
def console(client: Client, staff_user: User) -> Client:
    client.force_login(staff_user)
    return client


@pytest.fixture
def engine(redis_db: redis.Redis) -> Engine:
    device = Device.objects.create(
        node="node1", kind=DeviceKind.GPU, index=0, uuid="GPU-0", name="NVIDIA L4",
        memory_bytes=24 * GIB, capacity_units=96,
    )  # fmt: skip
    fair_queue().set_tenant_policy("acme", TenantPolicy(weight=1.0, quota_bytes=16 * GIB))
    return Engine.objects.create(
        name="llama-a", model_path="/models/llama", served_model_name="llama", device=device,
        footprint_units=40, port=8101, status=EngineStatus.READY, kv_capacity_tokens=50_000,
    )  # fmt: skip
