"""The fair queue's scripts as one Redis Functions library (fairqueue/library.py): loaded
once, one function per script, and loaded again by whichever client finds Redis without it.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
import redis

from fairqueue import FairQueue, FairQueueConfig, library
from fairqueue.aio import AsyncFairQueue
from fairqueue.domain import EnginePolicy, Job, TenantPolicy
from fairqueue.queue import PICK_FIELDS
from plumbing.aio_redis import AsyncRedis
from tests.fairqueue.conftest import FAIRQUEUE_REDIS_URL

GIB = 1024**3


def setup(queue: FairQueue) -> None:
    queue.set_engine_policy(EnginePolicy("e", "p", GIB, 4))
    queue.set_tenant_policy("t", TenantPolicy(weight=1, quota_bytes=GIB))


def pairs(flat: list[Any]) -> dict[str, Any]:
    """A FUNCTION LIST entry (RESP2: a flat list of names and values) as a dict."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


def enqueue(queue: FairQueue) -> Job:
    return queue.enqueue(
        tenant="t", pool="p", request_class="standard", prompt_tokens=1, max_tokens=1,
        kv_bytes=1024,
    )  # fmt: skip


def lifecycle(queue: FairQueue) -> None:
    """A job's whole life, over whichever client the queue uses (the raw one by default)."""
    job = enqueue(queue)
    picked = queue.pick("p")
    assert picked is not None
    assert picked.job_id == job.job_id
    assert queue.release(job.pool, job.job_id, 1, 1, attempt=picked.attempt)
    assert queue.check().problems == []


def test_one_function_per_script_under_a_name_that_follows_the_source(
    fq: FairQueue, fq_redis: redis.Redis
) -> None:
    setup(fq)
    [loaded] = [
        pairs(entry) for entry in fq_redis.function_list(library.library_name())
        if pairs(entry)["library_name"] == library.library_name()
    ]  # fmt: skip
    names = {pairs(function)["name"] for function in loaded["functions"]}
    assert names == {library.function_name(name) for name in library.SCRIPT_NAMES}
    source = library.library_source()
    assert library.library_name() in source.splitlines()[0]
    assert library.library_name().startswith("gpushare_fq_")


def test_loading_it_again_is_harmless(fq: FairQueue) -> None:
    setup(fq)
    fq.load_library()
    FairQueue(fq.redis, FairQueueConfig()).load_library()
    lifecycle(fq)


@pytest.mark.parametrize("lean", [True, False], ids=["RawRedis", "redis-py"])
def test_a_redis_that_lost_the_library_gets_it_again(fq_redis: redis.Redis, lean: bool) -> None:
    queue = FairQueue(fq_redis, FairQueueConfig())
    if not lean:
        queue._raw = None
    setup(queue)
    fq_redis.function_flush()  # as a restart without persistence leaves it
    lifecycle(queue)
    fq_redis.function_flush()
    lifecycle(queue)


def test_the_event_loops_client_loads_it_too(fq: FairQueue, fq_redis: redis.Redis) -> None:
    setup(fq)
    job = enqueue(fq)
    picked = fq.pick("p")
    assert picked is not None

    async def renew() -> list[bool]:
        client = AsyncRedis(FAIRQUEUE_REDIS_URL, max_connections=2, read_timeout_s=5)
        queue = AsyncFairQueue(fq, client)
        try:
            fq_redis.function_flush()
            kept = await queue.renew_leases([picked, picked])  # a pipeline of two calls
            fq_redis.function_flush()
            return [*kept, await queue.grow(job.pool, job.job_id, picked.attempt, 1) != -2]
        finally:
            client.close()

    assert asyncio.run(renew()) == [True, True, True]


def test_a_script_error_is_raised_not_taken_for_a_missing_library(fq: FairQueue) -> None:
    with pytest.raises(redis.ResponseError, match="engine"):
        fq.pick("p", "no-such-engine")


@pytest.mark.parametrize("payload", ['{"text": "a\\nb"}', "a\nb\n", ""])
def test_a_picked_jobs_payload_comes_back_as_it_went_in(fq: FairQueue, payload: str) -> None:
    # A pick answers the job's fields one by one (lib.lua pick_reply): newlines of its own,
    # or none, change nothing.
    setup(fq)
    fq.enqueue(tenant="t", pool="p", request_class="standard", prompt_tokens=1, max_tokens=1,
               kv_bytes=1, payload=payload, now=0)  # fmt: skip
    picked = fq.pick("p", now=1)
    assert picked is not None
    assert picked.payload == payload


def test_a_pick_answers_the_fields_the_worker_reads_in_its_order() -> None:
    # The worker reads a picked job's fields by place (queue.py PICK_FIELDS).
    source = (library.LUA_DIR / "lib.lua").read_text()
    listed = re.search(r"^local PICK_FIELDS = \{(.*?)\}", source, re.MULTILINE | re.DOTALL)
    assert listed is not None
    assert tuple(re.findall(r"'(\w+)'", listed.group(1))) == PICK_FIELDS


def test_the_constants_written_as_command_arguments_match_their_numbers() -> None:
    # A number given to a Redis command from Lua is formatted again at every call, so the
    # library keeps some as strings; each must say what its number does.
    source = (library.LUA_DIR / "lib.lua").read_text()
    values = dict(re.findall(r"^local (\w+) = ([^\s]+)", source, re.MULTILINE))
    assert values["OUT_LAST"] == f"'{int(values['OUT_SAMPLES']) - 1}'"
    assert values["PAGE_LAST"] == f"'{int(values['PAGE']) - 1}'"
    assert values["SAMPLES_KEEP"] == f"'{24 * 3600}'"
    assert "SAMPLES_KEEP_S = 24 * 3600" in source
