"""How `AsyncFairQueue` splits a batch of many jobs' calls (renew_leases, publish_many) into
one pipeline per pool or slot, on a client that records what it is sent: one pool is one
pipeline as before; several are one each, the fence behind each, the answers in the callers'
order. tests/fairqueue/test_cluster.py runs the same batches on a real cluster."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from fairqueue import FairQueue
from fairqueue.aio import AsyncFairQueue
from fairqueue.domain import Job
from plumbing.cluster import pipeline_slot
from plumbing.sentinel import NO_FENCE, Fence, NotReplicated


class Recording:
    """Answers each function call with its key (its pool's tag), another command with "OK";
    `short` pools' pipelines are not acknowledged by their replicas."""

    def __init__(self, short: Sequence[str] = ()) -> None:
        self.sent: list[tuple[list[Any], Fence]] = []
        self.short = short

    async def pipeline(self, commands: Sequence[Sequence[Any]], *, fence: Fence = NO_FENCE) -> Any:
        pipeline_slot(commands)  # CrossSlot as a cluster's client raises it
        self.sent.append(([tuple(command) for command in commands], fence))
        answers = [str(command[3]) if command[0] == "FCALL" else "OK" for command in commands]
        if fence and any(f"{{p:{pool}}}" in answers[0] for pool in self.short):
            raise NotReplicated(answers, 0, fence.replicas)
        return answers


def job(pool: str, job_id: str) -> Job:
    return Job(job_id, "a", pool, "interactive", 1, 1, 1, attempt=1)


def test_one_pools_batch_is_one_pipeline(fq: FairQueue) -> None:
    client = Recording()
    queue = AsyncFairQueue(fq, client)  # type: ignore[arg-type]
    assert asyncio.run(queue.renew_leases([job("p", "1"), job("p", "2")])) == [True, True]
    assert len(client.sent) == 1
    events: list[tuple[str, str | bytes]] = [
        (fq.keys.inbox("p", "w"), "1 x"),
        (fq.keys.events("p", "2"), "{}"),
    ]
    asyncio.run(queue.publish_many(events))
    assert client.sent[1][0] == fq.publish_commands(events)


def test_several_pools_are_a_pipeline_each_answered_in_the_callers_order(fq: FairQueue) -> None:
    client = Recording(short=["q"])
    queue = AsyncFairQueue(fq, client)  # type: ignore[arg-type]
    fence = Fence(1, 10)
    calls = [(pool, [str(i)]) for i, pool in enumerate("pqpq")]
    with pytest.raises(NotReplicated) as short:
        asyncio.run(queue._run_many("renew", calls, fence=fence))
    tags = [fq.keys.pool_tag(pool) for pool in "pqpq"]
    assert short.value.answer == tags  # every pool's answers, q's unacknowledged among them
    assert sorted(len(commands) for commands, _ in client.sent) == [2, 2]
    assert all(sent_fence == fence for _, sent_fence in client.sent)
    client.sent.clear()
    events: list[tuple[str, str | bytes]] = [
        (fq.keys.inbox(pool, "w"), f"{i} x") for i, pool in enumerate("pqp")
    ]
    asyncio.run(queue.publish_many(events))
    by_pool = {commands[1][1]: commands for commands, _ in client.sent}
    assert by_pool[fq.keys.inbox("p", "w")] == fq.publish_commands([events[0], events[2]])
    assert by_pool[fq.keys.inbox("q", "w")] == fq.publish_commands([events[1]])
