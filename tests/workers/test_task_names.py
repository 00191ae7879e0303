"""The tasks the web, the feeder and the commands start by name (scheduler/worker_tasks.py)
exist in the worker processes under those names, and take the arguments they are sent."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from celery import current_app

from scheduler import worker_tasks


@pytest.fixture
def sent(monkeypatch) -> list[tuple[str, tuple[Any, ...], dict[str, Any]]]:
    calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    class Celery:
        def send_task(self, name: str, *, args: tuple[Any, ...], **options: Any) -> None:
            calls.append((name, args, options))

    monkeypatch.setattr(worker_tasks, "current_app", Celery())
    return calls


def test_every_task_started_by_name_is_registered_and_takes_what_it_is_sent(sent):
    worker_tasks.dispatch("demo")
    worker_tasks.process_batch(7, countdown=0.5)
    worker_tasks.engine_start("llama", "node1")
    worker_tasks.engine_stop("llama", "node1")
    worker_tasks.engine_check_unreachable("llama", "node1")
    worker_tasks.scale_engine(3, "llama", "node1", "start", expires=60.0)

    current_app.loader.import_default_modules()  # the worker's CELERY_IMPORTS
    assert {name for name, _, _ in sent} == set(worker_tasks.NAMES)
    for name, args, options in sent:
        task = current_app.tasks[name]
        inspect.signature(task.run).bind(*args)  # raises if the worker's task differs
        if name not in (worker_tasks.DISPATCH, worker_tasks.PROCESS_BATCH):
            assert options["queue"] == worker_tasks.node_queue("node1") == "gpushare.node.node1"
