"""Domain errors in their two HTTP shapes (plumbing/errors.py): DRF's for the admin API,
OpenAI's for the tenant API, with the status, code, parameter and headers each error says."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.http import Http404
from rest_framework import exceptions

from plumbing.errors import (
    DomainError,
    InvalidApiKey,
    NotFound,
    admin_exception_handler,
    openai_exception_handler,
)


def test_a_domain_error_in_openai_shape_keeps_its_status_code_param_and_headers():
    error = DomainError("Lower max_tokens.", param="max_tokens", headers={"Retry-After": "1"})

    response = openai_exception_handler(error, {})

    assert response is not None
    assert response.status_code == 400
    assert response.data == {
        "error": {
            "message": "Lower max_tokens.",
            "type": "invalid_request_error",
            "code": None,
            "param": "max_tokens",
        }
    }
    assert response["Retry-After"] == "1"


def test_drf_and_django_errors_become_openai_errors_with_the_first_field_named():
    nested = exceptions.ValidationError({"metadata": {"tag": ["Too long."]}})
    response = openai_exception_handler(nested, {})
    assert response is not None
    assert response.status_code == 400
    assert response.data["error"]["param"] == "metadata.tag"
    assert response.data["error"]["message"] == "Too long."

    missing = openai_exception_handler(Http404(), {})
    assert missing is not None
    assert (missing.status_code, missing.data["error"]["code"]) == (404, "not_found")

    unauthenticated = openai_exception_handler(exceptions.NotAuthenticated(), {})
    assert unauthenticated is not None
    assert unauthenticated.status_code == 401
    assert unauthenticated.data["error"]["type"] == "authentication_error"
    assert unauthenticated["WWW-Authenticate"] == 'Bearer realm="api"'

    invalid = openai_exception_handler(ValidationError({"name": ["Taken."]}), {})
    assert invalid is not None
    assert invalid.data["error"]["param"] == "name"


def test_an_unexpected_exception_is_not_turned_into_an_answer():
    assert openai_exception_handler(RuntimeError("bug"), {}) is None


def test_the_admin_shape_is_drfs_with_the_domain_code():
    response = admin_exception_handler(NotFound("No tenant 'x'."), {})
    assert response is not None
    assert (response.status_code, response.data) == (
        404,
        {"detail": "No tenant 'x'.", "code": "not_found"},
    )
    key = admin_exception_handler(InvalidApiKey("Bad key."), {})
    assert key is not None
    assert key.status_code == 401

    fields = admin_exception_handler(ValidationError({"weight": ["Must be at least 1."]}), {})
    assert fields is not None
    assert fields.status_code == 400
    assert fields.data == {"weight": ["Must be at least 1."]}
