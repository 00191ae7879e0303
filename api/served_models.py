"""`/v1/models`: the models a tenant's key may use, served by ready engines (a DRF view)."""

from __future__ import annotations

import time
from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from scheduler.adapters.selectors import adapter_list
from scheduler.models import EngineStatus
from scheduler.online import admission as online
from scheduler.selectors import engine_list
from tenants.auth import TenantApiView


class ModelOutput(serializers.Serializer[Any]):
    id = serializers.CharField()
    object = serializers.CharField(default="model")
    created = serializers.IntegerField()
    owned_by = serializers.CharField()


def _visible_models(request: Request, view: TenantApiView) -> list[dict[str, Any]]:
    tenant = view.principal.tenant
    engines = engine_list(status=EngineStatus.READY).filter(
        dedicated_tenant__isnull=True
    ) | engine_list(status=EngineStatus.READY).filter(dedicated_tenant=tenant)
    names: dict[str, int] = {}
    for engine in engines:
        started = int(engine.started_at.timestamp()) if engine.started_at else int(time.time())
        if view.principal.api_key.allows_model(engine.served_model_name):
            names.setdefault(engine.served_model_name, started)
    owners = dict.fromkeys(names, "gpushare")
    # The tenant's own adapters of a model it sees (no other tenant's: to it they do not exist).
    for adapter in adapter_list(tenant=tenant).filter(base_model__in=list(names)):
        names[adapter.name] = int(adapter.created_at.timestamp())
        owners[adapter.name] = tenant.slug
    return [
        {"id": name, "object": "model", "created": created, "owned_by": owners[name]}
        for name, created in sorted(names.items())
    ]


class ModelListApi(TenantApiView):
    """`GET /v1/models`: the models this tenant may use that have a ready engine, and its
    own LoRA adapters of them."""

    @extend_schema(responses=ModelOutput(many=True))
    def get(self, request: Request) -> Response:
        return Response({"object": "list", "data": _visible_models(request, self)})


class ModelDetailApi(TenantApiView):
    @extend_schema(responses=ModelOutput)
    def get(self, request: Request, model: str) -> Response:
        for entry in _visible_models(request, self):
            if entry["id"] == model:
                return Response(entry)
        raise online.ModelNotFound(f"The model '{model}' does not exist.", param="model")
