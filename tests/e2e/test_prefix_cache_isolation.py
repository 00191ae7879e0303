"""Tenants share an engine, not its prefix cache: black-box, with the real vLLM CPU engine's
own counter of prefix-cache hits. A tenant's repeat of a long prompt hits the cache (whole
and streamed answers alike: the worker and the web both call the engine); another tenant
sending the same prompt finds nothing cached, so its time to first token cannot tell it what
the first one sent; and the salt a client sends is not the one the engine gets."""

from __future__ import annotations

import uuid

import httpx
import openai
from openai.types.chat import ChatCompletionMessageParam

from tests.e2e.conftest import MODEL, make_tenant
from tests.support.harness import Platform


def prefix_cache_hits(platform: Platform) -> float:
    """The engine's `vllm:prefix_cache_hits_total` (tokens served from its prefix cache)."""
    base_url = platform.shell(
        "import json; from scheduler.models import Engine; "
        f"print(json.dumps(Engine.objects.get(name='{MODEL}').base_url))"
    )
    key = platform.manage("engine", "key", MODEL).strip()  # the engine's /metrics needs it
    auth = {"Authorization": f"Bearer {key}"}
    metrics = httpx.get(f"{base_url}/metrics", headers=auth, timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("vllm:prefix_cache_hits_total")
    )


def ask(platform: Platform, key: str, prompt: str, *, stream: bool, salt: str = "") -> None:
    client = openai.OpenAI(base_url=f"{platform.base_url}/v1", api_key=key, max_retries=0)
    extra = {"cache_salt": salt} if salt else None
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": prompt}]
    if stream:
        chunks = client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=2, stream=True, extra_body=extra
        )
        assert list(chunks)
    else:
        answer = client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=2, extra_body=extra
        )
        assert answer.choices


def test_a_tenants_cached_prefix_is_never_served_to_another_tenant(platform_server) -> None:
    _, key_a = make_tenant(platform_server)
    _, key_b = make_tenant(platform_server)
    # Long enough to fill many KV blocks; unique so that nothing before this test cached it.
    prompt = " ".join(f"{uuid.uuid4().hex} word{i}" for i in range(40))

    ask(platform_server, key_a, prompt, stream=False)
    before_repeat = prefix_cache_hits(platform_server)
    ask(platform_server, key_a, prompt, stream=False)
    ask(platform_server, key_a, prompt, stream=True)
    after_repeats = prefix_cache_hits(platform_server)
    assert after_repeats > before_repeat  # a tenant's own prefixes are shared

    ask(platform_server, key_b, prompt, stream=False)
    after_b = prefix_cache_hits(platform_server)
    assert after_b == after_repeats  # nothing of A's served to B

    # B's repeat hits B's own prefix, though it asks for a salt of its own choosing: the
    # platform sets the salt, not the client.
    ask(platform_server, key_b, prompt, stream=True, salt="guess")
    assert prefix_cache_hits(platform_server) > after_b
