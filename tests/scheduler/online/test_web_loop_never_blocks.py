"""The web's event loop never waits on a socket or the database: requests go through the
whole ASGI application (config.asgi) on a real event loop, with the real Redis and database,
while a guard records every blocking socket call, name lookup and SQL statement made on the
thread that runs the loop while it runs. Redis is asked through the asyncio client there;
the database, a Celery publish and any other synchronous step through a thread.

A socket in blocking mode (timeout not 0) blocks its thread for as long as the other side
takes: that is what the guard catches. The loop's own transports use non-blocking sockets
(or none at all under uvloop), which it lets through."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvloop
from django.db.backends.utils import CursorWrapper

from plumbing import wire
from plumbing.redis import redis_client
from scheduler.online import admission as online
from scheduler.pools.policies import fair_queue
from tenants import services
from tenants.services import tenant_update
from tests.factories import TenantFactory
from tests.scheduler.online.test_admission import MODEL, key_to_a_ready_engine, queued_ids

pytestmark = pytest.mark.django_db(transaction=True)  # the threads must see the rows

ROOT = f"{Path(__file__).resolve().parents[2]}/"
CHAT = "/v1/chat/completions"
SOCKET_CALLS = ("recv", "recv_into", "recvfrom", "send", "sendall", "sendto", "connect")


@dataclass
class LoopGuard:
    """What blocked a running event loop's thread: one line and the stack of each call."""

    uvloop: bool = False  # which loop `on_a_loop` runs
    calls: list[tuple[str, str]] = field(default_factory=list)

    def note(self, what: str) -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # not an event loop's thread, or its loop is not running
            return
        stack = traceback.extract_stack()[:-2]
        ours = [f for f in stack if _the_platforms(f.filename)]
        where = f"{ours[-1].filename}:{ours[-1].lineno} {ours[-1].name}" if ours else "?"
        self.calls.append((f"{what} under {where}", "".join(traceback.format_list(stack[-14:]))))

    def check(self) -> None:
        if self.calls:
            what, stack = self.calls[0]
            kinds = "\n".join(sorted({f"  {name}" for name, _ in self.calls}))
            pytest.fail(
                f"{len(self.calls)} blocking call(s) on the event loop's thread:\n{kinds}\n"
                f"the first, {what}, from:\n{stack}"
            )


def _the_platforms(filename: str) -> bool:
    """Whether a frame is the platform's own code (not a library's, not the tests')."""
    inside = filename.startswith(ROOT)
    return inside and not filename.startswith((f"{ROOT}.venv/", f"{ROOT}tests/"))


