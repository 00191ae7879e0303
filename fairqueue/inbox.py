"""A waiting process's inbox: the events of every job it waits on, read many at a time.

A web process waits on hundreds of jobs at once, and a streamed answer is an event per token.
Read with a BLPOP per job and per event, every token would cost a round trip to Redis and a
wake-up of the web; the engine's batch decodes in step (a token for every stream at each
step), so those round trips would come in bursts of as many as there are streams. Here the
process has one list (`Keys.inbox`), which the queue's scripts and the workers append its
jobs' events to (`lua/lib.lua` emit_raw, `workers/runner.Relay`), and one reader that takes
whatever is there in one round trip and hands each event to its job's waiter in the process.
The list is of the pool's slot (`Keys.inbox`), where the pool's scripts append to it: a
process waiting on jobs of several pools has one inbox per pool (`Inboxes`).

An entry is `<job id> <event>`: the event is JSON, or for a streamed chunk `c<attempt>.<seq> `
and the chunk's JSON as the engine sent it, passed on to the client unparsed. The run's
`done` event says how many chunks it sent (`chunks`), so a waiter that missed one, or got
one twice, knows (a Redis failover can do either: the inbox is not fenced).

Nothing is lost between a job's enqueue and its waiter's first read: the waiter is
registered before the job is queued, and entries wait in the list until read. Entries for a
job nobody waits on any more (its client left) are dropped. A process that dies leaves its
inbox to expire (`keep_s` after its last entry).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import redis

from fairqueue.keys import Keys
from plumbing import wire
from plumbing.aio_redis import AsyncRedis

log = logging.getLogger(__name__)

# The most entries one read takes; the rest come with the next read, at once.
READ_COUNT = 1024
# How long one wait for the first entry lasts (seconds; an idle process asks again).
WAIT_S = 5


def chunk_entry(job_id: str, attempt: int, data: bytes, seq: int | None = None) -> bytes:
    """An inbox entry for a streamed chunk: the engine's JSON, passed on unparsed. `seq`: the
    chunk's place in its run's stream (1, 2, ...), by which the waiter tells apart a chunk
    that a Redis failover lost or handed over twice (the inbox is not fenced); None: not
    numbered."""
    if seq is None:
        return b"%s c%d %s" % (job_id.encode(), attempt, data)
    return b"%s c%d.%d %s" % (job_id.encode(), attempt, seq, data)


def event_entry(job_id: str, event: str | bytes) -> bytes:
    raw = event.encode() if isinstance(event, str) else event
    return job_id.encode() + b" " + raw


def parse_event(raw: bytes) -> dict[str, Any]:
    """An entry's event, without its job id: a dict; a chunk's is
    {"event": "chunk", "attempt": n, "raw": the chunk's JSON bytes}, with "seq" where it
    is numbered."""
    if raw[:1] == b"c":
        head, _, data = raw[1:].partition(b" ")
        attempt, _, seq = head.partition(b".")
        chunk: dict[str, Any] = {"event": "chunk", "attempt": int(attempt), "raw": data}
        if seq:
            chunk["seq"] = int(seq)
        return chunk
    event: dict[str, Any] = wire.loads(raw)
    return event


class Inbox:
    """One process's (one event loop's) inbox and its reader."""

    def __init__(self, client: AsyncRedis, key: str) -> None:
        self.key = key
        self._client = client
        self._waiters: dict[str, asyncio.Queue[bytes]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._blmpop = True  # Redis 7's BLMPOP (one round trip); else BLPOP then LPOP

    def register(self, job_id: str) -> asyncio.Queue[bytes]:
        """The queue `job_id`'s events will arrive in (register before it is enqueued)."""
        waiter: asyncio.Queue[bytes] = asyncio.Queue()
        self._waiters[job_id] = waiter
        if self._reader is None or self._reader.done():
            self._reader = asyncio.ensure_future(self._read())
        return waiter

    def unregister(self, job_id: str) -> None:
        self._waiters.pop(job_id, None)

    async def _read(self) -> None:
        while self._waiters:
            try:
                entries = await self._take()
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                log.warning("inbox %s: %s; reading again in 1 s", self.key, exc)
                await asyncio.sleep(1.0)
                continue
            for entry in entries:
                job_id, _, event = entry.partition(b" ")
                waiter = self._waiters.get(job_id.decode())
                if waiter is not None:
                    waiter.put_nowait(event)

    async def _take(self) -> list[bytes]:
        """The entries there now, at most READ_COUNT, waiting up to WAIT_S for the first."""
        if self._blmpop:
            try:
                reply = await self._client.call(
                    "BLMPOP", WAIT_S, 1, self.key, "LEFT", "COUNT", READ_COUNT, block_s=WAIT_S
                )
                return [] if reply is None else list(reply[1])
            except redis.ResponseError as exc:
                if "unknown command" not in str(exc).lower():
                    raise
                self._blmpop = False  # Redis before 7.0
        first = await self._client.blpop(self.key, WAIT_S)
        if first is None:
            return []
        rest = await self._client.call("LPOP", self.key, READ_COUNT - 1)
        return [first[1], *(rest or [])]

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader


class Inboxes:
    """One process's (one event loop's) inboxes, named `name`: one per pool it waits on,
    made when it first waits on a job of the pool."""

    def __init__(self, client: AsyncRedis, keys: Keys, name: str) -> None:
        self._client, self._keys, self.name = client, keys, name
        self._inboxes: dict[str, Inbox] = {}

    def of(self, pool: str) -> Inbox:
        """The inbox of the pool's jobs."""
        inbox = self._inboxes.get(pool)
        if inbox is None:
            inbox = self._inboxes[pool] = Inbox(self._client, self._keys.inbox(pool, self.name))
        return inbox

    async def close(self) -> None:
        for inbox in self._inboxes.values():
            await inbox.close()
