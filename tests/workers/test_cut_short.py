"""A relayed run cut short is charged what the engine did, against the real Redis and a
stand-in engine over real HTTP: its client left (the run stopped as no longer its own) after
some chunks, or its answer passed the platform's limit. The engine gave no usage in either
case: the prompt's reservation stands for the prompt, the pieces streamed for the output."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from django.conf import settings as django_settings

from fairqueue import EnginePolicy, FairQueue, TenantPolicy
from fairqueue.aio import AsyncFairQueue
from plumbing.aio_redis import AsyncRedis
from scheduler.engines.aio_client import AsyncEngineClient
from scheduler.pools.policies import fair_queue
from workers.runner import Relay, Run, RunResult, run_job

UNIT = 256 * 1024 * 1024


@pytest.fixture
def queue(redis_db) -> FairQueue:
    queue = fair_queue()
    queue.set_tenant_policy("acme", TenantPolicy(1, 100 * UNIT))
    queue.set_engine_policy(EnginePolicy("e1", "m", 100 * UNIT, 4))
    return queue


def picked(queue: FairQueue, *, stream: bool) -> Any:
    payload = {
        "endpoint": "chat", "stream": stream, "tenant_id": 1, "model": "m",
        "body": {"model": "m", "messages": [{"role": "user", "content": "Hi"}]},
    }  # fmt: skip
    queue.enqueue_summoning(
        tenant="acme", pool="m", request_class="standard", prompt_tokens=40, max_tokens=500,
        kv_bytes=UNIT, payload=json.dumps(payload),
    )  # fmt: skip
    job = queue.pick("m", "e1")
    assert job is not None
    return job


def chunk(text: str) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": text}}]}).encode()


def run_against(queue: FairQueue, job: Any, handler: Any, stop_after_s: float | None) -> RunResult:
    async def main() -> RunResult:
        app = web.Application()
        app.router.add_post("/{tail:.*}", handler)
        server = TestServer(app)
        await server.start_server()
        client = AsyncRedis(django_settings.REDIS_URL, max_connections=8, read_timeout_s=30)
        aq = AsyncFairQueue(queue, client)
        engine = AsyncEngineClient(
            str(server.make_url("")), connect_timeout_s=2, generate_timeout_s=10,
            max_answer_bytes=64 * 1024,
        )  # fmt: skip
        run = Run(job)
        try:
            running = asyncio.ensure_future(run_job(aq, run, engine, Relay(aq)))
            if stop_after_s is not None:
                await asyncio.sleep(stop_after_s)
                run.stop("lost")  # as the dispatcher's watch does once the client's cancel came
            return await running
        finally:
            await engine.close()
            await server.close()
            client.close()

    return asyncio.run(main())


def test_a_relayed_stream_its_client_left_is_charged_its_prompt_and_the_pieces_sent(
    queue: FairQueue,
) -> None:
    async def slow_stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(500):
            await response.write(chunk(f"t{i}") + b"\n\n")
            await asyncio.sleep(0.02 if i >= 5 else 0)
        return response

    result = run_against(queue, picked(queue, stream=True), slow_stream, stop_after_s=0.5)
    assert result.outcome == "cancelled"
    assert result.prompt_tokens == 40
    assert 5 <= result.completion_tokens < 500


def test_a_relayed_stream_whose_chunk_passes_the_limit_is_answered_and_charged(
    queue: FairQueue,
) -> None:
    async def huge_chunk(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(3):
            await response.write(chunk(f"t{i}") + b"\n\n")
        await response.write(chunk("x" * 200 * 1024) + b"\n\n")
        return response

    result = run_against(queue, picked(queue, stream=True), huge_chunk, stop_after_s=None)
    assert (result.outcome, result.status_code, result.error_code) == (
        "error", 400, "answer_too_large",
    )  # fmt: skip
    assert (result.prompt_tokens, result.completion_tokens) == (40, 3)
    assert result.error_body is not None
    assert result.error_body["error"]["code"] == "answer_too_large"


def test_a_whole_answer_past_the_limit_is_charged_every_token_it_could_have(
    queue: FairQueue,
) -> None:
    async def huge_answer(request: web.Request) -> web.StreamResponse:
        return web.json_response({"choices": [{"message": {"content": "x" * 200 * 1024}}]})

    result = run_against(queue, picked(queue, stream=False), huge_answer, stop_after_s=None)
    assert (result.outcome, result.error_code) == ("error", "answer_too_large")
    assert (result.prompt_tokens, result.completion_tokens) == (40, 500)
