"""An interactive TTFT target held on the real vLLM CPU engine beside another tenant's
standard flood: the engine's controller bounds the flood's seats until the target holds,
and the flood still runs. (What the target costs and the static caps it is measured against:
`bench/seats.py`.)"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import openai
import pytest

from tests.e2e.conftest import MODEL, make_tenant
from tests.support.harness import Platform

FLOOD_STREAMS = 24
# The p99 alone is some tens of ms here; beside the unbounded flood, several times that.
# The target leaves room for a loaded CI machine and still needs the bound to hold it.
TARGET_MS = 400.0


async def interactive_ttfts(client: openai.AsyncOpenAI, seconds: float) -> list[float]:
    """Two closed loops of streamed chat: each request's time to its first token."""
    ttfts: list[float] = []
    until = time.monotonic() + seconds

    async def loop() -> None:
        while time.monotonic() < until:
            started = time.monotonic()
            stream = await client.chat.completions.create(
                model=MODEL, max_tokens=16, stream=True, extra_body={"ignore_eos": True},
                messages=[{"role": "user", "content": "hello"}],
            )  # fmt: skip
            first = None
            async for chunk in stream:
                if first is None and chunk.choices and chunk.choices[0].delta.content:
                    first = time.monotonic() - started
            if first is not None:
                ttfts.append(first)

    await asyncio.gather(loop(), loop())
    return ttfts


async def flood(client: openai.AsyncOpenAI, stop: asyncio.Event, done: list[int]) -> None:
    async def loop() -> None:
        while not stop.is_set():
            await client.chat.completions.create(
                model=MODEL, max_tokens=64, extra_body={"ignore_eos": True},
                messages=[{"role": "user", "content": "tell me a long story"}],
            )  # fmt: skip
            done.append(1)

    await asyncio.gather(*(loop() for _ in range(FLOOD_STREAMS)))


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, int(0.99 * len(ordered)) - 1)] if ordered else float("inf")


def seats(platform: Platform) -> dict[str, Any]:
    (pool,) = platform.manage_json("pool", "targets", MODEL, "--json")
    (engine,) = pool["engines"]
    return engine


@pytest.fixture
def target(platform_server: Platform):
    platform_server.manage("pool", "targets", MODEL, "--ttft-ms", f"interactive={TARGET_MS:g}")
    yield TARGET_MS
    platform_server.manage("pool", "targets", MODEL, "--ttft-ms", "inherit")


def test_an_interactive_target_is_held_beside_a_standard_flood(
    platform_server: Platform, target: float
) -> None:
    _, chat_key = make_tenant(platform_server, classes="interactive")
    _, bulk_key = make_tenant(platform_server, classes="standard")
    base = f"{platform_server.base_url}/v1"
    chat = openai.AsyncOpenAI(base_url=base, api_key=chat_key, max_retries=0, timeout=60)
    bulk = openai.AsyncOpenAI(base_url=base, api_key=bulk_key, max_retries=0, timeout=120)
    samples: list[dict[str, Any]] = []

    async def scenario() -> tuple[list[float], int]:
        stop, done = asyncio.Event(), list[int]()
        flooding = asyncio.ensure_future(flood(bulk, stop, done))
        try:
            await interactive_ttfts(chat, 20)  # the controller settles
            samples.append(seats(platform_server))
            before = len(done)
            measured = await interactive_ttfts(chat, 20)
            samples.append(seats(platform_server))
            return measured, len(done) - before
        finally:
            stop.set()
            await flooding

    measured, flood_done = asyncio.run(scenario())

    assert len(measured) >= 20, measured
    assert p99(measured) * 1000 <= target, (sorted(measured)[-5:], samples)
    assert flood_done >= FLOOD_STREAMS, flood_done  # the flood still ran, bounded
    (bound,) = samples[-1]["bounds"]
    assert (bound["class"], bound["source"]) == ("interactive", "target"), samples
    assert bound["samples"] > 0
    # The bound held the flood under every seat and place of the engine (16 + 16).
    assert all(s["bounds"][0]["bound"] < s["seats"] + s["queued"] for s in samples), samples
