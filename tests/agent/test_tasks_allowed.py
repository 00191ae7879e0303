"""The agent's Celery worker runs its own tasks only (agent/tasks_allowed.py): a real
worker, built by Celery's own machinery as the agent configures it, consuming a node queue
on the real Redis; a task of the platform that is not the agent's is refused, logged and
never run, and the agent's own still run."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import signals
from celery.contrib.testing.worker import start_worker

from agent.tasks_allowed import AllowedTasksConsumer, allowed_only, run_allowed_tasks_only
from config.celery import app
from scheduler import worker_tasks
from workers.engine_tasks import AGENT_TASKS, check_unreachable

ran: list[str] = []


@app.task(name="tests.agent.not_the_agents")
def not_the_agents(marker: str) -> str:
    """A registered task of the platform's app that the agent must not run."""
    ran.append(marker)
    return marker


def test_only_the_allowed_strategies_are_kept() -> None:
    strategies = {"workers.engine_start": 1, "workers.dispatch": 2, "celery.chord_unlock": 3}
    assert allowed_only(strategies, {"workers.engine_start"}) == [
        "celery.chord_unlock", "workers.dispatch",
    ]  # fmt: skip
    assert strategies == {"workers.engine_start": 1}


def test_the_agents_tasks_are_those_sent_to_a_nodes_queue(monkeypatch) -> None:
    sent: list[tuple[str, str | None]] = []

    def record(name: str, *args: Any, queue: str | None = None, **kwargs: Any) -> None:
        sent.append((name, queue))

    monkeypatch.setattr(app, "send_task", record)
    worker_tasks.engine_start("e", "n1")
    worker_tasks.engine_stop("e", "n1")
    worker_tasks.engine_check_unreachable("e", "n1")
    worker_tasks.scale_engine(1, "e", "n1", "start", expires=60)
    worker_tasks.dispatch("pool")
    worker_tasks.process_batch(1)
    assert {name for name, queue in sent if queue == worker_tasks.node_queue("n1")} == AGENT_TASKS
    assert {name for name, _ in sent} == set(worker_tasks.NAMES)  # every task is sent above
    assert set(app.tasks) >= AGENT_TASKS


@pytest.fixture
def agent_worker(redis_db) -> Iterator[tuple[Any, str]]:
    """A worker configured as `python -m agent` configures it, on a node queue of its own."""
    saved = {name: app.conf[name] for name in ("worker_consumer", "worker_enable_remote_control")}
    queue = f"gpushare.node.test-{uuid.uuid4().hex[:8]}"
    run_allowed_tasks_only(app)
    try:
        with start_worker(
            app, pool="threads", concurrency=2, perform_ping_check=False, queues=[queue],
            loglevel="INFO", shutdown_timeout=20,
        ) as worker:  # fmt: skip
            yield worker, queue
    finally:
        app.conf.update(saved)


def wait_for(condition: Any, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.django_db(transaction=True)
def test_the_agent_refuses_any_task_but_its_own(agent_worker, redis_db, caplog) -> None:
    worker, queue = agent_worker
    assert isinstance(worker.consumer, AllowedTasksConsumer)
    assert set(worker.consumer.strategies) == AGENT_TASKS
    assert not app.conf.worker_enable_remote_control
    unknown: list[str] = []
    finished: list[tuple[str, Any]] = []

    def on_unknown(name: str, **_: Any) -> None:
        unknown.append(name)

    def on_postrun(task: Any, retval: Any, **_: Any) -> None:
        finished.append((task.name, retval))

    signals.task_unknown.connect(on_unknown, weak=False)
    signals.task_postrun.connect(on_postrun, weak=False)
    marker = uuid.uuid4().hex
    try:
        with caplog.at_level(logging.ERROR):
            # What anyone who writes to Redis can send: a registered task of the platform.
            app.send_task(not_the_agents.name, args=[marker], queue=queue)
            wait_for(lambda: unknown == [not_the_agents.name])
            # The agent's own still runs (no such engine: nothing to fail).
            app.send_task(check_unreachable.name, args=["no-such-engine"], queue=queue)
            wait_for(lambda: finished == [(check_unreachable.name, False)])
    finally:
        signals.task_unknown.disconnect(on_unknown)
        signals.task_postrun.disconnect(on_postrun)
    assert ran == []  # never run
    assert f"Received unregistered task of type '{not_the_agents.name}'" in caplog.text
    # Rejected for good, not put back on the queue for another try.
    assert redis_db.llen(queue) == 0
    assert redis_db.hlen("unacked") == 0
