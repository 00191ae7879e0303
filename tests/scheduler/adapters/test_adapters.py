"""Registering, finding and removing tenants' LoRA adapters: the files storage, the quota,
the scoping by tenant, and what an engine's adapter slots take of its KV budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import User

from capacity.units import UNIT_BYTES
from plumbing.errors import Conflict, DomainError, NotFound
from scheduler.adapters.selectors import adapter_base, adapter_list, tenant_adapter_units
from scheduler.adapters.services import AdapterInvalid, adapter_register, adapter_remove
from scheduler.adapters.storage import COMPLETE, local_dir, storage_delete
from scheduler.batches.storage import files_storage
from scheduler.models import Device, DeviceKind, Engine
from scheduler.pools.policies import (
    engine_kv_budget_bytes,
    fair_queue,
    model_kv_bytes_per_token,
    sync_tenant,
)
from scheduler.services import engine_create
from tenants.models import Tenant
from tests.factories import TenantFactory
from tests.support.adapters import write_adapter

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def folders(settings, tmp_path: Path) -> None:
    settings.GPUSHARE_BATCH_FILES_DIR = tmp_path / "files"
    settings.GPUSHARE_ADAPTER_DIR = tmp_path / "node-adapters"


@pytest.fixture
def engine() -> Engine:
    device = Device.objects.create(
        node="n1", kind=DeviceKind.CPU, index=0, name="cpu", memory_bytes=8 * 2**30,
        capacity_units=32,
    )  # fmt: skip
    return engine_create(
        name="tiny-lora", model_path=str(settings.GPUSHARE_DEMO_MODEL_DIR),
        served_model_name="tiny-lora", footprint_units=4, port=8100, device=device,
        max_loras=2, max_lora_rank=8,
    )  # fmt: skip


@pytest.fixture
def source(tmp_path: Path) -> Path:
    return write_adapter(tmp_path / "sources", "tiny-a")


def test_a_registered_adapter_is_its_tenants_only(engine, source) -> None:
    acme, other = TenantFactory.create(slug="acme"), TenantFactory.create(slug="other")
    adapter = adapter_register(
        tenant=acme, name="acme-support", base_model="tiny-lora", folder=source
    )
    assert (adapter.rank, adapter.units) == (8, 1)
    assert adapter.size_bytes == sum(p.stat().st_size for p in source.iterdir())
    assert adapter_base(tenant=acme, name="acme-support") == "tiny-lora"
    assert adapter_base(tenant=other, name="acme-support") is None
    assert [a.name for a in adapter_list(tenant=acme)] == ["acme-support"]
    assert list(adapter_list(tenant=other)) == []
    assert tenant_adapter_units(tenant=acme) == 1
    # Its files are in the files storage, and a node's copy is what was registered.
    copy = local_dir(adapter)
    assert (copy / COMPLETE).exists()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        assert (copy / name).read_bytes() == (source / name).read_bytes()
        assert files_storage().exists(f"{adapter.storage_prefix}/{name}")


def test_removing_an_adapter_deletes_its_files_and_frees_its_units(engine, source) -> None:
    acme = TenantFactory.create(slug="acme")
    adapter = adapter_register(tenant=acme, name="acme-a", base_model="tiny-lora", folder=source)
    copy = local_dir(adapter)
    adapter_remove(adapter=adapter)
    assert not files_storage().exists(f"{adapter.storage_prefix}/adapter_config.json")
    assert not copy.exists()
    assert tenant_adapter_units(tenant=acme) == 0
    assert adapter_base(tenant=acme, name="acme-a") is None


def test_an_adapter_must_fit_its_tenants_quota(engine, source) -> None:
    small = TenantFactory.create(slug="small", quota_units=2)
    adapter_register(tenant=small, name="s-1", base_model="tiny-lora", folder=source)
    adapter_register(tenant=small, name="s-2", base_model="tiny-lora", folder=source)
    with pytest.raises(DomainError, match="holds 2 of its 2 units") as refused:
        adapter_register(tenant=small, name="s-3", base_model="tiny-lora", folder=source)
    assert refused.value.code == "insufficient_quota"
    assert [a.name for a in adapter_list(tenant=small)] == ["s-1", "s-2"]
    assert len(files_storage().listdir(f"adapters/{small.pk}")[0]) == 2  # nothing of s-3


@pytest.mark.parametrize(
    ("name", "base", "error", "match"),
    [
        ("bad name!", "tiny-lora", DomainError, "letters, digits"),
        ("tiny-lora", "tiny-lora", Conflict, "served model's name"),
        ("x", "nothing", NotFound, "No engine serves the model 'nothing'"),
    ],
)
def test_a_registration_is_refused_with_the_reason(
    engine, source, name, base, error, match
) -> None:
    with pytest.raises(error, match=match):
        adapter_register(tenant=TenantFactory.create(), name=name, base_model=base, folder=source)


def test_a_name_is_unique_on_the_platform(engine, source) -> None:
    adapter_register(
        tenant=TenantFactory.create(), name="shared", base_model="tiny-lora", folder=source
    )
    with pytest.raises(Conflict, match="exists already"):
        adapter_register(
            tenant=TenantFactory.create(), name="shared", base_model="tiny-lora", folder=source
        )


def test_an_adapter_over_the_engines_rank_or_not_lora_is_refused(engine, source) -> None:
    config = json.loads((source / "adapter_config.json").read_text())
    (source / "adapter_config.json").write_text(json.dumps({**config, "r": 16}))
    with pytest.raises(AdapterInvalid, match="rank 16 is over engine 'tiny-lora's max_lora_rank 8"):
        adapter_register(
            tenant=TenantFactory.create(), name="a", base_model="tiny-lora", folder=source
        )
    (source / "adapter_config.json").write_text(json.dumps({**config, "peft_type": "IA3"}))
    with pytest.raises(AdapterInvalid, match="not a LoRA adapter"):
        adapter_register(
            tenant=TenantFactory.create(), name="a", base_model="tiny-lora", folder=source
        )


def test_an_engines_adapter_slots_come_out_of_its_kv_budget(engine) -> None:
    engine.kv_capacity_tokens = 2**22  # 4 GiB of the demo model's KV
    per_token = model_kv_bytes_per_token(engine.model_path)
    assert engine_kv_budget_bytes(engine) == 2**22 * per_token - UNIT_BYTES
    engine.max_loras = 0
    assert engine_kv_budget_bytes(engine) == 2**22 * per_token


def test_a_tenants_queue_quota_holds_its_adapters_units(engine, source, redis_db) -> None:
    acme: Tenant = TenantFactory.create(slug="acme", quota_units=8)
    adapter_register(tenant=acme, name="acme-q", base_model="tiny-lora", folder=source)
    queue = fair_queue()
    sync_tenant(acme, queue)
    quota = int(redis_db.hget(queue.keys.tenant_policy("acme"), "quota_bytes"))
    assert quota == 7 * UNIT_BYTES


def test_deleting_an_adapter_in_the_admin_removes_it_whole(engine, source, client) -> None:
    acme = TenantFactory.create(slug="acme")
    adapter = adapter_register(
        tenant=acme, name="acme-admin", base_model="tiny-lora", folder=source
    )
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    listing = client.get("/admin/scheduler/adapter/").content.decode()
    assert "acme-admin" in listing
    response = client.post(f"/admin/scheduler/adapter/{adapter.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert adapter_base(tenant=acme, name="acme-admin") is None
    assert not files_storage().exists(f"{adapter.storage_prefix}/adapter_config.json")


def test_removing_an_adapter_whose_files_are_gone_still_removes_it(engine, source) -> None:
    acme = TenantFactory.create(slug="acme")
    adapter = adapter_register(tenant=acme, name="acme-gone", base_model="tiny-lora", folder=source)
    storage_delete(adapter.storage_prefix)
    files_storage().delete(adapter.storage_prefix)  # the folder itself, on the disk
    adapter_remove(adapter=adapter)
    assert adapter_base(tenant=acme, name="acme-gone") is None
