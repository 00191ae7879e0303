"""Saves that periodic jobs must see: they bump the change marks those jobs skip on."""

from __future__ import annotations

from typing import Any

from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from scheduler.batches.feeder import batch_changes
from scheduler.models import Batch, Engine, PoolTargets
from scheduler.pools.policies import engine_changes


@receiver(post_save, sender=Engine)
@receiver(post_delete, sender=Engine)
@receiver(post_save, sender=PoolTargets)  # the seat bounds are part of an engine's policy
@receiver(post_delete, sender=PoolTargets)
def _engine_changed(**_: Any) -> None:
    engine_changes().bump()


@receiver(post_save, sender=Batch)
def _batch_changed(**_: Any) -> None:
    batch_changes().bump()
