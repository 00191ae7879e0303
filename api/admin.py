"""Admin REST API (staff only): tenants, their quotas and their API keys. Thin views.

Each view names the permission of each method it serves (`required_perms`, checked by
staff.access.RolePermission, DRF's default); reads it does not name need `Perm.VIEW`."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from capacity.units import format_units
from protocol.classes import REQUEST_CLASSES, RequestClass
from staff.access import require
from staff.roles import TENANT_LIMIT_FIELDS, Perm
from tenants import selectors, services
from tenants.auth import TenantApiView
from tenants.models import ApiKey, BudgetPeriod, Tenant


class TenantOutput(serializers.ModelSerializer[Tenant]):
    quota = serializers.SerializerMethodField()

    class Meta:
        model = Tenant
        fields = (
            "slug",
            "name",
            "is_active",
            "weight",
            "quota_units",
            "burst_units",
            "quota",
            "allowed_classes",
            "allowed_models",
            "rpm_limit",
            "tpm_limit",
            "token_budget",
            "budget_period",
            "cache_group",
            "enabled_fields",
            "created_at",
            "updated_at",
        )

    def get_quota(self, tenant: Tenant) -> str:
        return tenant.quota_display


class TenantInput(serializers.Serializer[Any]):
    slug = serializers.SlugField(max_length=64)
    name = serializers.CharField(max_length=200, required=False, allow_blank=True)
    is_active = serializers.BooleanField(required=False)
    weight = serializers.FloatField(required=False)
    quota_units = serializers.IntegerField(min_value=0, required=False)
    burst_units = serializers.IntegerField(min_value=0, required=False)
    allowed_classes = serializers.ListField(child=serializers.CharField(), required=False)
    allowed_models = serializers.ListField(child=serializers.CharField(), required=False)
    rpm_limit = serializers.IntegerField(min_value=1, required=False, allow_null=True)
    tpm_limit = serializers.IntegerField(min_value=1, required=False, allow_null=True)
    token_budget = serializers.IntegerField(min_value=0, required=False, allow_null=True)
    budget_period = serializers.ChoiceField(choices=BudgetPeriod.choices, required=False)
    cache_group = serializers.SlugField(max_length=64, required=False, allow_blank=True)
    enabled_fields = serializers.ListField(child=serializers.CharField(), required=False)


class TenantUpdateInput(TenantInput):
    slug = None  # type: ignore[assignment]  # a tenant's slug is its identity


class QuotaSerializer(serializers.Serializer[Any]):
    weight = serializers.FloatField(required=False)
    quota_units = serializers.IntegerField(min_value=0, required=False)
    burst_units = serializers.IntegerField(min_value=0, required=False)
    rpm_limit = serializers.IntegerField(min_value=1, required=False, allow_null=True)
    tpm_limit = serializers.IntegerField(min_value=1, required=False, allow_null=True)
    token_budget = serializers.IntegerField(min_value=0, required=False, allow_null=True)
    budget_period = serializers.ChoiceField(choices=BudgetPeriod.choices, required=False)
    quota = serializers.CharField(read_only=True, source="quota_display")
    burst = serializers.CharField(read_only=True, source="burst_display")


class ApiKeyOutput(serializers.ModelSerializer[ApiKey]):
    tenant: serializers.SlugRelatedField[Tenant] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )
    revoked = serializers.BooleanField(source="is_revoked")

    class Meta:
        model = ApiKey
        fields: tuple[str, ...] = (
            "id",
            "tenant",
            "name",
            "prefix",
            "default_class",
            "expires_at",
            "allowed_models",
            "rpm_limit",
            "tpm_limit",
            "created_at",
            "last_used_at",
            "revoked",
            "revoked_at",
        )


class IssuedKeyOutput(ApiKeyOutput):
    key = serializers.CharField(help_text="The full key. Shown once; store it now.")

    class Meta(ApiKeyOutput.Meta):
        fields = (*ApiKeyOutput.Meta.fields, "key")


class ApiKeyInput(serializers.Serializer[Any]):
    name = serializers.CharField(max_length=100)
    default_class = serializers.ChoiceField(
        choices=REQUEST_CLASSES, default=RequestClass.STANDARD.value
    )
    expires_at = serializers.DateTimeField(required=False, allow_null=True)
    allowed_models = serializers.ListField(
        child=serializers.CharField(), required=False, help_text="Within the tenant's; [] = its."
    )
    rpm_limit = serializers.IntegerField(required=False, allow_null=True, min_value=1)
    tpm_limit = serializers.IntegerField(required=False, allow_null=True, min_value=1)


def _paginated(request: Request, view: APIView, rows: Any, serializer: Any) -> Response:
    paginator = LimitOffsetPagination()
    page = paginator.paginate_queryset(rows, request, view=view)
    return paginator.get_paginated_response(serializer(page, many=True).data)


class TenantListCreateApi(APIView):
    required_perms = {"POST": Perm.CHANGE_TENANT_ACCESS}

    @extend_schema(responses=TenantOutput(many=True), operation_id="tenants_list")
    def get(self, request: Request) -> Response:
        return _paginated(request, self, selectors.tenant_list(), TenantOutput)

    @extend_schema(request=TenantInput, responses={201: TenantOutput})
    def post(self, request: Request) -> Response:
        payload = TenantInput(data=request.data)
        payload.is_valid(raise_exception=True)
        tenant = services.tenant_create(**payload.validated_data)
        return Response(TenantOutput(tenant).data, status=status.HTTP_201_CREATED)


class TenantDetailApi(APIView):
    required_perms = {"PATCH": Perm.CHANGE_TENANT_LIMITS, "DELETE": Perm.CHANGE_TENANT_ACCESS}

    @extend_schema(responses=TenantOutput)
    def get(self, request: Request, slug: str) -> Response:
        return Response(TenantOutput(selectors.tenant_get(slug=slug)).data)

    @extend_schema(request=TenantUpdateInput, responses=TenantOutput)
    def patch(self, request: Request, slug: str) -> Response:
        tenant = selectors.tenant_get(slug=slug)
        payload = TenantUpdateInput(data=request.data, partial=True)
        payload.is_valid(raise_exception=True)
        if set(payload.validated_data) - TENANT_LIMIT_FIELDS:
            require(request, Perm.CHANGE_TENANT_ACCESS)  # beyond quotas and limits
        tenant = services.tenant_update(tenant=tenant, **payload.validated_data)
        return Response(TenantOutput(tenant).data)

    @extend_schema(responses={204: None, 409: None})
    def delete(self, request: Request, slug: str) -> Response:
        services.tenant_delete(tenant=selectors.tenant_get(slug=slug))
        return Response(status=status.HTTP_204_NO_CONTENT)


class TenantQuotaApi(APIView):
    required_perms = {"PUT": Perm.CHANGE_TENANT_LIMITS, "PATCH": Perm.CHANGE_TENANT_LIMITS}

    @extend_schema(responses=QuotaSerializer)
    def get(self, request: Request, slug: str) -> Response:
        return Response(QuotaSerializer(selectors.tenant_get(slug=slug)).data)

    @extend_schema(request=QuotaSerializer, responses=QuotaSerializer)
    def put(self, request: Request, slug: str) -> Response:
        return self._change(request, slug, partial=False)

    @extend_schema(request=QuotaSerializer, responses=QuotaSerializer)
    def patch(self, request: Request, slug: str) -> Response:
        return self._change(request, slug, partial=True)

    def _change(self, request: Request, slug: str, *, partial: bool) -> Response:
        tenant = selectors.tenant_get(slug=slug)
        payload = QuotaSerializer(data=request.data, partial=partial)
        payload.is_valid(raise_exception=True)
        changes = {k: v for k, v in payload.validated_data.items() if k in TENANT_LIMIT_FIELDS}
        tenant = services.tenant_update(tenant=tenant, **changes)
        return Response(QuotaSerializer(tenant).data)


class ApiKeyListCreateApi(APIView):
    required_perms = {"POST": Perm.MANAGE_KEYS}

    @extend_schema(responses=ApiKeyOutput(many=True), operation_id="tenant_keys_list")
    def get(self, request: Request, slug: str) -> Response:
        tenant = selectors.tenant_get(slug=slug)
        return _paginated(request, self, selectors.api_key_list(tenant=tenant), ApiKeyOutput)

    @extend_schema(request=ApiKeyInput, responses={201: IssuedKeyOutput})
    def post(self, request: Request, slug: str) -> Response:
        tenant = selectors.tenant_get(slug=slug)
        payload = ApiKeyInput(data=request.data)
        payload.is_valid(raise_exception=True)
        issued = services.api_key_create(tenant=tenant, **payload.validated_data)
        body = {**ApiKeyOutput(issued.api_key).data, "key": issued.raw_key}
        return Response(body, status=status.HTTP_201_CREATED)


class ApiKeyDetailApi(APIView):
    required_perms = {"DELETE": Perm.MANAGE_KEYS}

    @extend_schema(responses=ApiKeyOutput)
    def get(self, request: Request, slug: str, key_id: int) -> Response:
        tenant = selectors.tenant_get(slug=slug)
        return Response(ApiKeyOutput(selectors.api_key_get(tenant=tenant, key_id=key_id)).data)

    @extend_schema(responses=ApiKeyOutput, description="Revokes the key; it stays listed.")
    def delete(self, request: Request, slug: str, key_id: int) -> Response:
        return _revoke(slug, key_id)


class ApiKeyRevokeApi(APIView):
    required_perms = {"POST": Perm.MANAGE_KEYS}

    @extend_schema(request=None, responses=ApiKeyOutput)
    def post(self, request: Request, slug: str, key_id: int) -> Response:
        return _revoke(slug, key_id)


def _revoke(slug: str, key_id: int) -> Response:
    tenant = selectors.tenant_get(slug=slug)
    api_key = services.api_key_revoke(api_key=selectors.api_key_get(tenant=tenant, key_id=key_id))
    return Response(ApiKeyOutput(api_key).data)


class WhoAmIOutput(serializers.Serializer[Any]):
    tenant = serializers.CharField()
    key = ApiKeyOutput()
    quota = QuotaSerializer()
    allowed_classes = serializers.ListField(child=serializers.CharField())
    allowed_models = serializers.ListField(child=serializers.CharField())


class WhoAmIApi(TenantApiView):
    """`GET /v1/me`: which tenant a key belongs to, and its quota. For tenants, not staff."""

    @extend_schema(responses=WhoAmIOutput)
    def get(self, request: Request) -> Response:
        tenant, api_key = self.principal.tenant, self.principal.api_key
        body = {
            "tenant": tenant.slug,
            "key": ApiKeyOutput(api_key).data,
            "quota": {**QuotaSerializer(tenant).data, "quota": format_units(tenant.quota_units)},
            "allowed_classes": tenant.allowed_classes,
            "allowed_models": tenant.allowed_models,
        }
        return Response(body)
