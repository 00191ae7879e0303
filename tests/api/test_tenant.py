"""The tenant-facing side: a key authenticates as its tenant; a bad key gets OpenAI's 401."""

import pytest
from rest_framework.test import APIClient

from tenants.services import api_key_revoke
from tests.conftest import bearer_client

pytestmark = pytest.mark.django_db


def test_a_key_authenticates_as_its_own_tenant(owner_key, teammate_key, outsider_key):
    for issued, slug in ((owner_key, "acme"), (teammate_key, "acme"), (outsider_key, "globex")):
        body = bearer_client(issued).get("/v1/me").json()
        assert body["tenant"] == slug
        assert body["key"]["name"] == issued.api_key.name


def test_a_revoked_key_gets_an_openai_style_401(owner_key):
    api_key_revoke(api_key=owner_key.api_key)
    response = bearer_client(owner_key).get("/v1/me")
    assert response.status_code == 401
    error = response.json()["error"]
    assert error["type"] == "authentication_error"
    assert error["code"] == "invalid_api_key"
    assert "message" in error
    assert "param" in error


@pytest.mark.parametrize("header", [None, "Bearer gs-nope", "Basic abc", "Bearer"])
def test_missing_or_unknown_keys_get_an_openai_style_401(db, header):
    client = APIClient()
    if header:
        client.credentials(HTTP_AUTHORIZATION=header)
    response = client.get("/v1/me")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"
