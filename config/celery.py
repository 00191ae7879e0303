"""The Celery app. Settings come from Django settings prefixed `CELERY_`."""

import os
from typing import Any

from celery import Celery
from celery.signals import worker_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("gpushare")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_init.connect
def _trace_the_worker(**_: Any) -> None:
    """Tracing, where the OTEL_* settings ask for it (tracing.setup): before the worker
    runs a task (the engine agent has turned it on already, under its own name)."""
    from tracing.setup import configure

    configure("worker")
