"""Money over HTTP: prices (staff admins change them), spend (staff, any tenant; tenants, their
own through `GET /v1/spend`), JSON or CSV, and tenants' and keys' money budgets (operators).
Thin: billing's selectors compute, its services write."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from django.conf import settings
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api.renderers import CsvRenderer, wants_csv
from billing import selectors as billing
from billing import services
from billing.models import MoneyBudget, Price
from staff.roles import Perm
from tenants import reports, selectors
from tenants.auth import TenantApiView
from tenants.models import ApiKey, BudgetPeriod, Tenant


class PriceSerializer(serializers.Serializer[Any]):
    model = serializers.CharField(max_length=200, help_text="Served model name, or * for any.")
    input_per_million = serializers.DecimalField(max_digits=14, decimal_places=6, min_value=0)
    output_per_million = serializers.DecimalField(max_digits=14, decimal_places=6, min_value=0)
    unit_hour = serializers.DecimalField(
        max_digits=14,
        decimal_places=6,
        min_value=0,
        default=Decimal(0),
        help_text="Per 256 MiB unit of KV reservation held for an hour.",
    )
    effective_from = serializers.DateTimeField(
        required=False, help_text="Start of the hour it applies from (default: this hour)."
    )
    currency = serializers.SerializerMethodField()

    def get_currency(self, price: Price) -> str:
        return billing.currency()


class PriceListCreateApi(APIView):
    required_perms = {"POST": Perm.CHANGE_PRICES}

    @extend_schema(responses=PriceSerializer(many=True), operation_id="prices_list")
    def get(self, request: Request) -> Response:
        return Response(PriceSerializer(billing.price_list(), many=True).data)

    @extend_schema(request=PriceSerializer, responses={201: PriceSerializer})
    def post(self, request: Request) -> Response:
        payload = PriceSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        price = services.price_set(**payload.validated_data)
        return Response(PriceSerializer(price).data, status=status.HTTP_201_CREATED)


class PriceDetailApi(APIView):
    required_perms = {"PUT": Perm.CHANGE_PRICES, "DELETE": Perm.CHANGE_PRICES}

    @extend_schema(responses=PriceSerializer(many=True), description="Every version, newest first.")
    def get(self, request: Request, model: str) -> Response:
        billing.price_get(model=model)  # 404 without one
        return Response(PriceSerializer(billing.price_history(model=model), many=True).data)

    @extend_schema(request=PriceSerializer, responses=PriceSerializer)
    def put(self, request: Request, model: str) -> Response:
        # The model is the URL's; a body that is not an object is the serializer's 400.
        data = request.data
        payload = PriceSerializer(data={**data, "model": model} if isinstance(data, dict) else data)
        payload.is_valid(raise_exception=True)
        return Response(PriceSerializer(services.price_set(**payload.validated_data)).data)

    @extend_schema(responses={204: None})
    def delete(self, request: Request, model: str) -> Response:
        services.price_delete(model=model)
        return Response(status=status.HTTP_204_NO_CONTENT)


# --- spend --------------------------------------------------------------------------------


class SpendQuery(serializers.Serializer[Any]):
    since = serializers.DateTimeField(required=False, help_text="Start (ISO 8601, UTC if naive).")
    until = serializers.DateTimeField(required=False, help_text="End, exclusive; default now.")
    period = serializers.ChoiceField(
        choices=reports.PERIODS, required=False, help_text="Without since: the current one."
    )
    group_by = serializers.ChoiceField(choices=billing.GROUPINGS, required=False)
    key = serializers.IntegerField(required=False, help_text="Only this API key's spend.")


_SPEND_PARAMETERS = [
    OpenApiParameter("since", str, description="Start, ISO 8601."),
    OpenApiParameter("until", str, description="End (exclusive), ISO 8601; default now."),
    OpenApiParameter("period", str, enum=list(reports.PERIODS)),
    OpenApiParameter("group_by", str, enum=list(billing.GROUPINGS)),
    OpenApiParameter("format", str, enum=["json", "csv"]),
]


def _aware(moment: datetime | None) -> datetime | None:
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=UTC)


def spend_response(request: Request, tenant: Tenant, *, api_key: ApiKey | None = None) -> Response:
    """The tenant's spend as the query asks (its own key's only, with `api_key`), JSON or
    CSV; `key` is looked up through the tenant."""
    query = SpendQuery(data=request.query_params)
    query.is_valid(raise_exception=True)
    data = query.validated_data
    since, until = reports.report_range(
        since=_aware(data.get("since")), until=_aware(data.get("until")), period=data.get("period")
    )
    if api_key is None and data.get("key") is not None:
        api_key = selectors.api_key_get(tenant=tenant, key_id=data["key"])
    group_by = data.get("group_by")
    rows = billing.spend(tenant, since, until, group_by, api_key=api_key)
    if wants_csv(request):
        name = f"spend-{tenant.slug}-{since:%Y%m%dT%H%M}-{until:%Y%m%dT%H%M}.csv"
        return Response(
            billing.spend_csv(rows, group_by=group_by),
            headers={"Content-Disposition": f'attachment; filename="{name}"'},
        )
    total = (
        rows[0] if group_by is None else billing.spend_total(tenant, since, until, api_key=api_key)
    )
    body: dict[str, Any] = {
        "tenant": tenant.slug,
        "api_key": api_key.pk if api_key is not None else None,
        "since": since.isoformat(),
        "until": until.isoformat(),
        "currency": billing.currency(),
        "total": total.as_dict(),
    }
    if group_by:
        body["group_by"] = group_by
        body["groups"] = [r.as_dict() for r in rows]
    return Response(body)


class TenantSpendApi(APIView):
    """A tenant's spend (staff): `?format=csv` for CSV."""

    renderer_classes = [JSONRenderer, CsvRenderer]

    @extend_schema(parameters=_SPEND_PARAMETERS, responses=dict[str, Any])
    def get(self, request: Request, slug: str) -> Response:
        return spend_response(request, selectors.tenant_get(slug=slug))


