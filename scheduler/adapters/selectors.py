"""Reads of adapters, scoped by tenant: a tenant's lookups never see another's adapter."""

from __future__ import annotations

from functools import cache

from django.db.models import QuerySet, Sum

from capacity.adapters import engine_adapter_units
from capacity.kvcost import read_model_config
from scheduler.adapters.models import Adapter
from scheduler.models import Engine
from tenants.models import Tenant


def adapter_for_tenant(*, tenant: Tenant, name: str) -> Adapter | None:
    """The tenant's adapter called `name`; None for any other name, another tenant's
    adapter's included (to this tenant it does not exist)."""
    return Adapter.objects.filter(tenant=tenant, name=name).first()


def adapter_list(*, tenant: Tenant | None = None) -> QuerySet[Adapter]:
    """The tenant's adapters; every tenant's where `tenant` is None (the staff's view)."""
    adapters = Adapter.objects.select_related("tenant")
    return adapters.filter(tenant=tenant) if tenant is not None else adapters


def adapter_get(*, name: str) -> Adapter | None:
    """The adapter of this name, whoever's: for the engines' side, which loads it by name."""
    return Adapter.objects.select_related("tenant").filter(name=name).first()


def tenant_adapter_units(*, tenant: Tenant, exclude: Adapter | None = None) -> int:
    """Units the tenant's adapters hold against its quota (every registered one: any may be
    loaded at any time)."""
    adapters = Adapter.objects.filter(tenant=tenant)
    if exclude is not None:
        adapters = adapters.exclude(pk=exclude.pk)
    return adapters.aggregate(total=Sum("units"))["total"] or 0


@cache
def _slot_units(model_path: str, max_loras: int, max_lora_rank: int) -> int:
    return engine_adapter_units(
        read_model_config(model_path), max_loras=max_loras, max_lora_rank=max_lora_rank
    )


def engine_adapter_slot_units(engine: Engine) -> int:
    """Units the engine's adapter slots hold of its footprint (0 where it serves none)."""
    if engine.max_loras <= 0:
        return 0
    return _slot_units(engine.model_path, engine.max_loras, engine.max_lora_rank)


def adapter_base(*, tenant: Tenant, name: str) -> str | None:
    """The base model of the tenant's adapter called `name`; None for any other name."""
    return (
        Adapter.objects.filter(tenant=tenant, name=name)
        .values_list("base_model", flat=True)
        .first()
    )
