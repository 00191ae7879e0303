"""The OpenAI Files API: upload a batch's input, list, read and delete files (thin views:
services write, selectors read, both through the caller's tenant)."""

from __future__ import annotations

from typing import Any

from django.http import FileResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from api.pages import PageInput, page_body
from plumbing.errors import DomainError
from scheduler.batches import files
from tenants.auth import TenantApiView


class FileOutput(serializers.Serializer[Any]):
    """OpenAI's FileObject (for the schema; the body is built by files.file_object)."""

    id = serializers.CharField()
    object = serializers.CharField()
    bytes = serializers.IntegerField()
    created_at = serializers.IntegerField()
    filename = serializers.CharField()
    purpose = serializers.CharField()
    status = serializers.CharField()


class FileListOutput(serializers.Serializer[Any]):
    object = serializers.CharField()
    data = FileOutput(many=True)  # type: ignore[assignment]  # OpenAI's name; see `errors`
    has_more = serializers.BooleanField()
    first_id = serializers.CharField(allow_null=True)
    last_id = serializers.CharField(allow_null=True)


class FileDeletedOutput(serializers.Serializer[Any]):
    id = serializers.CharField()
    object = serializers.CharField()
    deleted = serializers.BooleanField()


class FileUploadInput(serializers.Serializer[Any]):
    file = serializers.FileField()
    purpose = serializers.ChoiceField(choices=["batch"])


class FileListCreateApi(TenantApiView):
    """`POST /v1/files` (multipart: file, purpose=batch), `GET /v1/files`."""

    parser_classes = [MultiPartParser]

    class ListInput(PageInput):
        purpose = serializers.CharField(required=False, allow_blank=True)

    @extend_schema(operation_id="v1_files_list", parameters=[ListInput], responses=FileListOutput)
    def get(self, request: Request) -> Response:
        params = self.ListInput(data=request.query_params)
        params.is_valid(raise_exception=True)
        queryset = files.file_list(
            tenant=self.principal.tenant, purpose=params.validated_data.get("purpose") or None
        )
        page = files.paginate(
            queryset,
            after=params.validated_data.get("after") or None,
            limit=params.validated_data["limit"],
        )
        return Response(page_body(page, files.file_object))

    @extend_schema(request=FileUploadInput, responses=FileOutput)
    def post(self, request: Request) -> Response:
        upload = request.FILES.get("file")
        if upload is None:
            raise DomainError("Send the file as the multipart field 'file'.", param="file")
        stored = files.file_upload(
            tenant=self.principal.tenant,
            purpose=str(request.data.get("purpose", "")),
            filename=upload.name or "",
            chunks=upload.chunks(files.COPY_CHUNK_BYTES),
        )
        return Response(files.file_object(stored))


class FileDetailApi(TenantApiView):
    @extend_schema(responses=FileOutput)
    def get(self, request: Request, file_id: str) -> Response:
        stored = files.file_get(tenant=self.principal.tenant, file_id=file_id)
        return Response(files.file_object(stored))

    @extend_schema(responses=FileDeletedOutput)
    def delete(self, request: Request, file_id: str) -> Response:
        stored = files.file_get(tenant=self.principal.tenant, file_id=file_id)
        files.file_delete(stored=stored)
        return Response({"id": file_id, "object": "file", "deleted": True})


class AnyAccept(BaseContentNegotiation):
    """File content is bytes whatever the client accepts (the openai client asks for
    `application/binary`); errors still render as JSON."""

    def select_parser(self, request: Request, parsers: Any) -> Any:
        return parsers[0] if parsers else None

    def select_renderer(self, request: Request, renderers: Any, format_suffix: Any = None) -> Any:
        return renderers[0], renderers[0].media_type


class FileContentApi(TenantApiView):
    content_negotiation_class = AnyAccept

    @extend_schema(responses={(200, "application/octet-stream"): OpenApiTypes.BINARY})
    def get(self, request: Request, file_id: str) -> FileResponse:
        stored = files.file_get(tenant=self.principal.tenant, file_id=file_id)
        try:
            return files.file_response(stored, "application/octet-stream")
        except OSError:
            raise files.NotFound(f"The content of {file_id} is gone.", param="id") from None