class OwnSpendApi(TenantApiView):
    """`GET /v1/spend`: the calling key's tenant's spend, nobody else's (`?key=` one of its
    own keys)."""

    renderer_classes = [JSONRenderer, CsvRenderer]

    @extend_schema(parameters=_SPEND_PARAMETERS, responses=dict[str, Any])
    def get(self, request: Request) -> Response:
        tenant = self.principal.tenant
        query = SpendQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        data = query.validated_data
        since, until = reports.report_range(
            since=_aware(data.get("since")),
            until=_aware(data.get("until")),
            period=data.get("period"),
        )
        # A tenant's report reads the range's rows: how many one call may read is bounded.
        reports.check_report_size(
            tenant=tenant, since=since, until=until, max_rows=settings.GPUSHARE_USAGE_MAX_ROWS
        )
        return spend_response(request, tenant)


# --- budgets ------------------------------------------------------------------------------


class BudgetSerializer(serializers.Serializer[Any]):
    tenant = serializers.CharField(source="tenant.slug", read_only=True)
    api_key = serializers.IntegerField(source="api_key_id", read_only=True, allow_null=True)
    amount = serializers.DecimalField(max_digits=14, decimal_places=6, min_value=0)
    period = serializers.ChoiceField(choices=BudgetPeriod.choices, required=False)
    hard_stop = serializers.BooleanField(required=False)
    alert_emails = serializers.ListField(
        child=serializers.EmailField(), required=False, allow_empty=True
    )
    webhook_url = serializers.URLField(required=False, allow_blank=True, max_length=500)
    exhausted_until = serializers.DateTimeField(read_only=True, allow_null=True)
    currency = serializers.SerializerMethodField()

    def get_currency(self, budget: MoneyBudget) -> str:
        return billing.currency()


class _BudgetApi(APIView):
    required_perms = {
        "PUT": Perm.CHANGE_TENANT_LIMITS,
        "PATCH": Perm.CHANGE_TENANT_LIMITS,
        "DELETE": Perm.CHANGE_TENANT_LIMITS,
    }

    def _scope(self, slug: str, key_id: int | None) -> tuple[Tenant, ApiKey | None]:
        tenant = selectors.tenant_get(slug=slug)
        key = selectors.api_key_get(tenant=tenant, key_id=key_id) if key_id else None
        return tenant, key

    @extend_schema(responses=BudgetSerializer)
    def get(self, request: Request, slug: str, key_id: int | None = None) -> Response:
        tenant, key = self._scope(slug, key_id)
        return Response(BudgetSerializer(billing.budget_get(tenant=tenant, api_key=key)).data)

    @extend_schema(request=BudgetSerializer, responses=BudgetSerializer)
    def put(self, request: Request, slug: str, key_id: int | None = None) -> Response:
        return self._set(request, slug, key_id, partial=False)

    @extend_schema(request=BudgetSerializer, responses=BudgetSerializer)
    def patch(self, request: Request, slug: str, key_id: int | None = None) -> Response:
        return self._set(request, slug, key_id, partial=True)

    def _set(self, request: Request, slug: str, key_id: int | None, *, partial: bool) -> Response:
        tenant, key = self._scope(slug, key_id)
        payload = BudgetSerializer(data=request.data, partial=partial)
        payload.is_valid(raise_exception=True)
        budget = services.budget_set(tenant=tenant, api_key=key, **payload.validated_data)
        return Response(BudgetSerializer(budget).data)

    @extend_schema(responses={204: None})
    def delete(self, request: Request, slug: str, key_id: int | None = None) -> Response:
        tenant, key = self._scope(slug, key_id)
        services.budget_delete(budget=billing.budget_get(tenant=tenant, api_key=key))
        return Response(status=status.HTTP_204_NO_CONTENT)


class TenantBudgetApi(_BudgetApi):
    """The tenant's money budget (operators change it)."""


class KeyBudgetApi(_BudgetApi):
    """One of the tenant's keys' money budget."""
