"""Worker tasks sent by name (scheduler.worker_tasks), recorded in place of a broker; a task
marked to run at once runs in the test's process, as its worker or engine agent would."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class SentTask:
    name: str
    args: tuple[Any, ...]
    options: dict[str, Any]

    @property
    def queue(self) -> str | None:
        return self.options.get("queue")


@dataclass
class SentTasks:
    """Stands in for the Celery app that `scheduler.worker_tasks` sends through."""

    calls: list[SentTask] = field(default_factory=list)
    _run: dict[str, tuple[Callable[..., Any], str | None]] = field(default_factory=dict)

    def run_at_once(self, task: Any, *, queue: str | None = None) -> None:
        """`task` runs when it is sent (to `queue` only, if given)."""
        self._run[task.name] = (task, queue)

    def send_task(self, name: str, *, args: tuple[Any, ...] = (), **options: Any) -> None:
        sent = SentTask(name, tuple(args), options)
        self.calls.append(sent)
        task, queue = self._run.get(name, (None, None))
        if task is not None and queue in (None, sent.queue):
            task(*sent.args)
