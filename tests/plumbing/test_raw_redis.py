"""The fair queue's lean Redis client (plumbing/raw_redis.py) with the real Redis:
replies as redis-py gives them, error classes, connections kept per thread and replaced when
Redis closed them, and a command never sent twice."""

from __future__ import annotations

import os
import threading
import time

import pytest
import redis
from django.conf import settings

from fairqueue.domain import DispatchLoop, EnginePolicy, FairQueueConfig, TenantPolicy
from fairqueue.queue import FairQueue
from plumbing.raw_redis import RawRedis

GIB = 1024**3


@pytest.fixture
def raw(redis_db: redis.Redis) -> RawRedis:
    client = RawRedis.like(redis_db)
    assert client is not None
    return client


def connection_id(raw: RawRedis) -> int:
    return int(raw.call("CLIENT", "ID"))


def test_it_talks_to_the_same_database_and_decodes_like_its_model(
    raw: RawRedis, redis_db: redis.Redis
) -> None:
    redis_db.rpush("list", "a", "é")
    assert raw.call("LRANGE", "list", 0, -1) == ["a", "é"]
    assert raw.call("LLEN", "list") == 2
    assert raw.call("GET", "missing") is None
    assert raw.call("SET", "n", 1.5) == "OK"
    assert redis_db.get("n") == "1.5"


def test_undecoded_clients_get_bytes(redis_db: redis.Redis) -> None:
    plain = redis.Redis.from_url(settings.REDIS_URL)
    raw = RawRedis.like(plain)
    assert raw is not None
    assert raw.decode_responses is False
    redis_db.set("k", "v")
    assert raw.call("GET", "k") == b"v"


def test_unix_sockets_and_tls_are_left_to_redis_py() -> None:
    assert RawRedis.like(redis.Redis(unix_socket_path="/tmp/no-such.sock")) is None
    assert RawRedis.like(redis.Redis(ssl=True)) is None


def test_error_replies_are_redis_py_s_classes_and_the_connection_stays_in_step(
    raw: RawRedis, redis_db: redis.Redis
) -> None:
    redis_db.set("text", "x")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        raw.call("LPUSH", "text", "y")
    with pytest.raises(redis.exceptions.NoScriptError):
        raw.call("EVALSHA", "0" * 40, 0)
    with pytest.raises(redis.ResponseError):
        raw.pipeline([("SET", "a", "1"), ("LPUSH", "text", "y"), ("SET", "b", "2")])
    # Every reply of the pipeline was read: the next call gets its own.
    assert raw.call("MGET", "a", "b") == ["1", "2"]
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):  # queued, failed in EXEC
        raw.pipeline([("MULTI",), ("LPUSH", "text", "y"), ("EXEC",)])
    assert raw.call("GET", "text") == "x"


def test_it_works_on_descriptors_above_1024(redis_db: redis.Redis) -> None:
    # A web holding a few hundred clients opens its Redis connections on such descriptors.
    raw = RawRedis.like(redis_db)
    assert raw is not None
    fillers = [os.open(os.devnull, os.O_RDONLY)]
    while fillers[-1] <= 1024:  # every lower descriptor taken
        fillers.append(os.dup(fillers[0]))
    os.close(fillers.pop())  # the connection's, above 1024
    try:
        assert raw.call("PING") == "PONG"
        assert raw._local.connection.sock.fileno() > 1024
        assert raw.call("PING") == "PONG"  # the kept connection, checked before its use
    finally:
        raw.close()
        for fd in fillers:
            os.close(fd)


def test_a_connection_redis_refused_to_authenticate_is_not_used(redis_db: redis.Redis) -> None:
    raw = RawRedis.like(redis_db)
    assert raw is not None
    raw.password = "wrong"  # this Redis has none: AUTH is refused
    for _ in range(2):  # the second call connects again rather than use the refused one
        with pytest.raises(redis.AuthenticationError):
            raw.call("PING")


def test_each_thread_keeps_a_connection_of_its_own(raw: RawRedis) -> None:
    mine = connection_id(raw)
    assert connection_id(raw) == mine
    theirs: list[int] = []
    worker = threading.Thread(target=lambda: theirs.append(connection_id(raw)))
    worker.start()
    worker.join()
    assert theirs
    assert theirs[0] != mine


def test_a_kept_connection_that_redis_closed_is_replaced_before_anything_is_sent(
    raw: RawRedis, redis_db: redis.Redis
) -> None:
    first = connection_id(raw)
    redis_db.client_kill_filter(_id=str(first))
    time.sleep(0.05)  # the close reaches our socket
    assert raw.call("INCR", "counter") == 1
    assert connection_id(raw) != first


def test_a_command_cut_off_on_its_way_is_raised_not_sent_again(
    raw: RawRedis, redis_db: redis.Redis
) -> None:
    waiting = connection_id(raw)

    def kill_soon() -> None:
        time.sleep(0.3)
        redis_db.client_kill_filter(_id=str(waiting))

    threading.Thread(target=kill_soon).start()
    with pytest.raises(redis.ConnectionError):
        raw.call("BLPOP", "wake", 5, block_s=5)
    # Had the BLPOP been sent again, it would be waiting now and take this element.
    redis_db.rpush("wake", "1")
    time.sleep(0.1)
    assert redis_db.lrange("wake", 0, -1) == ["1"]


def test_a_reply_late_past_the_timeout_is_a_timeout_and_the_connection_is_dropped(
    redis_db: redis.Redis,
) -> None:
    raw = RawRedis.like(redis_db)
    assert raw is not None
    raw.socket_timeout_s = 0.2
    first = connection_id(raw)
    with pytest.raises(redis.TimeoutError):
        raw.call("BLPOP", "never", 2)  # blocks longer than the socket waits
    assert connection_id(raw) != first
    assert raw.call("BLPOP", "never", 0.3, block_s=0.3) is None  # its block is allowed for


@pytest.mark.parametrize("lean", [True, False], ids=["RawRedis", "redis-py"])
def test_the_fair_queue_runs_a_job_over_either_client(redis_db: redis.Redis, lean: bool) -> None:
    """redis-py carries the queue where the lean client cannot (TLS, unix sockets)."""
    queue = FairQueue(redis_db, FairQueueConfig(prefix="gs:raw:", loop_idle_s=4))
    if not lean:
        queue._raw = None
    queue.set_engine_policy(
        EnginePolicy(engine_id="e", pool="p", kv_budget_bytes=GIB, max_num_seqs=4)
    )
    queue.set_tenant_policy("t", TenantPolicy(weight=1, quota_bytes=GIB))
    loop = DispatchLoop(token="loop-1")
    assert queue.pick("p", loop=loop) is None  # registered idle
    job, summon = queue.enqueue_summoning(
        tenant="t", pool="p", request_class="standard", prompt_tokens=1, max_tokens=1,
        kv_bytes=1024,
    )  # fmt: skip
    assert summon is False  # the idle loop was woken instead
    assert queue.wait_for_work("p", loop, timeout_s=2) is True
    picked = queue.pick("p", loop=loop)
    assert picked is not None
    assert picked.job_id == job.job_id
    queue.publish(job.pool, job.job_id, {"event": "chunk", "n": 1})
    assert queue.events(job.pool, job.job_id)[-1] == {"event": "chunk", "n": 1}
    assert queue.release(job.pool, job.job_id, 1, 1, attempt=picked.attempt)
    assert queue.check().problems == []
