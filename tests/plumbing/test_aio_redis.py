"""The platform's asyncio Redis client against the real Redis, and against redis-py's asyncio
client (the library it replaces: same replies, same error classes): commands, pipelines, scripts
that Redis forgot, BLPOP elements and timeouts, many waiters at once on their own keys, a pool
smaller than the waiters, a cancelled call that pops nothing, kept connections that Redis closed
meanwhile, and the errors of a Redis that is away or silent."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
import redis
import uvloop
from django.conf import settings

from plumbing.aio_redis import AsyncRedis, pack_command


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request):
    """Runs a coroutine on asyncio's loop, and on uvloop's (the web's under uvicorn)."""
    return asyncio.run if request.param == "asyncio" else uvloop.run


def pops(max_connections: int = 10, read_timeout_s: float = 5.0) -> AsyncRedis:
    return AsyncRedis(
        settings.REDIS_URL, max_connections=max_connections, read_timeout_s=read_timeout_s
    )


def test_a_command_is_packed_as_resp():
    assert pack_command("BLPOP", "k", b"1") == b"*3\r\n$5\r\nBLPOP\r\n$1\r\nk\r\n$1\r\n1\r\n"
    assert pack_command("SET", "é") == b"*2\r\n$3\r\nSET\r\n$2\r\n\xc3\xa9\r\n"


def test_an_element_comes_back_and_an_empty_list_times_out(redis_db: redis.Redis, run):
    redis_db.rpush("events", '{"event": "picked"}', '{"event": "done"}')

    async def main() -> tuple[object, object, object, float]:
        reader = pops()
        first = await reader.blpop("events", 1)
        second = await reader.blpop("events", 1)
        started = time.monotonic()
        third = await reader.blpop("events", 1)
        reader.close()
        return first, second, third, time.monotonic() - started

    first, second, third, waited = run(main())
    assert first == (b"events", b'{"event": "picked"}')  # from REDIS_URL's database
    assert second == (b"events", b'{"event": "done"}')
    assert third is None
    assert 0.9 <= waited < 3


def test_many_waiters_at_once_each_get_their_own_element(redis_db: redis.Redis, run):
    async def main() -> list[tuple[bytes, bytes] | None]:
        reader = pops(max_connections=50)
        waiters = [asyncio.ensure_future(reader.blpop(f"job:{n}", 5)) for n in range(40)]
        await asyncio.sleep(0.2)  # all blocked in Redis now
        for n in reversed(range(40)):
            redis_db.rpush(f"job:{n}", f"answer {n}")
        answers = await asyncio.gather(*waiters)
        reader.close()
        return answers

    answers = run(main())
    assert answers == [(f"job:{n}".encode(), f"answer {n}".encode()) for n in range(40)]


def test_waiters_beyond_the_pool_wait_for_a_connection(redis_db: redis.Redis, run):
    clients_before = len(redis_db.client_list())

    async def main() -> tuple[list[tuple[bytes, bytes] | None], int]:
        reader = pops(max_connections=2)
        waiters = [asyncio.ensure_future(reader.blpop(f"job:{n}", 5)) for n in range(5)]
        await asyncio.sleep(0.2)
        opened = len(redis_db.client_list()) - clients_before
        for n in range(5):
            redis_db.rpush(f"job:{n}", str(n))
        answers = await asyncio.gather(*waiters)
        reader.close()
        return answers, opened

    answers, opened = run(main())
    assert opened == 2
    assert answers == [(f"job:{n}".encode(), str(n).encode()) for n in range(5)]


def test_a_cancelled_wait_pops_nothing_and_its_connection_is_not_reused(redis_db: redis.Redis, run):
    async def main() -> object:
        reader = pops(max_connections=1)
        waiter = asyncio.ensure_future(reader.blpop("events", 5))
        await asyncio.sleep(0.2)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        await asyncio.sleep(0.2)  # Redis has seen the connection close
        redis_db.rpush("events", "for the next waiter")
        answer = await reader.blpop("events", 1)  # a new connection: the pool's only slot
        reader.close()
        return answer

    assert run(main()) == (b"events", b"for the next waiter")


def test_a_redis_that_is_away_is_a_connection_error(run):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens there once closed
    reader = AsyncRedis(f"redis://127.0.0.1:{port}/0", max_connections=1, read_timeout_s=1)
    with pytest.raises(redis.ConnectionError):
        run(reader.blpop("events", 1))


def test_a_redis_that_does_not_answer_is_a_timeout(run):
    async def main() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader = AsyncRedis(f"redis://127.0.0.1:{port}/0", max_connections=1, read_timeout_s=0.2)
        try:
            await reader.blpop("events", 0)
        finally:
            server.close()

    started = time.monotonic()
    with pytest.raises(redis.TimeoutError):
        run(main())
    assert time.monotonic() - started < 2


def test_an_error_reply_is_a_response_error(redis_db: redis.Redis, run):
    redis_db.set("events", "not a list")

    async def main() -> None:
        await pops().blpop("events", 1)

    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        run(main())


def test_kept_connections_that_redis_closed_are_replaced_without_a_failure(
    redis_db: redis.Redis, run
):
    """As after a Redis restart: every kept connection is gone, noticed or not."""

    async def main() -> list[tuple[bytes, bytes] | None]:
        reader = pops(max_connections=4, read_timeout_s=2)
        for n in range(3):  # three connections kept
            redis_db.rpush(f"warm:{n}", "x")
        await asyncio.gather(*(reader.blpop(f"warm:{n}", 1) for n in range(3)))
        redis_db.client_kill_filter(_type="normal", skipme=True)
        answers = []
        for n in range(3):
            redis_db.rpush("events", f"event {n}")
            answers.append(await reader.blpop("events", 1))
        await asyncio.sleep(0.1)  # the loop has seen the closes now
        redis_db.rpush("events", "event 3")
        answers.append(await reader.blpop("events", 1))
        reader.close()
        return answers

    started = time.monotonic()
    answers = run(main())
    assert answers == [(b"events", f"event {n}".encode()) for n in range(4)]
    assert time.monotonic() - started < 2  # no call waited for a reply that could not come


def test_commands_and_pipelines_answer_as_redis_py_does(redis_db: redis.Redis, run):
    """The contract with the library this client replaces: each reply equals what redis-py's
    asyncio client (without decoding) answers to the same commands on the same data."""
    import redis.asyncio as aioredis

    commands: list[tuple[str | int | float, ...]] = [
        ("RPUSH", "l", "a", "é", "c"),
        ("LRANGE", "l", 0, -1),
        ("HSET", "h", "x", "1", "y", "2.5"),
        ("HMGET", "h", "x", "missing", "y"),
        ("INCRBY", "n", 7),
        ("GET", "missing"),
        ("ZADD", "z", 1.5, "m"),
        ("ZRANGE", "z", 0, -1, "WITHSCORES"),
        ("EXISTS", "l", "h", "nope"),
    ]

    async def ours() -> list[object]:
        client = pops()
        single = [await client.call(*command) for command in commands]
        redis_db.flushdb()
        piped = await client.pipeline(commands)
        client.close()
        assert piped == single
        return single

    async def theirs() -> list[object]:
        client = aioredis.Redis.from_url(settings.REDIS_URL)
        answers = [await client.execute_command(*command) for command in commands]
        await client.aclose()
        return answers

    mine = run(ours())
    redis_db.flushdb()
    reference = run(theirs())
    # redis-py turns some replies into Python values of its own (ZRANGE's scores into
    # floats, EXISTS into an int); the wire's replies are compared where it passes them on.
    for got, want, command in zip(mine, reference, commands, strict=True):
        if command[0] == "ZRANGE":
            assert got == [b"m", b"1.5"]
            assert [list(pair) for pair in want] == [[b"m", 1.5]]
        else:
            assert got == want, command


def test_a_pipeline_raises_the_first_error_after_reading_every_reply(redis_db: redis.Redis, run):
    redis_db.set("s", "text")

    async def main() -> object:
        client = pops(max_connections=1)
        with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
            await client.pipeline([("SET", "a", "1"), ("LPUSH", "s", "x"), ("SET", "b", "2")])
        after = await client.call("MGET", "a", "b")  # the same connection, still in step
        client.close()
        return after

    assert run(main()) == [b"1", b"2"]


def test_a_script_redis_forgot_is_loaded_and_run_once(redis_db: redis.Redis, run):
    source = "return redis.call('INCR', KEYS[1])"
    sha = redis_db.script_load(source)
    redis_db.script_flush()

    async def main() -> object:
        client = pops()
        with pytest.raises(redis.exceptions.NoScriptError):
            await client.call("EVALSHA", sha, 1, "counter")
        first = await client.evalsha(sha, source, 1, "counter")
        second = await client.evalsha(sha, source, 1, "counter")
        client.close()
        return first, second

    assert run(main()) == (1, 2)
    assert redis_db.get("counter") in ("2", b"2")
