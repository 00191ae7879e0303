"""Usage reports over HTTP: the admin API (staff, any tenant, JSON or CSV) and `GET /v1/usage`
(a tenant's own numbers, through its API key). Thin: tenants.reports computes."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.http import HttpResponse
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from tenants import reports, selectors
from tenants.auth import TenantApiView
from tenants.models import Tenant


class ReportQuery(serializers.Serializer[Any]):
    since = serializers.DateTimeField(required=False, help_text="Start (ISO 8601, UTC if naive).")
    until = serializers.DateTimeField(required=False, help_text="End, exclusive; default now.")
    period = serializers.ChoiceField(
        choices=reports.PERIODS,
        required=False,
        help_text="Without since: the current hour/day/month (default month).",
    )
    per = serializers.ChoiceField(
        choices=reports.PERIODS, required=False, help_text="Split the range into periods."
    )
    group_by = serializers.ChoiceField(
        choices=reports.GROUPINGS,
        required=False,
        help_text="Break usage down by the end users the requests named (their `user`).",
    )


_PARAMETERS = [
    OpenApiParameter("since", str, description="Start, ISO 8601."),
    OpenApiParameter("until", str, description="End (exclusive), ISO 8601; default now."),
    OpenApiParameter("period", str, enum=list(reports.PERIODS)),
    OpenApiParameter("per", str, enum=list(reports.PERIODS)),
    OpenApiParameter("group_by", str, enum=list(reports.GROUPINGS)),
]


def _aware(moment: datetime | None) -> datetime | None:
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=UTC)


def _reports(
    request: Request, tenant: Tenant, *, max_rows: int | None = None
) -> tuple[list[reports.UsageReport], dict[str, Any]]:
    """The reports asked for; `max_rows`: refuse a range of more ledger rows (BadPeriod)."""
    query = ReportQuery(data=request.query_params)
    query.is_valid(raise_exception=True)
    data = query.validated_data
    since, until = reports.report_range(
        since=_aware(data.get("since")), until=_aware(data.get("until")), period=data.get("period")
    )
    if max_rows is not None:
        reports.check_report_size(tenant=tenant, since=since, until=until, max_rows=max_rows)
    group_by = data.get("group_by")
    rows = reports.tenant_usage_reports(
        tenant=tenant, since=since, until=until, per=data.get("per"), group_by=group_by
    )
    return rows, {"since": since, "until": until, "per": data.get("per"), "group_by": group_by}


def _body(tenant: Tenant, rows: list[reports.UsageReport], asked: dict[str, Any]) -> dict[str, Any]:
    total = (
        rows[0]
        if len(rows) == 1
        else reports.tenant_usage_report(
            tenant=tenant, since=asked["since"], until=asked["until"], group_by=asked["group_by"]
        )
    )
    body: dict[str, Any] = {"total": total.as_dict()}
    if asked["per"]:
        body["per"] = asked["per"]
        body["periods"] = [r.as_dict() for r in rows]
    return body


class UsageReportApi(APIView):
    """A tenant's usage report (staff)."""

    @extend_schema(parameters=_PARAMETERS, responses=dict[str, Any])
    def get(self, request: Request, slug: str) -> Response:
        tenant = selectors.tenant_get(slug=slug)
        rows, asked = _reports(request, tenant)
        return Response(_body(tenant, rows, asked))


class UsageReportCsvApi(APIView):
    """The same report as a CSV download: one row per period (or one for the range)."""

    @extend_schema(parameters=_PARAMETERS, responses={(200, "text/csv"): str})
    def get(self, request: Request, slug: str) -> HttpResponse:
        tenant = selectors.tenant_get(slug=slug)
        rows, asked = _reports(request, tenant)
        response = HttpResponse(reports.reports_csv(rows), content_type="text/csv; charset=utf-8")
        name = f"usage-{tenant.slug}-{asked['since']:%Y%m%dT%H%M}-{asked['until']:%Y%m%dT%H%M}.csv"
        response["Content-Disposition"] = f'attachment; filename="{name}"'
        return response


class OwnUsageApi(TenantApiView):
    """`GET /v1/usage`: the calling key's tenant's usage and quota, nobody else's."""

    @extend_schema(parameters=_PARAMETERS, responses=dict[str, Any])
    def get(self, request: Request) -> Response:
        tenant = self.principal.tenant
        # A tenant's report reads the range's rows: how many one call may read is bounded.
        rows, asked = _reports(request, tenant, max_rows=settings.GPUSHARE_USAGE_MAX_ROWS)
        return Response(_body(tenant, rows, asked))
