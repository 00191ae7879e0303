"""A web loop's inbox against the real Redis: entries reach their own job's waiter in order,
many per read, on Redis 7's BLMPOP and on the BLPOP-then-LPOP fallback; entries for a job
nobody waits on are dropped. And what the worker passes on of a streamed chunk."""

from __future__ import annotations

import asyncio

import pytest
from django.conf import settings

from fairqueue.inbox import Inbox, chunk_entry, event_entry, parse_event
from plumbing.aio_redis import AsyncRedis
from scheduler.engines.calls import client_data


@pytest.mark.parametrize("blmpop", [True, False])
def test_each_waiter_gets_its_own_events_in_order(redis_db, blmpop):
    async def main() -> tuple[list[dict], list[dict]]:
        client = AsyncRedis(settings.REDIS_URL, max_connections=4, read_timeout_s=5)
        inbox = Inbox(client, "gs:test:inbox")
        inbox._blmpop = blmpop
        first, second = inbox.register("a"), inbox.register("b")
        entries = [
            chunk_entry("a", 1, b'{"choices":[{"index":0}]}'),
            event_entry("gone", '{"event":"done"}'),  # nobody waits on it
            event_entry("b", '{"event":"done","attempt":1}'),
            event_entry("a", '{"event":"done","attempt":1}'),
        ]
        await client.call("RPUSH", "gs:test:inbox", *entries)
        got_a = [parse_event(await first.get()) for _ in range(2)]
        got_b = [parse_event(await second.get())]
        inbox.unregister("a")
        inbox.unregister("b")
        await inbox.close()
        client.close()
        return got_a, got_b

    got_a, got_b = asyncio.run(main())
    assert got_a == [
        {"event": "chunk", "attempt": 1, "raw": b'{"choices":[{"index":0}]}'},
        {"event": "done", "attempt": 1},
    ]
    assert got_b == [{"event": "done", "attempt": 1}]


def test_a_client_that_did_not_ask_for_usage_gets_none():
    data = b'{"choices":[{"index":0}]}'
    assert client_data(data, {"choices": [{"index": 0}]}, include_usage=False) is data
    usage_only = {"choices": [], "usage": {"prompt_tokens": 1}}
    assert client_data(b"{}", usage_only, include_usage=False) is None
    assert client_data(b"{}", usage_only, include_usage=True) == b"{}"
    both = {"choices": [{"index": 0}], "usage": {"prompt_tokens": 1}}
    assert client_data(b"{}", both, include_usage=False) == b'{"choices":[{"index":0}]}'


def test_a_numbered_chunk_keeps_its_place_through_the_inbox_entry():
    entry = chunk_entry("a", 2, b'{"choices":[]}', 17)
    job_id, _, raw = entry.partition(b" ")
    assert job_id == b"a"
    assert parse_event(raw) == {"event": "chunk", "attempt": 2, "seq": 17, "raw": b'{"choices":[]}'}
