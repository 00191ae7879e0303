"""The tasks the web, the feeder and the commands start by name (scheduler/worker_tasks.py)
exist in the worker processes under those names, and take the arguments they are sent."""

from __future__ import annotations

import inspect

from celery import current_app

from scheduler import worker_tasks


def test_every_task_started_by_name_is_registered_and_takes_what_it_is_sent(sent_tasks):
    worker_tasks.dispatch("demo")
    worker_tasks.process_batch(7, countdown=0.5)
    worker_tasks.engine_start("llama", "node1")
    worker_tasks.engine_stop("llama", "node1")
    worker_tasks.engine_check_unreachable("llama", "node1")
    worker_tasks.scale_engine(3, "llama", "node1", "start", expires=60.0)

    current_app.loader.import_default_modules()  # the worker's CELERY_IMPORTS
    assert {sent.name for sent in sent_tasks.calls} == set(worker_tasks.NAMES)
    for sent in sent_tasks.calls:
        task = current_app.tasks[sent.name]
        inspect.signature(task.run).bind(*sent.args)  # raises if the worker's task differs
        if sent.name not in (worker_tasks.DISPATCH, worker_tasks.PROCESS_BATCH):
            assert sent.queue == worker_tasks.node_queue("node1") == "gpushare.node.node1"
