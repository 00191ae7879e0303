"""The OpenAI Files and Batches API (thin views: services write, selectors read, both
through the caller's tenant)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.parsers import JSONParser
from rest_framework.request import Request
from rest_framework.response import Response

from api.files import FileListOutput
from api.pages import PageInput, page_body
from scheduler.batches import files
from scheduler.batches import objects as batch_objects
from scheduler.batches import selectors as batch_selectors
from scheduler.batches import service as batches
from tenants.auth import TenantApiView


class RequestCountsOutput(serializers.Serializer[Any]):
    total = serializers.IntegerField()
    completed = serializers.IntegerField()
    failed = serializers.IntegerField()


class BatchOutput(serializers.Serializer[Any]):
    """OpenAI's Batch (for the schema; the body is built by batches.batch_object)."""

    id = serializers.CharField()
    object = serializers.CharField()
    endpoint = serializers.CharField()
    # Named as OpenAI names it; DRF's metaclass takes the field out of the class, so the
    # serializer's own `errors` property is untouched.
    errors = serializers.JSONField(allow_null=True)  # type: ignore[assignment]
    input_file_id = serializers.CharField()
    completion_window = serializers.CharField()
    status = serializers.CharField()
    output_file_id = serializers.CharField(allow_null=True)
    error_file_id = serializers.CharField(allow_null=True)
    created_at = serializers.IntegerField()
    in_progress_at = serializers.IntegerField(allow_null=True)
    expires_at = serializers.IntegerField(allow_null=True)
    finalizing_at = serializers.IntegerField(allow_null=True)
    completed_at = serializers.IntegerField(allow_null=True)
    failed_at = serializers.IntegerField(allow_null=True)
    expired_at = serializers.IntegerField(allow_null=True)
    cancelling_at = serializers.IntegerField(allow_null=True)
    cancelled_at = serializers.IntegerField(allow_null=True)
    request_counts = RequestCountsOutput()
    metadata = serializers.JSONField(allow_null=True)


class BatchListOutput(FileListOutput):
    data = BatchOutput(many=True)  # type: ignore[assignment]


class BatchListCreateApi(TenantApiView):
    """`POST /v1/batches`, `GET /v1/batches` (newest first, `after` + `limit` cursor)."""

    parser_classes = [JSONParser]

    class CreateInput(serializers.Serializer[Any]):
        input_file_id = serializers.CharField()
        endpoint = serializers.CharField()
        completion_window = serializers.CharField()
        metadata = serializers.JSONField(required=False, allow_null=True)

    @extend_schema(
        operation_id="v1_batches_list", parameters=[PageInput], responses=BatchListOutput
    )
    def get(self, request: Request) -> Response:
        params = PageInput(data=request.query_params)
        params.is_valid(raise_exception=True)
        page = files.paginate(
            batch_selectors.batch_list(tenant=self.principal.tenant),
            after=params.validated_data.get("after") or None,
            limit=params.validated_data["limit"],
        )
        return Response(page_body(page, batch_objects.batch_object))

    @extend_schema(request=CreateInput, responses=BatchOutput)
    def post(self, request: Request) -> Response:
        data = self.CreateInput(data=request.data)
        data.is_valid(raise_exception=True)
        batch = batches.batch_create(
            tenant=self.principal.tenant, api_key=self.principal.api_key, **data.validated_data
        )
        created = batch_selectors.batch_get(tenant=self.principal.tenant, batch_id=batch.public_id)
        return Response(batch_objects.batch_object(created))


class BatchDetailApi(TenantApiView):
    @extend_schema(responses=BatchOutput)
    def get(self, request: Request, batch_id: str) -> Response:
        batch = batch_selectors.batch_get(tenant=self.principal.tenant, batch_id=batch_id)
        return Response(batch_objects.batch_object(batch))


class BatchCancelApi(TenantApiView):
    @extend_schema(request=None, responses=BatchOutput)
    def post(self, request: Request, batch_id: str) -> Response:
        batch = batch_selectors.batch_get(tenant=self.principal.tenant, batch_id=batch_id)
        return Response(batch_objects.batch_object(batches.batch_cancel(batch=batch)))
