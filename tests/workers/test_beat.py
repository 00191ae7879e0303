"""Beat's scheduler wakes once per due entry, not in a busy loop before it.

Pure scheduling logic: the entries are not sent (`apply_entry` records them), so no broker is
involved; the clock is the real one, as in beat."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from celery.beat import ScheduleEntry, Scheduler
from celery.schedules import schedule

from config.beat import PunctualScheduler
from config.celery import app


def ticks_for_two_sends(scheduler_class: type[Scheduler]) -> int:
    """Runs beat's loop (tick, then sleep what it asks) until an entry due every 0.2 s has
    been sent twice; returns how many ticks that took."""
    sent: list[str] = []

    class Recording(scheduler_class):  # type: ignore[valid-type, misc]
        def apply_entry(self, entry: ScheduleEntry, producer: Any = None) -> None:
            sent.append(str(entry.name))

    now = app.now()
    every = schedule(timedelta(seconds=0.2))
    entries = {  # two entries due at the same moments, as beat's often are
        name: ScheduleEntry(
            name=name, task="workers.ping", schedule=every, app=app, last_run_at=now
        )
        for name in ("a", "b")
    }
    scheduler = Recording(app=app, schedule=entries, lazy=True)
    scheduler.__dict__["producer"] = None  # nothing is sent
    ticks = 0
    deadline = time.monotonic() + 5
    while len(sent) < 4 and time.monotonic() < deadline:
        interval = scheduler.tick()
        ticks += 1
        if interval and interval > 0:
            time.sleep(interval)
    assert len(sent) == 4, sent
    return ticks


def test_the_punctual_scheduler_ticks_about_once_per_send() -> None:
    assert ticks_for_two_sends(PunctualScheduler) <= 10


def test_the_stock_scheduler_spins_before_each_due_time() -> None:
    """Why PunctualScheduler exists: if this starts failing, Celery fixed it upstream."""
    assert ticks_for_two_sends(Scheduler) > 20


@pytest.mark.parametrize("seconds", [1, 3])
def test_punctual_entries_are_not_sent_early(seconds: int) -> None:
    scheduler = PunctualScheduler(app=app, lazy=True)
    assert scheduler.adjust(seconds) == seconds
