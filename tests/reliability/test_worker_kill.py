"""The Celery worker SIGKILLed with 40 requests in flight, and a new one started.

Every request is answered exactly once: a whole (non-streamed) answer is 200, the dead
worker's jobs having come back through the reaper and run again; a stream that had started
may end with an OpenAI error event (a run cannot resume invisibly) but always with
`data: [DONE]`. The ledger has one row per request, under the id the client was given, and
once the reaper has run the scheduler reports no drift and nothing reserved."""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.reliability.conftest import Stack
from tests.reliability.helpers import (
    assert_openai_error,
    chat_body,
    make_tenant,
    post,
    reserved_totals,
    scheduler_check,
    usage_rows,
    wait_until,
)
from tests.support.harness import kill_process, start_process

REQUESTS = 40
STREAMS = 10


def test_a_worker_killed_mid_load_loses_and_duplicates_nothing(stack: Stack) -> None:
    platform, queue = stack.platform, stack.fair_queue()
    slug, key = make_tenant(platform, quota_units="8")
    bodies = [chat_body(160, stream=i < STREAMS) for i in range(REQUESTS)]
    with httpx.Client(base_url=platform.base_url) as http, ThreadPoolExecutor(REQUESTS) as pool:
        futures = [pool.submit(post, http, key, body) for body in bodies]
        # Kill once the worker holds jobs on the engine (the engine runs 16 at a time).
        wait_until(lambda: sum(queue.snapshot().engine_inflight.values()) >= 8, 60, "jobs running")
        kill_process(platform, "worker")  # SIGKILL: leases held, nothing released
        killed_at = time.monotonic()
        time.sleep(1)
        start_process(platform, "worker")
        answers = [f.result() for f in futures]
        recovered_s = time.monotonic() - killed_at
    print(f"\nall {REQUESTS} answered {recovered_s:.1f} s after the kill")

    assert [a.exception for a in answers if a.exception] == []
    whole, streams = answers[STREAMS:], answers[:STREAMS]
    assert Counter(a.status for a in whole) == {200: len(whole)}, [a.body for a in whole]
    for answer in streams:
        if answer.status != 200:  # refused before its stream started
            assert answer.status == 503
            assert_openai_error(answer)
            continue
        assert answer.done, answer.events[-3:]
        if answer.stream_error is None:
            assert answer.chunks > 0
    broken = [a for a in streams if a.status == 200 and a.stream_error]
    print(f"streams broken mid-way by the kill: {len(broken)} of {STREAMS}")

    ids = [a.request_id for a in answers]
    assert None not in ids
    assert len(set(ids)) == REQUESTS
    wait_until(lambda: reserved_totals(queue) == (0, 0), 30, "reservations back to zero")
    report = scheduler_check(platform)
    assert "no drift" in report, report

    try:
        rows = wait_until(
            lambda: len(r := usage_rows(platform, slug)) >= REQUESTS and r, 30, "rows"
        )
    except AssertionError:
        rows = usage_rows(platform, slug)
        missing = [
            (a.status, a.body is None, a.stream_error, a.chunks)
            for a in answers
            if a.request_id not in {row["request_id"] for row in rows}
        ]
        raise AssertionError(f"{len(rows)} ledger rows; missing: {missing}") from None
    ledger_ids = Counter(row["request_id"] for row in rows)
    assert max(ledger_ids.values()) == 1
    assert set(ledger_ids) == set(ids)
    outcomes = Counter(row["outcome"] for row in rows)
    print(f"ledger outcomes: {dict(outcomes)}")
    assert outcomes["success"] >= len(whole)
