"""Domain errors and the two places that turn them into HTTP responses.

Services raise `DomainError`s; views never build error responses by hand. The admin API answers
in DRF's shape (`{"detail": ...}` or field errors); the OpenAI-compatible API answers in
OpenAI's shape (`{"error": {"message", "type", "code", "param"}}`).
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from rest_framework import exceptions as drf_exceptions
from rest_framework import status
from rest_framework.response import Response
from rest_framework.serializers import as_serializer_error
from rest_framework.views import exception_handler as drf_exception_handler


class DomainError(Exception):
    http_status: int = status.HTTP_400_BAD_REQUEST
    error_type = "invalid_request_error"
    code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.headers = headers or {}


class NotFound(DomainError):
    http_status = status.HTTP_404_NOT_FOUND
    code = "not_found"


class Conflict(DomainError):
    http_status = status.HTTP_409_CONFLICT
    code = "conflict"


class InvalidApiKey(DomainError):
    http_status = status.HTTP_401_UNAUTHORIZED
    error_type = "authentication_error"
    code = "invalid_api_key"


class Forbidden(DomainError):
    http_status = status.HTTP_403_FORBIDDEN
    error_type = "permission_error"
    code = "forbidden"


def admin_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's handler, plus domain errors and Django validation errors."""
    if isinstance(exc, DjangoValidationError):
        exc = drf_exceptions.ValidationError(as_serializer_error(exc))
    if isinstance(exc, DomainError):
        return Response(
            {"detail": exc.message, "code": exc.code}, status=exc.http_status, headers=exc.headers
        )
    return drf_exception_handler(exc, context)


def openai_error_body(
    message: str, error_type: str, code: str | None, param: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "code": code, "param": param}}


def openai_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """Every error of the OpenAI API in its shape. Never a bare 500 for bad input."""
    if isinstance(exc, DomainError):
        body = openai_error_body(exc.message, exc.error_type, exc.code, exc.param)
        return Response(body, status=exc.http_status, headers=exc.headers)
    if isinstance(exc, DjangoValidationError):
        exc = drf_exceptions.ValidationError(as_serializer_error(exc))
    if isinstance(exc, Http404):
        exc = drf_exceptions.NotFound()
    if isinstance(exc, drf_exceptions.APIException):
        return _openai_from_drf(exc)
    return None


def _openai_from_drf(exc: drf_exceptions.APIException) -> Response:
    param, message = _first_error(exc.detail)
    if isinstance(exc, drf_exceptions.NotAuthenticated | drf_exceptions.AuthenticationFailed):
        status_code, error_type, code = 401, "authentication_error", "invalid_api_key"
    elif isinstance(exc, drf_exceptions.PermissionDenied):
        status_code, error_type, code = 403, "permission_error", "forbidden"
    elif isinstance(exc, drf_exceptions.NotFound):
        status_code, error_type, code = 404, "invalid_request_error", "not_found"
    elif isinstance(exc, drf_exceptions.ParseError):
        status_code, error_type, code = 400, "invalid_request_error", "invalid_json"
    else:
        status_code, error_type, code = exc.status_code, "invalid_request_error", None
    headers = {}
    if status_code == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="api"'
    return Response(
        openai_error_body(message, error_type, code, param), status=status_code, headers=headers
    )


def _first_error(detail: Any, param: str | None = None) -> tuple[str | None, str]:
    """The first message in DRF's nested error detail, with the dotted field it belongs to."""
    if isinstance(detail, dict):
        for key, value in detail.items():
            field = None if key == "non_field_errors" else key
            dotted = f"{param}.{field}" if param and field else (field or param)
            return _first_error(value, dotted)
    if isinstance(detail, list) and detail:
        return _first_error(detail[0], param)
    return param, str(detail)
