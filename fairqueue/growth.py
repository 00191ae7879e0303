"""A running job's reservation growing as it generates (the `predict` mode, lua/lib.lua
`job_cost` and lua/grow.lua), from where its tokens are counted: the worker that relays its
stream, or the web it is granted to. Tokens are counted as the stream's pieces come (one per
choice of a chunk, one per delta event of a Responses stream), which is what the engine
generated up to a piece or two; the release charges the engine's own count."""

from __future__ import annotations

import asyncio
import logging

from fairqueue.aio import AsyncFairQueue

log = logging.getLogger(__name__)


class Growth:
    """Counts one run's tokens and grows its reservation each time they pass what it covers
    (`covered`: the tokens it covers, -1 when it reserves its worst case and never grows).
    One grow is in flight at a time: the stream never waits for it. A grow that fails (Redis
    away) is tried again at the next piece; the engine's water level holds the next picks
    back meanwhile."""

    def __init__(
        self, queue: AsyncFairQueue, pool: str, job_id: str, attempt: int, covered: int
    ) -> None:
        self.queue, self.pool, self.job_id, self.attempt = queue, pool, job_id, attempt
        self.covered = covered
        self.tokens = 0
        self._growing: asyncio.Future[None] | None = None

    def add(self, tokens: int) -> None:
        self.tokens += tokens
        if 0 <= self.covered < self.tokens and self._growing is None:
            self._growing = asyncio.ensure_future(self._grow(self.tokens))

    async def _grow(self, tokens: int) -> None:
        try:
            covered = await self.queue.grow(self.pool, self.job_id, self.attempt, tokens)
        except Exception as exc:
            log.info("job %s: its reservation could not grow: %s", self.job_id, exc)
            return
        finally:
            self._growing = None
        self.covered = -1 if covered < -1 else covered  # -2: the job is not ours any more

    def close(self) -> None:
        """The stream is over: nothing grows any more. A grow still in flight may land or
        not; the release that follows takes back what the job holds either way."""
        self.covered = -1
