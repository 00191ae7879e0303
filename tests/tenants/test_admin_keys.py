"""A key made in the Django admin: shown once on the page, never carried in a cookie."""

from __future__ import annotations

import re

from django.contrib.auth.models import User
from django.test import Client

from tenants.keys import hash_key
from tenants.models import ApiKey, Tenant


def test_a_key_made_in_the_admin_is_shown_once_and_never_put_in_a_cookie(
    client: Client, owner: Tenant
) -> None:
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw-root"))
    form = {"tenant": owner.pk, "name": "ci", "default_class": "standard"}
    saved = client.post("/admin/tenants/apikey/add/", form)
    assert saved.status_code == 302
    # What the browser holds meanwhile: no message cookie, which would carry the key
    # (signed, maybe compressed, never encrypted).
    assert set(saved.cookies) <= {"sessionid", "csrftoken"}
    carried = [c.value for c in saved.cookies.values()]
    response = client.get(saved["Location"])
    shown = re.findall(r"gs-[A-Za-z0-9_-]{20,}", response.content.decode())
    assert len(shown) == 1
    assert hash_key(shown[0]) == ApiKey.objects.get(name="ci").hashed_key
    assert not any(shown[0] in value for value in carried)
    again = client.get("/admin/tenants/apikey/")  # shown once
    assert shown[0] not in again.content.decode()
