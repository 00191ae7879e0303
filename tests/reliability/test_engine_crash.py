"""The engine process SIGKILLed mid-stream, on a platform of its own (this test destroys its
engine; 4 seats, so work waits behind the streams, in the engine's own queue and in the fair
queue).

Streaming clients get an OpenAI error event and `data: [DONE]`; the supervisor's periodic
check marks the engine failed; work that was queued for it waits, then is answered 503
after its queue timeout (the pool has no other ready engine); new work is refused 503 at
once; nothing stays reserved."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from scheduler.pools.policies import engine_queue
from tests.reliability.conftest import Stack, start_stack, stop_stack
from tests.reliability.helpers import (
    assert_openai_error,
    chat_body,
    make_tenant,
    post,
    reserved_totals,
    scheduler_check,
    wait_until,
)

SEATS = 4


@pytest.fixture(scope="module")
def crash_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    started = start_stack(
        tmp_path_factory.mktemp("engine-crash"), "crash-engine", max_num_seqs=SEATS
    )
    try:
        yield started
    finally:
        stop_stack(started)


def engine_row(stack: Stack) -> dict[str, Any]:
    row: dict[str, Any] = stack.platform.shell(
        "import json; from scheduler.models import Engine; print(json.dumps(Engine.objects"
        f".filter(name='{stack.engine}').values('pid', 'status', 'status_detail').get()))"
    )
    return row


def run_in_slices_until(pgid: int, seen: list[list[Any]], ready: Callable[[], bool]) -> int:
    """Lets the frozen engine run 50 ms at a time, then waits (frozen) for the platform to
    relay what it made, until `ready()`; the engine stays frozen. Asserts that no stream has
    ended meanwhile. Returns how many slices it ran."""
    for slices in range(400):
        unfinished = [
            e for events in seen for e in events
            if any(c.get("finish_reason") for c in e.get("choices") or [])
        ]  # fmt: skip
        assert not unfinished, f"a stream ended before the kill: {unfinished[:1]}"
        if ready():
            return slices
        os.killpg(pgid, signal.SIGCONT)
        time.sleep(0.05)
        os.killpg(pgid, signal.SIGSTOP)
        time.sleep(0.2)  # the relay (worker, Redis, web) catches up meanwhile
    raise AssertionError(f"not ready after 400 slices: {[len(e) for e in seen]} events")


def test_killing_the_engine_mid_stream_ends_streams_marks_it_failed_and_frees_all(
    crash_stack: Stack,
) -> None:
    platform, queue = crash_stack.platform, crash_stack.fair_queue()
    _, key = make_tenant(platform, quota_units="8")
    pid = engine_row(crash_stack)["pid"]
    assert pid
    # The engine is frozen as soon as the first stream holds a seat, then runs only in short
    # slices until every stream holds one and has shown its client a chunk, and is killed
    # while frozen: every stream is mid-stream at the kill however slow this machine is.
    # Freezing it only once all seats were full was flaky: on a starved machine the first
    # streams got their seats seconds before the last, and the engine finished them while
    # the relay lagged behind (their ends were still on the way when it was killed).
    streams = [chat_body(3900, stream=True) for _ in range(SEATS)]
    seen: list[list[Any]] = [[] for _ in streams]
    # Behind them: enough requests to fill the engine's own queue (as far as its KV budget
    # lets them in) and leave at least 4 waiting in the fair queue.
    queued = [chat_body(32) for _ in range(engine_queue(SEATS) + 4)]

    def in_flight() -> int:
        return sum(queue.snapshot().engine_inflight.values())

    def streams_running() -> bool:
        has_chunk = all(any("choices" in e for e in events) for events in seen)
        return has_chunk and in_flight() == SEATS

    threads = len(streams) + len(queued)  # every request sent at once
    with httpx.Client(base_url=platform.base_url) as http, ThreadPoolExecutor(threads) as pool:
        stream_futures = [
            pool.submit(post, http, key, body, events=events)
            for body, events in zip(streams, seen, strict=True)
        ]
        wait_until(lambda: in_flight() > 0, 60, "a stream in flight", interval=0.01)
        pgid = os.getpgid(pid)
        os.killpg(pgid, signal.SIGSTOP)  # the server and its engine-core children
        slices = run_in_slices_until(pgid, seen, streams_running)
        queued_futures = [pool.submit(post, http, key, body) for body in queued]

        def all_queued() -> bool:
            waiting = sum(row.waiting for row in queue.snapshot().queues)
            return waiting >= 4 and waiting + in_flight() == SEATS + len(queued)

        wait_until(
            all_queued,
            60,
            "the other requests queued behind the streams",
        )
        os.killpg(pgid, signal.SIGKILL)
        killed_at = time.monotonic()
        stream_answers = [f.result() for f in stream_futures]
        streams_ended_s = time.monotonic() - killed_at
        row = wait_until(
            lambda: (r := engine_row(crash_stack))["status"] == "failed" and r, 30, "engine failed"
        )
        failed_s = time.monotonic() - killed_at
        queued_answers = [f.result() for f in queued_futures]
        queued_s = time.monotonic() - killed_at
        late = post(http, key, chat_body(16))
    print(
        f"\nkilled after {slices} slices of 50 ms; streams ended {streams_ended_s:.1f} s, "
        f"engine marked failed {failed_s:.1f} s, "
        f"queued answered {queued_s:.1f} s after the kill; detail: {row['status_detail']!r}"
    )

    for answer in stream_answers:
        assert answer.exception is None, answer.exception
        assert answer.status == 200
        assert answer.chunks > 0  # it was mid-stream
        assert answer.done, answer.events[-3:]
        error = answer.stream_error
        assert error is not None, answer.events[-3:]
        assert {"message", "type", "code"} <= set(error["error"])
    for answer in queued_answers:
        assert answer.exception is None, answer.exception
        assert answer.status == 503, (answer.status, answer.body)
        assert_openai_error(answer)
    assert late.status == 503
    assert_openai_error(late)

    wait_until(lambda: reserved_totals(queue) == (0, 0), 30, "reservations back to zero")
    report = scheduler_check(platform)
    assert "no drift" in report, report
