"""Saves that the web's caches of keys and tenants must see: they move the tenants' change
mark (`tenants.services.tenant_changes`)."""

from __future__ import annotations

from typing import Any

from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from tenants.models import ApiKey, Tenant
from tenants.services import tenant_changes


@receiver(post_save, sender=Tenant)
@receiver(post_delete, sender=Tenant)
@receiver(post_save, sender=ApiKey)
@receiver(post_delete, sender=ApiKey)
def _tenant_or_key_changed(**_: Any) -> None:
    tenant_changes().bump()
