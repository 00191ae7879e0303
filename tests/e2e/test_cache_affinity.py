"""Prefix-cache affinity end to end: with two real vLLM CPU engines in one pool, a tenant's
second request goes to the engine that served its first, and finds its prefix in that
engine's cache, though the other engine has more room (docs/DISPATCH.md, Prefix-cache
affinity)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.e2e.conftest import MODEL, make_tenant, remove_engine
from tests.support.harness import Platform, free_port, start_engine_through_agent

SECOND = f"{MODEL}-b"


@pytest.fixture(scope="module")
def two_engines(platform_server: Platform) -> Iterator[dict[str, tuple[str, str]]]:
    """The session's engine and a second one serving the same model (one pool): each
    engine's address and key, for its own /metrics. The second stops and goes at the
    module's end."""
    port = str(free_port(avoid={platform_server.port}))
    platform_server.manage(
        "engine", "create", SECOND, "--served-model-name", MODEL, "--units", "4", "--port",
        port, "--max-model-len", "4096", "--max-num-seqs", "16",
    )  # fmt: skip
    try:
        start_engine_through_agent(platform_server, SECOND, timeout=600)
        urls = platform_server.shell(
            "import json; from scheduler.models import Engine; print(json.dumps({e.name: "
            f"e.base_url for e in Engine.objects.filter(name__in=[{MODEL!r}, {SECOND!r}])}}))"
        )
        yield {
            name: (urls[name], platform_server.manage("engine", "key", name).strip())
            for name in (MODEL, SECOND)
        }
    finally:
        remove_engine(platform_server, SECOND, timeout=120)


def cache_counters(engines: dict[str, tuple[str, str]]) -> dict[str, tuple[float, float]]:
    """Each engine's (prefix-cache hits, prefix-cache queries), in tokens."""
    found = {}
    for name, (base_url, key) in engines.items():
        text = httpx.get(
            f"{base_url}/metrics", headers={"Authorization": f"Bearer {key}"}, timeout=10
        ).text
        hits = queries = 0.0
        for line in text.splitlines():
            if line.startswith("vllm:prefix_cache_hits_total"):
                hits += float(line.rsplit(" ", 1)[1])
            elif line.startswith("vllm:prefix_cache_queries_total"):
                queries += float(line.rsplit(" ", 1)[1])
        found[name] = (hits, queries)
    return found


def counted(
    engines: dict[str, tuple[str, str]], since: dict[str, tuple[float, float]]
) -> dict[str, tuple[float, float]]:
    """The counters once an engine has counted a request since `since` (an engine counts
    its requests' prefix-cache lookups a moment after it answers)."""
    deadline = time.monotonic() + 10
    while True:
        now = cache_counters(engines)
        if now != since or time.monotonic() > deadline:
            return now
        time.sleep(0.2)


def test_a_tenants_second_request_goes_to_the_engine_that_holds_its_prefix(
    platform_server: Platform, two_engines: dict[str, tuple[str, str]]
) -> None:
    _, key = make_tenant(platform_server)
    client = openai.OpenAI(base_url=f"{platform_server.base_url}/v1", api_key=key, max_retries=0)
    # Unique, and long enough to fill several of the CPU engine's 128-token blocks.
    prompt = " ".join(f"{uuid.uuid4().hex} word{i}" for i in range(60))
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": prompt}]

    before = cache_counters(two_engines)
    first = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    after_first = counted(two_engines, before)
    (holder,) = [n for n in two_engines if after_first[n][1] > before[n][1]]
    (other,) = [n for n in two_engines if n != holder]
    assert first.usage is not None

    # A long answer of the same tenant holds KV on the holder: the other engine now has the
    # most free KV, where the pick without affinity would send the next request.
    long = client.chat.completions.create(
        model=MODEL, stream=True, max_tokens=3000,
        messages=[{"role": "user", "content": f"{uuid.uuid4().hex} tell a long story"}],
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    try:
        next(iter(long))  # it runs
        during = counted(two_engines, after_first)
        assert during[other] == after_first[other]  # it runs on the holder too
        second = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
        after_second = counted(two_engines, during)
    finally:
        long.close()

    assert after_second[other] == during[other]  # nothing of the second went there
    assert after_second[holder][0] > during[holder][0]  # the holder served it from its cache
    # The platform passes the engine's count of cached prompt tokens on: a whole block at least.
    assert second.usage is not None
    assert second.usage.prompt_tokens_details is not None
    assert (second.usage.prompt_tokens_details.cached_tokens or 0) >= 128
