"""The staff's permissions and the admin API's tokens."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Access(models.Model):
    """Holds the staff's permissions that no model's add/change/delete/view says: reading the
    console, running engines, changing a tenant's limits or its access, reading its data.
    No table: only its permissions are stored (staff/roles.py groups them into roles)."""

    class Meta:
        managed = False
        default_permissions = ()
        permissions = [
            ("view_platform", "Read the console and the admin API (no tenant's data)"),
            ("operate_engines", "Start, drain and stop engines; change pools and scaling"),
            ("cancel_batches", "Cancel a tenant's batch"),
            ("change_tenant_limits", "Change a tenant's quota, weight and limits"),
            (
                "change_tenant_access",
                "Create and delete tenants; change their classes, models, fields, cache group",
            ),
            ("manage_keys", "Create and revoke tenants' API keys"),
            ("read_tenant_data", "Read tenants' batch files and request bodies"),
            ("manage_staff", "Manage staff users, their roles and admin API tokens"),
        ]

    def __str__(self) -> str:
        return "staff access"


class AdminToken(models.Model):
    """A staff user's token for the admin API. Only its SHA-256 is stored.

    A token of the platform's own, like tenants' API keys (tenants.models.ApiKey), rather than
    django-rest-knox: knox stores digests too, but reads one header keyword (the admin API
    takes `Token` and `Bearer`), expires tokens by default and mints them through a login
    view, where these are minted by `manage.py staff token create` and shown once. A token is
    256 random bits, so a fast hash is enough: nobody can brute-force the preimage, and the
    lookup is one indexed equality on the digest.
    """

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="admin_tokens"
    )
    name = models.CharField(max_length=100)
    prefix = models.CharField(
        max_length=16, help_text="The token's first characters, to recognise it; not a secret."
    )
    hashed_key = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("user__username", "-created_at")
        verbose_name = "admin API token"

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name})"

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None
