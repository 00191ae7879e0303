"""Celery tasks of the Batch API: the periodic feeder and the per-batch kick."""

from __future__ import annotations

from celery import shared_task

from scheduler.batches.feeder import batch_process, batches_tick_if_changed


@shared_task(name="workers.batch_tick")
def batch_tick() -> int | None:
    """Every few seconds (the ticker): validate new batches, top up running ones to their
    window, re-feed lines Redis lost, expire, finalize. Returns how many batches it looked
    at; None when no batch was active last time and none was saved since."""
    return batches_tick_if_changed()


@shared_task(name="workers.batch_process")
def process_batch(batch_pk: int) -> None:
    """The same for one batch, kicked when it is created, cancelled or a line finishes."""
    batch_process(batch_pk=batch_pk)
