"""The Celery app. Settings come from Django settings prefixed `CELERY_`."""

import os
from typing import Any

from celery import Celery, signals
from celery.signals import worker_init

from plumbing.json_logs import log_format

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


def _logging_as_the_settings_say(**_: Any) -> None:
    """Celery's own set-up is skipped (a receiver of `setup_logging` stands for it): the
    root logger keeps the settings' LOGGING, whose lines are JSON objects."""


def _no_banner(instance: Any, **_: Any) -> None:
    """A worker prints no banner (its settings and tasks, as text) in a JSON log."""
    instance.quiet = True


# GPUSHARE_LOG_FORMAT=json: a worker's and beat's lines are the settings' JSON lines, as every
# other process's (plumbing.json_logs). Plain keeps Celery's own format.
if log_format() == "json":
    signals.setup_logging.connect(_logging_as_the_settings_say, weak=False)
    signals.celeryd_init.connect(_no_banner, weak=False)
