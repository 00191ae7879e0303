"""The fair queue's fence (FairQueueConfig.replicas_ack): its state-changing scripts are
followed by WAIT, and a call fewer replicas acknowledged is not acted on as it stands. A
pick is given back and never run, an enqueue is cancelled and refused, a release is sent
again until acknowledged. On the real Redis (which has no replica: nothing is acknowledged)
and on a real primary with a replica that the test stops and lets go on."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from fairqueue import FairQueue
from fairqueue.aio import AsyncFairQueue
from fairqueue.domain import FairQueueConfig
from fairqueue.queue import FENCED_SCRIPTS, LastWords
from plumbing.aio_redis import AsyncRedis
from plumbing.sentinel import NotReplicated
from tests.fairqueue.conftest import FAIRQUEUE_REDIS_URL
from tests.fairqueue.test_lifecycle import UNIT, setup_pool
from tests.support.redis_sentinel import SentinelGroup

FIELDS: dict[str, Any] = {"tenant": "a", "pool": "p", "request_class": "standard",
                          "prompt_tokens": 100, "max_tokens": 50, "kv_bytes": UNIT}  # fmt: skip
FENCED = FairQueueConfig(replicas_ack=1, replicas_ack_timeout_ms=50, settle_retry_s=0.5)


@pytest.fixture
def fenced(fq_redis: redis.Redis) -> FairQueue:
    """The fair queue with its fence on, on a Redis without a replica."""
    return FairQueue(fq_redis, FENCED)


def state(fq: FairQueue, job_id: str) -> tuple[str, int] | None:
    return fq.job_state("p", job_id)


@pytest.mark.parametrize("client", ["raw", "redis-py"])
def test_each_fenced_script_waits_for_the_replicas_and_says_when_they_fell_short(
    fq: FairQueue, fenced: FairQueue, client: str
) -> None:
    if client == "redis-py":
        fenced._raw = None  # TLS and unix sockets take redis-py's pipeline
    setup_pool(fq)
    with pytest.raises(NotReplicated) as short:
        fenced.enqueue(job_id="j1", **FIELDS)
    assert isinstance(short.value, redis.ConnectionError)  # to a caller: Redis went away
    assert short.value.answer[0] in ("ok", b"ok")  # applied on the primary all the same
    assert state(fq, "j1") == ("queued", 0)
    with pytest.raises(NotReplicated):
        fenced.pick("p", "e1")
    job = fq.get_job("p", "j1")
    assert job is not None
    assert job.state == "running"
    assert fenced.renew_lease("p", "j1", job.attempt)  # a renewal is not fenced
    with pytest.raises(NotReplicated):
        fenced.release("p", "j1", 100, 10, attempt=job.attempt)
    assert state(fq, "j1") == ("done", 1)


def test_the_fence_is_off_by_default_and_covers_the_decisions() -> None:
    assert not FairQueue(redis.Redis(), FairQueueConfig()).fence
    assert {"enqueue", "pick", "release", "release_pick", "requeue", "cancel", "answer"} == (
        FENCED_SCRIPTS
    )


def run(work: Any) -> Any:
    return asyncio.run(work)


async def _async_queue(fq: FairQueue, url: str = FAIRQUEUE_REDIS_URL) -> AsyncFairQueue:
    return AsyncFairQueue(fq, AsyncRedis(url, max_connections=4, read_timeout_s=5))


def test_an_enqueue_not_acknowledged_is_cancelled_and_refused(
    fq: FairQueue, fenced: FairQueue
) -> None:
    setup_pool(fq)

    async def enqueue() -> None:
        queue = await _async_queue(fenced)
        try:
            await queue.enqueue_summoning(job_id="j1", **FIELDS)
        finally:
            queue.redis.close()

    with pytest.raises(NotReplicated):
        run(enqueue())
    # Its waiter answers 503: the job does not run for nobody on this primary.
    job = fq.get_job("p", "j1")
    assert job is not None
    assert job.state == "cancelled"


def test_a_pick_not_acknowledged_is_given_back_and_never_run(
    fq: FairQueue, fenced: FairQueue
) -> None:
    setup_pool(fq)
    fq.enqueue(job_id="j1", **FIELDS)

    async def pick() -> None:
        queue = await _async_queue(fenced)
        try:
            await queue.pick("p")
        finally:
            queue.redis.close()

    with pytest.raises(NotReplicated):
        run(pick())
    assert state(fq, "j1") == ("queued", 1)  # back at its queue's head, as its attempt
    assert fq.check().problems == []
    again = fq.pick("p", "e1")
    assert again is not None
    assert (again.job_id, again.attempt) == ("j1", 2)


def test_a_release_not_acknowledged_is_sent_again_until_the_time_runs_out(
    fq: FairQueue, fenced: FairQueue, fq_redis: redis.Redis
) -> None:
    setup_pool(fq)
    fq.enqueue(job_id="j1", **FIELDS)
    job = fq.pick("p", "e1")
    assert job is not None
    words = LastWords(outbox="outbox", entry="row-j1")

    async def release() -> None:
        queue = await _async_queue(fenced)
        try:
            await queue.release(job, 100, 10, last_words=words)
        finally:
            queue.redis.close()

    with pytest.raises(NotReplicated):
        run(release())
    assert state(fq, "j1") == ("done", 1)
    # Told at each try: the ledger keeps one row per request id.
    told = fq_redis.lrange("outbox", 0, -1)
    assert len(told) >= 2
    assert set(told) == {"row-j1"}


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelGroup]:
    started = SentinelGroup(tmp_path_factory.mktemp("fencing"))
    try:
        started.start()
        yield started
    finally:
        started.stop()


@pytest.fixture
def replicated(group: SentinelGroup) -> Iterator[tuple[FairQueue, FairQueue, str]]:
    """An unfenced and a fenced fair queue on a primary with one replica, and its URL."""
    url = f"redis://127.0.0.1:{group.primary().port}/1"
    client = redis.Redis.from_url(url, decode_responses=True)
    client.flushdb()
    config = dataclasses.replace(FENCED, replicas_ack_timeout_ms=200, settle_retry_s=30)
    try:
        yield FairQueue(client), FairQueue(client, config), url
    finally:
        client.flushdb()
        client.close()


def paused(group: SentinelGroup) -> Any:
    replica = next(node for node in group.servers if node is not group.primary())
    assert replica.process is not None
    return replica.process.pid


def test_a_release_and_pick_not_acknowledged_gives_the_pick_back_and_releases_once_acked(
    group: SentinelGroup, replicated: tuple[FairQueue, FairQueue, str]
) -> None:
    fq, fenced, url = replicated
    setup_pool(fq)
    fq.enqueue(job_id="j1", **FIELDS)
    fq.enqueue(job_id="j2", **FIELDS)
    job = fq.pick("p", "e1")
    assert job is not None
    assert job.job_id == "j1"
    replica = paused(group)

    async def turn() -> tuple[bool, Any]:
        queue = await _async_queue(fenced, url)
        try:
            # The replica hears nothing for a while: the turn is not acknowledged.
            os.kill(replica, signal.SIGSTOP)
            asyncio.get_running_loop().call_later(1.0, os.kill, replica, signal.SIGCONT)
            return await queue.release_and_pick(job, 100, 10, pool="p")
        finally:
            os.kill(replica, signal.SIGCONT)
            queue.redis.close()

    released, picked = run(turn())
    assert (released, picked) == (True, None)
    assert state(fq, "j1") == ("done", 1)
    assert state(fq, "j2") == ("queued", 1)  # picked with the release, given back unrun
    assert fq.check().problems == []


def test_with_the_replica_up_every_fenced_call_goes_through(
    replicated: tuple[FairQueue, FairQueue, str],
) -> None:
    fq, fenced, url = replicated
    setup_pool(fq)

    async def lifecycle() -> tuple[Any, Any]:
        queue = await _async_queue(fenced, url)
        try:
            await queue.enqueue_summoning(job_id="j1", **FIELDS)
            job = await queue.pick("p")
            assert job is not None
            return await queue.release_and_pick(job, 100, 10, pool="p")
        finally:
            queue.redis.close()

    assert run(lifecycle()) == (True, None)
    assert state(fq, "j1") == ("done", 1)


def test_a_release_refused_for_want_of_replicas_is_sent_again_once_they_are_back(
    group: SentinelGroup, replicated: tuple[FairQueue, FairQueue, str]
) -> None:
    """`min-replicas-to-write 1`: a primary whose replica lags refuses writes (NOREPLICAS;
    nothing of the script ran), and the release waits it out."""
    fq, fenced, url = replicated
    setup_pool(fq)
    fq.enqueue(job_id="j1", **FIELDS)
    job = fq.pick("p", "e1")
    assert job is not None
    primary, replica = fq.redis, paused(group)
    primary.config_set("min-replicas-max-lag", 1)
    primary.config_set("min-replicas-to-write", 1)

    async def release() -> bool:
        queue = await _async_queue(fenced, url)
        try:
            os.kill(replica, signal.SIGSTOP)
            while True:  # until the primary counts the replica as lagging
                try:
                    await queue.redis.call("SET", "probe", "1")
                except redis.ResponseError as exc:
                    refused = str(exc)
                    break
                await asyncio.sleep(0.2)
            assert refused.startswith("NOREPLICAS")
            asyncio.get_running_loop().call_later(1.0, os.kill, replica, signal.SIGCONT)
            return await queue.release(job, 100, 10)
        finally:
            os.kill(replica, signal.SIGCONT)
            queue.redis.close()

    try:
        assert run(release()) is True
    finally:
        primary.config_set("min-replicas-to-write", 0)
    assert state(fq, "j1") == ("done", 1)
