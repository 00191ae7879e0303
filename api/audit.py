"""The audit log over HTTP (staff, read only): `GET /api/v1/audit/`, filtered, paginated JSON
or the whole filtered log as CSV (`?format=csv`)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api.renderers import CsvRenderer, wants_csv
from audit import selectors

# The most events one CSV export holds: a longer log is exported in ranges (since/until).
CSV_MAX_EVENTS = 100_000


class AuditQuery(serializers.Serializer[Any]):
    actor = serializers.CharField(required=False)
    action = serializers.CharField(required=False, help_text="A prefix: `tenant.` finds all.")
    object_type = serializers.CharField(required=False)
    object_id = serializers.CharField(required=False)
    since = serializers.DateTimeField(required=False)
    until = serializers.DateTimeField(required=False)


class AuditApi(APIView):
    renderer_classes = [JSONRenderer, CsvRenderer]

    @extend_schema(
        parameters=[
            OpenApiParameter("actor", str),
            OpenApiParameter("action", str),
            OpenApiParameter("object_type", str),
            OpenApiParameter("object_id", str),
            OpenApiParameter("since", str, description="ISO 8601"),
            OpenApiParameter("until", str, description="ISO 8601, exclusive"),
            OpenApiParameter("format", str, enum=["json", "csv"]),
        ],
        responses=dict[str, Any],
    )
    def get(self, request: Request) -> Response:
        query = AuditQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        events = selectors.audit_events(**query.validated_data)
        if wants_csv(request):
            return Response(
                selectors.events_csv(events[:CSV_MAX_EVENTS]),
                headers={"Content-Disposition": 'attachment; filename="audit.csv"'},
            )
        paginator = LimitOffsetPagination()
        page = paginator.paginate_queryset(events, request, view=self)
        return paginator.get_paginated_response([selectors.event_row(e) for e in page or []])
