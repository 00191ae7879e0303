"""The agent runs its own tasks only: the engine starts, stops and checks and the scaler's
starts and drains, the tasks sent to a node's queue (`AGENT_TASKS`, workers/engine_tasks.py).

The agent's Celery worker imports every module of the platform's tasks (the Celery app
finds them all), and a worker runs any registered task a message names. Whoever can write
to the broker's Redis could otherwise put any task of the platform on a node's queue and
have it run in the process that starts engines, with that process's secrets and devices.
`AllowedTasksConsumer` keeps a strategy (Celery's handler of a task's messages) for the
allowed tasks alone, so a message for any other task takes Celery's own path for a task
the worker does not know: it is logged as an error ("Received unregistered task"),
rejected without being requeued, marked failed, and never run.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

from celery import Celery
from celery.worker.consumer import Consumer

from workers.engine_tasks import AGENT_TASKS

log = logging.getLogger(__name__)


def allowed_only(strategies: dict[str, Any], allowed: Collection[str]) -> list[str]:
    """Drops the strategies of the tasks not `allowed`; returns their names."""
    refused = sorted(name for name in strategies if name not in allowed)
    for name in refused:
        del strategies[name]
    return refused


class AllowedTasksConsumer(Consumer):
    """Celery's consumer, with strategies for the agent's own tasks only."""

    allowed_tasks: frozenset[str] = AGENT_TASKS
    strategies: dict[str, Any]  # Celery's: a task's name -> the handler of its messages

    def update_strategies(self) -> None:
        super().update_strategies()
        refused = allowed_only(self.strategies, self.allowed_tasks)
        log.info(
            "the agent runs only %s; any other task it receives is refused (%d known)",
            ", ".join(sorted(self.allowed_tasks)),
            len(refused),
        )


def run_allowed_tasks_only(app: Celery) -> None:
    """Makes `app`'s worker run only the agent's tasks, and take no remote-control
    commands (nothing of the platform sends the agent any; a broadcast through the broker
    could otherwise make it consume other queues or shut it down)."""
    app.conf.worker_consumer = f"{__name__}:{AllowedTasksConsumer.__name__}"
    app.conf.worker_enable_remote_control = False
