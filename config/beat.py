"""Celery beat's scheduler without its busy wait.

Stock beat files each entry in its heap 10 ms before it is due (the `drift` of `adjust`), then
asks the entry itself, which says "not yet" for those last 10 ms: the entry is filed again at
a moment already past and beat ticks again at once, without sleeping, until it is due: most of
what an idle beat costs. Filing entries at the moment they are due leaves one tick per due
entry (docs/decisions/0007-periodic-work-on-each-workers-ticker.md).
"""

from __future__ import annotations

from celery.beat import Scheduler


class PunctualScheduler(Scheduler):
    """The in-memory scheduler (nothing to lose on a restart: beat's only entry, the telemetry
    rollup, runs every few minutes), waking when an entry is due, not 10 ms before."""

    # `n` is seconds (a float), typed as celery-types has it.
    def adjust(self, n: int, drift: float = 0.0) -> float:
        return super().adjust(n, drift=drift)
