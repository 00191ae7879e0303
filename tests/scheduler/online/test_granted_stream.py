"""A granted stream, web side, as pure logic: while it streams, the job's inbox is looked
through only for a newer run's grant (whose worker then gets the report); every other word
stays there, in order, for the waiter once the stream is over."""

from __future__ import annotations

import asyncio
import json

from scheduler.online.granted import GrantedStream


def test_a_newer_grant_takes_the_report_and_the_other_words_keep_their_order() -> None:
    async def main() -> tuple[str, int, list[str]]:
        words: asyncio.Queue[bytes] = asyncio.Queue()
        for event in (
            {"event": "requeued", "reason": "lease_expired"},
            {"event": "grant", "attempt": 2, "url": "http://e", "reply": "inbox:new"},
            {"event": "grant", "attempt": 1, "url": "http://e", "reply": "inbox:stale"},
            {"event": "error", "status": 503, "attempt": 2},
        ):
            words.put_nowait(json.dumps(event).encode())
        grant = {"attempt": 1, "url": "http://e", "reply": "inbox:first"}
        stream = GrantedStream(None, "p", "j1", "standard", {}, grant, words)  # type: ignore[arg-type]
        reply = stream._reply()
        left = [json.loads(words.get_nowait())["event"] for _ in range(words.qsize())]
        return reply, stream.attempt, left

    reply, attempt, left = asyncio.run(main())
    assert (reply, attempt) == ("inbox:new", 2)
    assert left == ["requeued", "error"]