@pytest.fixture(params=["asyncio", "uvloop"])
def loop_guard(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> LoopGuard:
    """Installed for the test; the test checks it after its loop ran (`LoopGuard.check`).
    The loop is asyncio's, then uvloop's (the web's under `plumbing.serve`)."""
    return guarding(LoopGuard(uvloop=request.param == "uvloop"), monkeypatch)


def guarding(guard: LoopGuard, monkeypatch: pytest.MonkeyPatch) -> LoopGuard:
    """`guard` told of each blocking socket call, name lookup and SQL statement."""

    def blocking_socket_call(name: str) -> Callable[..., Any]:
        original = getattr(socket.socket, name)

        def call(sock: socket.socket, *args: Any, **kwargs: Any) -> Any:
            if sock.gettimeout() != 0.0:  # blocking mode: the thread waits for the peer
                guard.note(f"socket.{name}")
            return original(sock, *args, **kwargs)

        return call

    def noting(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            guard.note(name)
            return original(*args, **kwargs)

        return call

    for name in SOCKET_CALLS:
        monkeypatch.setattr(socket.socket, name, blocking_socket_call(name))
    monkeypatch.setattr(socket, "getaddrinfo", noting("getaddrinfo", socket.getaddrinfo))
    for name in ("execute", "executemany"):
        original = getattr(CursorWrapper, name)
        monkeypatch.setattr(CursorWrapper, name, noting(f"SQL {name}", original))
    return guard


@pytest.fixture
def bearer(redis_db, tmp_path) -> str:
    return key_to_a_ready_engine(tmp_path)


class StandInEngine:
    """A worker in a thread of its own: picks the pool's jobs and answers each (two chunks
    and `done` for a stream, `done` with a whole body otherwise). One that `breaks_streams`
    loses each stream's run after its first chunk (the job is said to be requeued)."""

    def __init__(self, *, breaks_streams: bool = False) -> None:
        self.breaks_streams = breaks_streams
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> StandInEngine:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(5)

    def _serve(self) -> None:
        queue = fair_queue()
        while not self.stop.is_set():
            job = queue.pick(MODEL)
            if job is None:
                time.sleep(0.01)
                continue
            stream = wire.loads(job.payload)["stream"]
            attempt = job.attempt
            if stream and self.breaks_streams:
                chunk = {"choices": [{"index": 0, "delta": {"content": "Hel"}}]}
                queue.publish(
                    job.pool, job.job_id, {"event": "chunk", "attempt": attempt, "data": chunk}
                )
                queue.publish(
                    job.pool, job.job_id, {"event": "requeued", "reason": "engine_unavailable"}
                )
                continue
            if stream:
                for word in ("Hel", "lo"):
                    chunk = {"choices": [{"index": 0, "delta": {"content": word}}]}
                    queue.publish(
                        job.pool, job.job_id, {"event": "chunk", "attempt": attempt, "data": chunk}
                    )
                done: dict[str, Any] = {"event": "done", "attempt": attempt}
            else:
                body = {"object": "chat.completion", "choices": [{"message": {"content": "Hi"}}]}
                done = {"event": "done", "attempt": attempt, "body": body}
            queue.release(job.pool, job.job_id, 1, 2, attempt=attempt)
            queue.publish(job.pool, job.job_id, done)


def chat(*, stream: bool = False) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8,
        "stream": stream,
    }


async def post(bearer: str, body: dict[str, Any]) -> httpx.Response:
    transport = httpx.ASGITransport(app=_application())
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        return await client.post(CHAT, json=body, headers={"Authorization": bearer})


def _application() -> Any:
    from config.asgi import application

    return application


def on_a_loop(guard: LoopGuard, work: Callable[[], Awaitable[Any]]) -> Any:
    """`work` on a fresh event loop (the guard's kind), then whatever the web left running
    in the background (a cancel, a ledger row) until it is done, on the same loop."""

    async def run() -> Any:
        result = await work()
        for _ in range(200):
            others = asyncio.all_tasks() - {asyncio.current_task()}
            if not others:
                break
            await asyncio.sleep(0.01)
        return result

    return uvloop.run(run()) if guard.uvloop else asyncio.run(run())


def job_state(job_id: str) -> str | None:
    job = fair_queue().get_job(MODEL, job_id)
    return None if job is None else str(job.state)


# --- the guard itself ----------------------------------------------------------------------


def test_the_guard_sees_a_synchronous_redis_call_on_the_loop_and_none_off_it(redis_db):
    with pytest.MonkeyPatch.context() as patch:
        guard = guarding(LoopGuard(), patch)

        async def blocking() -> None:
            redis_client().ping()

        asyncio.run(blocking())
        on_the_loop = len(guard.calls)
        redis_client().ping()  # off the loop: not counted
    assert on_the_loop > 0
    assert len(guard.calls) == on_the_loop
    assert {what.split()[0] for what, _ in guard.calls} >= {"socket.sendall", "socket.recv_into"}


# --- requests through the web ----------------------------------------------------------------


def test_whole_and_streamed_answers_from_a_cold_then_warm_web(bearer, loop_guard):
    """The first request finds nothing cached (its key, route and tenant's policy are read
    in threads); the next ones are admitted on the loop."""

    async def requests() -> list[httpx.Response]:
        with StandInEngine():
            first = await post(bearer, chat())
            second = await post(bearer, chat())
            streamed = await post(bearer, chat(stream=True))
        return [first, second, streamed]

    first, second, streamed = on_a_loop(loop_guard, requests)
    loop_guard.check()
    assert first.status_code == second.status_code == 200, first.text
    assert first.json()["choices"][0]["message"]["content"] == "Hi"
    assert streamed.status_code == 200
    assert streamed.text.count("data: ") == 3  # two chunks and [DONE]
    assert streamed.text.endswith("data: [DONE]\n\n")


def test_entries_that_ran_out_are_refreshed_in_a_thread(bearer, loop_guard, monkeypatch):
    """The key, the route and the tenant's policy run out between two requests: their
    versions (change marks in Redis) are read, and the rows again if need be, off the loop."""
    for cache in (services._live_keys, online._routes, online._synced_tenants):
        monkeypatch.setattr(cache, "ttl_s", 0.05)

    async def requests() -> list[int]:
        statuses = []
        with StandInEngine():
            for _ in range(3):
                statuses.append((await post(bearer, chat())).status_code)
                await asyncio.sleep(0.1)  # every entry runs out
        return statuses

    statuses = on_a_loop(loop_guard, requests)
    loop_guard.check()
    assert statuses == [200, 200, 200]


def test_a_request_refused_by_the_tenants_limits(bearer, loop_guard):
    tenant_update(tenant=TenantFactory.create(slug="acme"), rpm_limit=2, token_budget=10_000)

    async def requests() -> list[httpx.Response]:
        with StandInEngine():
            return [await post(bearer, chat()) for _ in range(3)]

    statuses = [response.status_code for response in on_a_loop(loop_guard, requests)]
    loop_guard.check()
    assert statuses == [200, 200, 429]


def test_a_stream_whose_run_is_lost_after_a_chunk(bearer, loop_guard, redis_db):
    """The web cancels the job and writes its ledger row itself."""
    from tenants.usage_buffer import PENDING_KEY

    async def requests() -> httpx.Response:
        with StandInEngine(breaks_streams=True):
            return await post(bearer, chat(stream=True))

    streamed = on_a_loop(loop_guard, requests)
    loop_guard.check()
    assert streamed.status_code == 200
    assert "engine was lost mid-stream" in streamed.text
    job_state_now = job_state(streamed.headers["x-request-id"])
    assert job_state_now == "cancelled"
    rows = [json.loads(row) for row in redis_db.lrange(PENDING_KEY, 0, -1)]
    assert [row["error_code"] for row in rows] == ["stream_broken"]


def test_a_client_that_disconnects_while_its_request_waits_cancels_its_job(bearer, loop_guard):
    """No engine answers: the client leaves while its job is queued, and the job is cancelled
    (after the web has answered nobody)."""
    body = json.dumps(chat()).encode()
    scope = {
        "type": "http", "method": "POST", "path": CHAT,
        "headers": [(b"authorization", bearer.encode()), (b"content-type", b"application/json")],
    }  # fmt: skip
    sent: list[dict[str, Any]] = []

    async def leave_once_queued() -> str:
        messages = [{"type": "http.request", "body": body, "more_body": False}]
        job_ids: list[str] = []

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop(0)
            while not job_ids:  # the client waits until its job is queued, then leaves
                job_ids.extend(await asyncio.to_thread(queued_ids))
                await asyncio.sleep(0.01)
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await asyncio.wait_for(_application()(scope, receive, send), timeout=10)
        for _ in range(300):  # the cancel may finish after the app has returned
            if await asyncio.to_thread(job_state, job_ids[0]) == "cancelled":
                break
            await asyncio.sleep(0.01)
        return job_ids[0]

    job_id = on_a_loop(loop_guard, leave_once_queued)
    loop_guard.check()
    assert sent == []
    assert job_state(job_id) == "cancelled"
