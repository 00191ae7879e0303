"""Reserving a prediction of each request's KV, on a real vLLM CPU engine whose KV holds 8
requests at the model's full length: chat without `max_tokens` runs many more than 8 at once
without a failure, and the same engine in the worst-case mode runs 8 at most.

The engine serves scripts/make_long_answer_model.py's model: 16 KiB of KV a token (1 GiB, the
least a CPU engine has, holds 65,536 tokens: 8 x 8,192) and answers that end by themselves,
40 tokens long on average, so a prediction has something to predict. (What the prediction
gains in throughput, and costs in preemptions: `bench/reservation.py`.)"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import redis

from tests.e2e.conftest import E2E_REDIS_URL, make_tenant, remove_engine
from tests.support.harness import Platform, free_port, start_engine_through_agent

ENGINE = "long-answers"
MAX_MODEL_LEN = 8192
WORST_CASE_AT_ONCE = 8  # 65,536 tokens of KV / 8,192 a request without max_tokens
SEATS = 32
MEAN_ANSWER = 40
KV_PER_TOKEN = 16 * 1024  # 2 (K, V) x 4 layers x 8 KV heads x 128 x 2 bytes
BUILDER = Path(__file__).resolve().parents[2] / "scripts" / "make_long_answer_model.py"


@pytest.fixture(scope="module")
def long_answers(
    platform_server: Platform, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The engine, ready; stopped at the end of the module."""
    folder = tmp_path_factory.mktemp("models") / ENGINE
    python = os.environ.get("GPUSHARE_VLLM_PYTHON") or sys.executable
    subprocess.run(
        [python, str(BUILDER), str(folder), "--max-len", str(MAX_MODEL_LEN),
         "--mean-output", str(MEAN_ANSWER)],
        check=True, timeout=300, capture_output=True,
    )  # fmt: skip
    port = str(free_port(avoid={platform_server.port}))
    platform_server.manage(
        "engine", "create", ENGINE, "--model", str(folder), "--units", "4", "--port", port,
        "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", str(SEATS),
    )  # fmt: skip
    try:
        start_engine_through_agent(platform_server, ENGINE, timeout=600)
        (pool,) = platform_server.manage_json("pool", "reservation", ENGINE, "--json")
        (engine,) = pool["engines"]
        assert engine["budget_bytes"] == WORST_CASE_AT_ONCE * MAX_MODEL_LEN * KV_PER_TOKEN
        yield ENGINE
    finally:
        platform_server.manage("pool", "reservation", ENGINE, "--mode", "inherit")
        remove_engine(platform_server, ENGINE, timeout=120)


class MostInFlight:
    """The most sequences the fair queue had running on the engine at once, read from its
    usage hash every 50 ms while the block runs."""

    def __init__(self) -> None:
        self.most = 0
        self._stop = threading.Event()
        self._client = redis.Redis.from_url(E2E_REDIS_URL, decode_responses=True)
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.is_set():
            # The engine's pool is named after its model, as it is.
            value = self._client.hget(f"gs:fq:{{p:{ENGINE}}}:engine:{ENGINE}:use", "inflight")
            self.most = max(self.most, int(value or 0))
            time.sleep(0.05)

    def __enter__(self) -> MostInFlight:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._client.close()


async def chats(key: str, count: int, url: str) -> list[tuple[str, int]]:
    """`count` streamed chats at once, none with max_tokens: each one's finish reason and
    completion tokens."""
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=300)

    async def chat() -> tuple[str, int]:
        stream = await client.chat.completions.create(
            model=ENGINE, temperature=1.0, stream=True, stream_options={"include_usage": True},
            messages=[{"role": "user", "content": "Tell me about the fair queue."}],
        )  # fmt: skip
        finish, tokens = "", 0
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        return finish, tokens

    try:
        return await asyncio.gather(*(chat() for _ in range(count)))
    finally:
        await client.close()


def test_a_prediction_runs_more_requests_than_their_worst_cases_fit_without_a_failure(
    platform_server: Platform, long_answers: str
) -> None:
    slug, key = make_tenant(platform_server, quota_units="8")
    url = platform_server.base_url
    # Its first answers: until 8 are seen, each request reserves its worst case.
    seen = asyncio.run(chats(key, WORST_CASE_AT_ONCE, url))
    assert {finish for finish, _ in seen} <= {"stop", "length"}

    with MostInFlight() as watch:
        answers = asyncio.run(chats(key, 3 * WORST_CASE_AT_ONCE, url))
    assert [finish for finish, _ in answers if finish not in ("stop", "length")] == []
    assert sum(tokens for _, tokens in answers) > 0
    # The engine ran past what the worst cases allow, none of the requests failed.
    assert watch.most > WORST_CASE_AT_ONCE

    shown = platform_server.manage_json("pool", "reservation", ENGINE, "--json")
    (pool,) = shown
    assert pool["mode"] == "predict"
    assert pool["predicted_output_tokens"][slug] < MAX_MODEL_LEN // 4


def test_the_worst_case_mode_runs_what_the_worst_cases_fit(
    platform_server: Platform, long_answers: str
) -> None:
    _, key = make_tenant(platform_server, quota_units="8")
    platform_server.manage("pool", "reservation", ENGINE, "--mode", "worst")
    asyncio.run(chats(key, WORST_CASE_AT_ONCE, platform_server.base_url))  # answers seen, as above
    with MostInFlight() as watch:
        answers = asyncio.run(chats(key, 2 * WORST_CASE_AT_ONCE, platform_server.base_url))
    assert [finish for finish, _ in answers if finish not in ("stop", "length")] == []
    assert 0 < watch.most <= WORST_CASE_AT_ONCE
