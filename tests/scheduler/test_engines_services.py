"""Registering engines: placement by units, refusals, dedicated quota, who may use which."""

import pytest

from capacity.units import GIB
from plumbing.errors import DomainError
from scheduler.models import Device, DeviceKind, Engine, EngineStatus
from scheduler.selectors import (
    device_get,
    device_room,
    engine_kv_budget,
    engine_ready_for_tenant,
    tenant_dedicated_units,
)
from scheduler.services import EngineConflict, NoRoom, engine_create
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db


def gpu(index: int, gib: int, node: str = "node1") -> Device:
    return Device.objects.create(
        node=node,
        kind=DeviceKind.GPU,
        index=index,
        uuid=f"GPU-{index}",
        name="NVIDIA A100-SXM4-80GB",
        memory_bytes=gib * GIB,
        capacity_units=gib * 4,
    )


def register(name: str, units: int, port: int, **extra) -> Engine:
    return engine_create(
        name=name,
        model_path=extra.pop("model_path", "/models/llama"),
        served_model_name=extra.pop("served_model_name", "llama"),
        footprint_units=units,
        port=port,
        **extra,
    )


def test_placement_puts_an_engine_on_the_first_gpu_with_room() -> None:
    gpu0, gpu1 = gpu(0, 8), gpu(1, 8)  # 32 units each
    assert register("a", 24, 8100).device == gpu0
    assert register("b", 16, 8101).device == gpu1  # 8 left on gpu0
    assert register("c", 8, 8102).device == gpu0
    assert device_room(device=gpu0, live_only=False).free_units == 0


def test_an_engine_that_fits_nowhere_is_refused_with_the_shortfall() -> None:
    gpu(0, 8)
    register("a", 24, 8100)
    with pytest.raises(
        NoRoom, match="the roomiest, node1/gpu0, has 8 of 32 units free and is short by 4 units"
    ):
        register("b", 12, 8101)
    assert not Engine.objects.filter(name="b").exists()


def test_a_pinned_device_without_room_is_refused() -> None:
    gpu(0, 8)
    gpu1 = gpu(1, 1)
    with pytest.raises(NoRoom, match="short by 4 units"):
        register("a", 8, 8100, device=gpu1)


def test_a_cpu_engine_takes_whole_gib() -> None:
    cpu = Device.objects.create(
        node="node1",
        kind=DeviceKind.CPU,
        index=0,
        name="CPU",
        memory_bytes=2 * GIB,
        capacity_units=8,
    )
    with pytest.raises(DomainError, match="multiple of 4 units"):
        register("a", 6, 8100, device=cpu)
    assert register("a", 4, 8100, device=cpu).device == cpu


def test_names_and_addresses_are_unique() -> None:
    gpu(0, 8)
    register("a", 4, 8100)
    with pytest.raises(EngineConflict, match="named 'a'"):
        register("a", 4, 8101)
    with pytest.raises(EngineConflict, match=r"127\.0\.0\.1:8100"):
        register("b", 4, 8100)


def test_engines_of_one_served_model_name_share_one_task() -> None:
    gpu(0, 8)
    assert register("gen", 4, 8100).task == "generate"
    with pytest.raises(EngineConflict, match="serves 'llama' to generate") as refused:
        register("emb", 4, 8101, task="embed")
    assert refused.value.param == "served_model_name"
    embed = register("emb", 4, 8101, task="embed", served_model_name="llama-embed")
    assert embed.task == "embed"
    with pytest.raises(DomainError, match="Unknown task"):
        register("odd", 4, 8102, task="classify", served_model_name="odd")


def test_dedicated_engines_count_against_the_tenant_quota() -> None:
    gpu(0, 80)
    acme = TenantFactory.create(slug="acme", quota_units=40)
    register("acme-1", 32, 8100, dedicated_tenant=acme)
    with pytest.raises(NoRoom, match="over quota by 24 units"):
        register("acme-2", 32, 8101, dedicated_tenant=acme)
    assert tenant_dedicated_units(tenant=acme) == 32


def test_a_dedicated_engine_serves_only_its_tenant() -> None:
    gpu(0, 80)
    acme = TenantFactory.create(slug="acme", quota_units=64)
    globex = TenantFactory.create(slug="globex")
    shared = register("shared", 16, 8100)
    own = register("acme-only", 16, 8101, dedicated_tenant=acme)
    Engine.objects.update(status=EngineStatus.READY)
    assert set(engine_ready_for_tenant(served_model_name="llama", tenant=acme)) == {shared, own}
    assert list(engine_ready_for_tenant(served_model_name="llama", tenant=globex)) == [shared]


def test_only_ready_engines_are_offered() -> None:
    gpu(0, 80)
    acme = TenantFactory.create(slug="acme")
    register("warming", 16, 8100)
    Engine.objects.update(status=EngineStatus.WARMING)
    assert not engine_ready_for_tenant(served_model_name="llama", tenant=acme).exists()


def test_a_device_is_found_by_its_key() -> None:
    gpu0 = gpu(0, 8)
    assert device_get(key="node1/gpu0", default_node="other") == gpu0
    assert device_get(key="gpu0", default_node="node1") == gpu0
    with pytest.raises(DomainError, match="gpus discover"):
        device_get(key="gpu7", default_node="node1")


def test_an_engine_kv_budget_is_in_exact_bytes(tmp_path) -> None:
    (tmp_path / "config.json").write_text(
        '{"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,'
        ' "hidden_size": 4096, "torch_dtype": "bfloat16"}'
    )
    gpu(0, 80)
    engine = register("llama", 160, 8100, model_path=str(tmp_path))
    assert engine_kv_budget(engine=engine).capacity_bytes is None  # never started
    Engine.objects.filter(pk=engine.pk).update(kv_capacity_tokens=2048 * 100, block_size=16)
    engine.refresh_from_db()
    budget = engine_kv_budget(engine=engine)
    assert budget.bytes_per_token == 128 * 1024
    assert budget.block_size == 16
    assert budget.capacity_bytes == 100 * 256 * 1024 * 1024
