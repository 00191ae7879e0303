"""A pool's name: the served model, and the tenant whose dedicated engines serve it."""

from __future__ import annotations

from scheduler.models import Engine


def pool_id(served_model_name: str, dedicated_tenant: str | None = None) -> str:
    # Redis key parts may not hold ':' (the fair queue's separator), and a pool's hash tag
    # `{p:<pool>}` not '{' or '}' (they would end it early); model names may.
    base = served_model_name
    for character in ": {}":
        base = base.replace(character, "_")
    return f"{base}@{dedicated_tenant}" if dedicated_tenant else base


def engine_pool(engine: Engine) -> str:
    tenant = engine.dedicated_tenant.slug if engine.dedicated_tenant else None
    return pool_id(engine.served_model_name, tenant)
