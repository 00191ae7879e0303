"""`AsyncFairQueue`: the fair queue's calls from an event loop (the web's, the dispatcher's).

The same scripts, arguments and answers as `FairQueue` (which builds them: one rule, two
ways to send it), sent over `plumbing.aio_redis.AsyncRedis` so that no call blocks the loop
that makes it. Reads and writes that run off the hot path (policies, snapshots, checks)
stay on `FairQueue`.

Beyond `FairQueue`, calls made for many jobs at once are one round trip for all the jobs of
a pool, the pools' at once: `renew_leases`, `jobs_still_running` and `publish_many` (a
dispatcher holds hundreds of runs). A pipeline is one node's, and a cluster serves each
pool's slot on its own node.

Under fencing (`FairQueue.fence`, see fairqueue/queue.py) a script call that replicas did
not acknowledge raises NotReplicated, and what it decided is not acted on:
- an enqueue: the job is cancelled (best effort) and the error raised: its waiter answers
  503, and a job the new primary may still hold does not run for nobody;
- a pick (alone or with a release): the picked job is never run; it goes back to its queue as
  its attempt (a no-op where the pick was lost), or, where that fails too (or the call's
  answer was lost with its connection, so the job is unknown here), its lease ends and the
  reaper returns it;
- a release (alone or with a pick): it is sent again, to the primary the sentinels name then,
  until acknowledged or `settle_retry_s` has passed. Again is harmless: a release names its
  attempt and is a no-op once applied (lua/lib.lua release_job); its last words are told
  again, and the ledger keeps one row per request id and the waiter takes the first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Hashable, Sequence
from typing import Any

import redis

from fairqueue import library
from fairqueue.domain import DispatchLoop, FairQueueConfig, Job, LeaseWant
from fairqueue.keys import Keys
from fairqueue.leases import tenant_slot_of
from fairqueue.queue import (
    ASK_LEASE,
    MAX_ASKS,
    NO_ASK,
    FairQueue,
    LastWords,
    _text,
    pick_answer,
    release_args,
    release_pick_answer,
    starved_entry,
)
from plumbing.aio_redis import AsyncRedis
from plumbing.cluster import key_slot_of
from plumbing.sentinel import NO_FENCE, Fence, NotReplicated, refused_for_replicas

log = logging.getLogger(__name__)


class AsyncFairQueue:
    def __init__(self, queue: FairQueue, client: AsyncRedis) -> None:
        self.queue = queue
        self.redis = client

    @property
    def config(self) -> FairQueueConfig:
        return self.queue.config

    @property
    def keys(self) -> Keys:
        return self.queue.keys

    async def _run(self, name: str, pool: str, *args: Any) -> Any:
        try:
            fence = self.queue.fence_for(name)
            return (await self._run_many(name, [(pool, args)], fence=fence))[0]
        except NotReplicated as short:  # the answer of the one call
            raise NotReplicated(short.answer[0], short.acked, short.wanted) from None

    async def _settle(self, name: str, pool: str, *args: Any) -> Any:
        """A release's call (`release`), sent again while the fence is on and it was not
        acknowledged (NotReplicated, Redis away: the primary is found anew for each new
        connection, or refused by a primary short of replicas: `min-replicas-to-write`),
        until `settle_retry_s` has passed. Returns whether it was applied at any try."""
        if not self.queue.fence:
            return await self._run(name, pool, *args)
        gives_up, pause, released = time.monotonic() + self.config.settle_retry_s, 0.1, False
        while True:
            try:
                answer = await self._run(name, pool, *args)
                return bool(answer) or released
            except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError) as exc:
                if isinstance(exc, redis.ResponseError) and not refused_for_replicas(exc):
                    raise
                if isinstance(exc, NotReplicated):
                    released = released or bool(exc.answer)
                if time.monotonic() + pause > gives_up:
                    raise
                log.warning("job %s: release not acknowledged (%s); sending it again", args[0], exc)
                await asyncio.sleep(pause)
                pause = min(2 * pause, 1.0)

    async def _give_back(self, job: Job) -> None:
        """A job whose pick was not acknowledged, never run: back to its queue as its
        attempt; where that fails too, its lease ends and the reaper returns it."""
        try:
            await self.requeue(job, "not_replicated")
        except NotReplicated:
            pass  # given back on the primary; where a promotion loses that, the reaper's turn
        except redis.RedisError as exc:
            log.warning("job %s: its pick was not acknowledged nor given back: %s", job.job_id, exc)

    async def _run_many(
        self, name: str, calls: Sequence[tuple[str, Sequence[Any]]], *, fence: Fence = NO_FENCE
    ) -> list[Any]:
        """One function call per (pool, argument list), the answers in the calls' order: each
        pool's calls in one round trip (with the `fence`'s WAIT behind them), the pools' at
        once. A pipeline is one node's, and a cluster serves each pool's slot on its own; one
        pool (the usual case) is one pipeline. NotReplicated where any pool's calls were not
        acknowledged: its answer is all the answers, in the calls' order."""
        if not calls:
            return []
        commands = [(*self.queue.call_head(name, pool), *args) for pool, args in calls]
        groups = _groups([pool for pool, _ in calls])
        if len(groups) == 1:
            return await self._pipeline_calls(commands, fence)
        results = await asyncio.gather(
            *(self._pipeline_calls([commands[i] for i in group], fence) for group in groups),
            return_exceptions=True,
        )
        short = [result for result in results if isinstance(result, NotReplicated)]
        answers = _in_calls_order(
            groups,
            [result.answer if isinstance(result, NotReplicated) else result for result in results],
        )
        if short:
            raise NotReplicated(answers, min(each.acked for each in short), short[0].wanted)
        return answers

    async def _pipeline_calls(self, commands: list[tuple[Any, ...]], fence: Fence) -> list[Any]:
        """Function calls in one pipeline, the library loaded first where Redis lacks it."""
        try:
            return await self.redis.pipeline(commands, fence=fence)
        except redis.exceptions.ResponseError as error:
            if not library.is_missing(error):
                raise
        # None of them ran: Redis did not know the library (a pipeline's replies are all
        # read before an error is raised, and each call fails alike).
        await self._load_library()
        return await self.redis.pipeline(commands, fence=fence)

    async def _load_library(self) -> None:
        try:
            await self.redis.call("FUNCTION", "LOAD", library.library_source())
        except redis.exceptions.ResponseError as error:
            if not library.is_loaded_already(error):
                raise

    async def _run_keyed(self, name: str, key: str, *args: Any) -> Any:
        """A quota lease's step (`leases.py`): a function called with the one key it
        touches, of a tenant's slot or a pool's."""
        command = ("FCALL", library.function_name(name), 1, key, *args)
        try:
            return await self.redis.call(*command)
        except redis.exceptions.ResponseError as error:
            if not library.is_missing(error):
                raise
        await self._load_library()  # Redis ran nothing: it did not know the function
        return await self.redis.call(*command)

    # --- the web ------------------------------------------------------------------------

    async def enqueue_summoning(self, **fields: Any) -> tuple[Job, bool]:
        """`FairQueue.enqueue_summoning`, from an event loop."""
        args = self.queue.enqueue_args(summon=True, **fields)
        try:
            answer = await self._run("enqueue", args[2], *args)
        except NotReplicated:
            with contextlib.suppress(redis.RedisError):
                await self.cancel(args[2], args[0], "not_replicated")
            raise
        return self.queue.enqueue_answer(answer, args)

    async def cancel(self, pool: str, job_id: str, reason: str = "cancelled") -> str:
        return _text(await self._run("cancel", pool, job_id, reason))

    async def answer(self, pool: str, job_id: str, report: str, inbox: str, *, keep: bool) -> None:
        """A granted stream's report to `inbox` (the granting worker's in the job's pool);
        kept in the job too (`keep`: the answer was given whole). See lua/answer.lua."""
        await self._run("answer", pool, job_id, report, inbox, "1" if keep else "0")

    async def answered(self, pool: str, job_id: str) -> str:
        """The report of a whole answer that a web left in the job's hash ('' = none)."""
        answered = await self.redis.call("HGET", self.keys.job(pool, job_id), "answered")
        return _text(answered or b"")

    async def job_exists(self, pool: str, job_id: str) -> bool:
        """Whether Redis holds the job (a failover can lose one that was not fenced)."""
        return bool(await self.redis.call("EXISTS", self.keys.job(pool, job_id)))

    async def get_job(self, pool: str, job_id: str) -> Job | None:
        flat = await self.redis.call("HGETALL", self.keys.job(pool, job_id))
        fields = {_text(flat[i]): _text(flat[i + 1]) for i in range(0, len(flat), 2)}
        return Job.from_hash(job_id, fields) if fields else None

    # --- the dispatcher ------------------------------------------------------------------

    async def pick(self, pool: str, *, loop: DispatchLoop | None = None) -> Job | None:
        """`FairQueue.pick` for the pool's engine with the most room."""
        starting = loop is not None and loop.starting
        picked = await self._pick(pool, "", loop, ASK_LEASE)
        return await self._after_asking(picked, loop, starting)

    async def _after_asking(
        self, picked: Job | LeaseWant | None, loop: DispatchLoop | None, starting: bool
    ) -> Job | None:
        """`FairQueue.pick_after_asking`, from an event loop."""
        asks = 0
        while isinstance(picked, LeaseWant):
            await self.grow_lease(picked)
            asks += 1
            if loop is not None:
                loop.starting = starting  # it still fans out from this pick
            ask = ASK_LEASE if asks < MAX_ASKS else NO_ASK
            picked = await self._pick(picked.pool, picked.engine, loop, ask)
        return picked

    async def _pick(
        self, pool: str, engine_id: str, loop: DispatchLoop | None, ask: str
    ) -> Job | LeaseWant | None:
        args = [*self.queue.pick_args(pool, engine_id, loop), ask]
        try:
            answer = await self._run("pick", pool, *args)
        except NotReplicated as short:
            picked = pick_answer(short.answer, loop, pool)
            if isinstance(picked, LeaseWant):
                return picked  # a want decided nothing: it needs no replica
            if picked is not None:
                await self._give_back(picked)
            raise
        return pick_answer(answer, loop, pool)

    async def grow_lease(self, want: LeaseWant) -> bool:
        """`FairQueue.grow_lease`, from an event loop."""
        quota, lease = self.keys.lease_quota(want.tenant), self.keys.lease(want.pool, want.tenant)
        slot = tenant_slot_of(await self.redis.call("HGETALL", quota))
        asked = slot.ask(want.pool, want=want.want, need=want.need, idle=want.idle)
        idle = "1" if want.idle else "0"
        granted, seq = await self._run_keyed("lease_grant", quota, want.pool, asked, idle)
        granted = int(granted)
        applied = granted > 0 and bool(
            await self._run_keyed("lease_apply", lease, granted, int(seq))
        )
        if not applied or granted < want.need:
            entry = starved_entry(want.tenant, want.pool)
            await self.redis.call("SADD", self.keys.lease_starved(), entry)
        return applied

    async def release(
        self,
        job: Job,
        prompt_tokens: int,
        completion_tokens: int,
        *,
        last_words: LastWords | None = None,
    ) -> bool:
        args = release_args(job.job_id, prompt_tokens, completion_tokens, job.attempt, last_words)
        return bool(await self._settle("release", job.pool, *args))

    async def release_and_pick(
        self,
        job: Job,
        prompt_tokens: int,
        completion_tokens: int,
        *,
        pool: str,
        last_words: LastWords | None = None,
    ) -> tuple[bool, Job | None]:
        # The next job for the engine the released one ran on: room appeared there only.
        args = self.queue.release_pick_args(
            job, prompt_tokens, completion_tokens, pool, "", None, last_words, same_engine=True
        )
        try:
            answer = await self._run("release_pick", pool, *args)
        except NotReplicated as short:
            released, picked = release_pick_answer(short.answer, None, pool)
            if isinstance(picked, Job):
                await self._give_back(picked)
            # The release is sent again below; a want is left to the pool's next pick.
        except (redis.ConnectionError, redis.TimeoutError):
            if not self.queue.fence:
                raise
            released = False  # it may have run: a job it picked is the reaper's
            log.warning(
                "job %s: its release and the next pick went unanswered; a job picked with it "
                "is never run here, and its lease ends for the reaper", job.job_id,
            )  # fmt: skip
        else:
            released, picked = release_pick_answer(answer, None, pool)
            if not isinstance(picked, LeaseWant):
                return released, picked
            return released, await self._pick_after_release(picked)
        released = (
            await self.release(job, prompt_tokens, completion_tokens, last_words=last_words)
            or released
        )
        return released, None

    async def _pick_after_release(self, want: LeaseWant) -> Job | None:
        """The pick of a worker's turn again, once the lease it wanted was asked for. The
        release stands whatever happens here: a failure leaves the job queued, for the
        pool's next pick (or housekeeping's kick)."""
        try:
            return await self._after_asking(want, None, False)
        except redis.RedisError as exc:  # NotReplicated: the pick was given back
            log.warning("pool %s: no pick after asking for a lease: %s", want.pool, exc)
            return None

    async def requeue(self, job: Job, reason: str) -> bool:
        args = self.queue.requeue_args(job.job_id, job.attempt, reason)
        return bool(await self._run("requeue", job.pool, *args))

    async def grow(self, pool: str, job_id: str, attempt: int, tokens: int) -> int:
        return int(await self._run("grow", pool, job_id, attempt, int(tokens)))

    async def renew_leases(self, jobs: Sequence[Job]) -> list[bool]:
        """Each job's lease extended, in one round trip; False where the job is no longer
        the caller's (cancelled, or reaped and running elsewhere): stop running it."""
        calls = [(job.pool, self.queue.renew_args(job.job_id, job.attempt)) for job in jobs]
        return [bool(answer) for answer in await self._run_many("renew", calls)]

    async def jobs_still_running(self, jobs: Sequence[Job]) -> list[bool]:
        """Whether each job is still running as its attempt: one round trip per pool, the
        pools' at once (as `_run_many`)."""
        if not jobs:
            return []
        commands = [
            ("HMGET", self.keys.job(job.pool, job.job_id), "state", "attempt") for job in jobs
        ]
        groups = _groups([job.pool for job in jobs])
        if len(groups) == 1:
            answers = await self.redis.pipeline(commands)
        else:
            results = await asyncio.gather(
                *(self.redis.pipeline([commands[i] for i in group]) for group in groups),
                return_exceptions=True,
            )
            answers = _in_calls_order(groups, results)
        return [
            state is not None and _text(state) == "running" and int(attempt or 0) == job.attempt
            for job, (state, attempt) in zip(jobs, answers, strict=True)
        ]

    async def publish_many(self, events: list[tuple[str, str | bytes]]) -> None:
        """Appends entries ((list key, entry), in order) to their lists: one transaction
        (`FairQueue.publish_commands`) per slot of the lists, in one round trip each, the
        slots' at once. A transaction is one node's; the lists of a pool share its slot, so
        one pool's events (the usual case) are one transaction. Each list keeps its entries'
        order; every transaction is answered before an error of one is raised."""
        if not events:
            return
        groups = _groups([key_slot_of(key) for key, _ in events])
        if len(groups) == 1:
            await self.redis.pipeline(self.queue.publish_commands(events))
            return
        results = await asyncio.gather(
            *(
                self.redis.pipeline(self.queue.publish_commands([events[i] for i in group]))
                for group in groups
            ),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def wait_for_work(
        self, pool: str, loop: DispatchLoop, timeout_s: float, stop: asyncio.Event
    ) -> bool:
        """`FairQueue.wait_for_work`, from an event loop."""
        idle, wake = self.keys.idle_loops(pool), self.keys.loop_wake(pool, loop.token)
        waits_until = time.monotonic() + timeout_s
        while not stop.is_set():
            left = waits_until - time.monotonic()
            if left <= 0:
                break
            slice_s = self.queue.wait_slice_s(left)
            commands = self.queue.renew_and_wait_commands(idle, wake, loop.token, slice_s)
            try:
                renewed, woken = await self.redis.pipeline(commands, block_s=slice_s)
            except redis.TimeoutError:  # the client's read timeout, on a stalled machine
                continue
            if woken is not None:
                return True
            if not renewed:
                break
        return await self.stop_waiting(pool, loop)

    async def stop_waiting(self, pool: str, loop: DispatchLoop) -> bool:
        return bool(await self._run("stop_waiting", pool, pool, loop.token))


def _groups(tags: Sequence[Hashable]) -> list[list[int]]:
    """The positions of `tags`, grouped by tag (a pool, a slot), in the order each tag comes
    first; each group's positions in order."""
    groups: dict[Hashable, list[int]] = {}
    for i, tag in enumerate(tags):
        groups.setdefault(tag, []).append(i)
    return list(groups.values())


def _in_calls_order(
    groups: list[list[int]], results: Sequence[list[Any] | BaseException]
) -> list[Any]:
    """Each group's answers (one per position, `asyncio.gather`'s with return_exceptions) put
    back at their calls' positions. An error of a group is raised (the first in the groups'
    order) once every group has answered: none is left running unread."""
    answers: list[Any] = [None] * sum(len(group) for group in groups)
    for group, result in zip(groups, results, strict=True):
        if isinstance(result, BaseException):
            raise result
        for i, answer in zip(group, result, strict=True):
            answers[i] = answer
    return answers
