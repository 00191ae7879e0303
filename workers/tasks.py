"""Celery tasks. Each takes ids, calls a service and returns nothing worth keeping."""

from celery import shared_task


@shared_task(name="workers.ping")
def ping() -> str:
    """A no-op a worker answers; `make run` and tests use it to see a worker is alive."""
    return "pong"
