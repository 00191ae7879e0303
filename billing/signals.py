"""Saves that the web's cache of hard stops must see: they move billing's change mark
(`billing.stops.billing_changes`)."""

from __future__ import annotations

from typing import Any

from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from billing.models import MoneyBudget
from billing.stops import billing_changes


@receiver(post_save, sender=MoneyBudget)
@receiver(post_delete, sender=MoneyBudget)
def _budget_changed(**_: Any) -> None:
    billing_changes().bump()
