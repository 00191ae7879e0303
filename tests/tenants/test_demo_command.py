import json
from io import StringIO

import pytest
from django.core.management import call_command

from tenants.services import api_key_authenticate

pytestmark = pytest.mark.django_db


def demo(settings, tmp_path) -> dict:
    settings.VAR_DIR = tmp_path
    out = StringIO()
    call_command("demo", "--json", stdout=out)
    return json.loads(out.getvalue())


def test_demo_makes_an_admin_and_a_demo_key_that_authenticates(settings, tmp_path):
    from django.contrib.auth.models import User

    first = demo(settings, tmp_path)
    assert api_key_authenticate(raw_key=first["demo_api_key"]).tenant.slug == "demo"
    assert User.objects.get(username="admin").check_password(first["admin_password"])
    assert (tmp_path / "demo-credentials.json").stat().st_mode & 0o077 == 0


def test_demo_is_idempotent_and_keeps_the_same_credentials(settings, tmp_path):
    first = demo(settings, tmp_path)
    again = demo(settings, tmp_path)
    assert again == first


def test_demos_admin_token_opens_the_admin_api_and_is_stored_as_a_digest(settings, tmp_path):
    from rest_framework.test import APIClient

    from staff.models import AdminToken

    first = demo(settings, tmp_path)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {first['admin_api_token']}")
    assert client.get("/api/v1/tenants/").json()["results"][0]["slug"] == "demo"
    assert not AdminToken.objects.filter(hashed_key=first["admin_api_token"]).exists()
    assert AdminToken.objects.count() == 1
