"""What a hostile tenant's requests cost on the real platform and the real vLLM CPU engine:
a client that hangs up is charged what the engine did, an answer that could not fit is
refused before it runs, a whole answer its client left is aborted in the engine, the
prompt's logprobs stay an operator's choice on chat too, and a stream's large events pass
whole (docs/SECURITY.md)."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.e2e.conftest import MODEL, make_tenant
from tests.e2e.test_online import scheduler_check, usage_rows, wait_for
from tests.support.harness import Platform

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me everything."}]}


def post(
    platform: Platform, key: str, path: str, body: dict, timeout: float = 60
) -> httpx.Response:
    return httpx.post(
        f"{platform.base_url}{path}", headers={"Authorization": f"Bearer {key}"}, json=body,
        timeout=timeout,
    )  # fmt: skip


def engine_gauge(platform: Platform, name: str) -> float:
    """A gauge of the engine's /metrics, asked with its key."""
    found = platform.shell(
        "import json; from scheduler.models import Engine; "
        f"print(json.dumps(Engine.objects.get(name='{MODEL}').base_url))"
    )
    key = platform.manage("engine", "key", MODEL).strip()
    metrics = httpx.get(
        f"{found}/metrics", headers={"Authorization": f"Bearer {key}"}, timeout=10
    ).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
    )


def test_a_stream_its_client_hangs_up_on_is_charged_what_the_engine_did(platform_server):
    slug, key = make_tenant(platform_server)
    body = {**CHAT, "max_tokens": 4000, "stream": True, "ignore_eos": True}
    read = 0
    with httpx.stream(
        "POST", f"{platform_server.base_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"}, json=body, timeout=60,
    ) as response:  # fmt: skip
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: {"):
                read += 1
                if read == 20:
                    break  # then the client goes away
    rows = wait_for(lambda: usage_rows(platform_server, slug), timeout=60)
    assert rows[0]["outcome"] == "cancelled", rows
    assert rows[0]["prompt_tokens"] > 0  # the prompt was prefilled
    assert 20 <= rows[0]["completion_tokens"] < 4000  # and at least what the client read
    report = scheduler_check(platform_server)
    assert "no drift" in report, report


def test_chat_echo_with_logprobs_is_refused_without_the_operator_s_opt_in(platform_server):
    slug, key = make_tenant(platform_server)
    body = {**CHAT, "max_tokens": 2, "echo": True, "logprobs": True}
    refused = post(platform_server, key, "/v1/chat/completions", body)
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "echo"
    platform_server.manage("tenant", "update", slug, "--enable-fields", "prompt_logprobs")
    allowed = wait_for(
        lambda: (r := post(platform_server, key, "/v1/chat/completions", body)).status_code
        == 200 and r, timeout=30,
    )  # fmt: skip
    assert allowed.json()["prompt_logprobs"]  # what the opt-in is for: the engine computed them


def test_an_answer_that_could_not_fit_is_refused_before_it_runs(platform_server):
    """The probe: n=64, no max_tokens, top_logprobs 20, not streamed (about 141 MB)."""
    _, key = make_tenant(platform_server, quota_units="64")
    body = {**CHAT, "n": 64, "logprobs": True, "top_logprobs": 20}
    started = time.monotonic()
    refused = post(platform_server, key, "/v1/chat/completions", body)
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert (error["code"], error["param"]) == ("answer_too_large", "top_logprobs")
    assert time.monotonic() - started < 5
    assert engine_gauge(platform_server, "vllm:num_requests_running") == 0


def test_a_whole_answer_its_client_leaves_is_aborted_in_the_engine(platform_server):
    slug, key = make_tenant(platform_server)
    body = {**CHAT, "max_tokens": 1900, "n": 4, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        post(platform_server, key, "/v1/chat/completions", body, timeout=3)
    assert wait_for(
        lambda: engine_gauge(platform_server, "vllm:num_requests_running") == 0, timeout=15
    )
    rows = wait_for(lambda: usage_rows(platform_server, slug), timeout=30)
    assert rows[0]["outcome"] == "cancelled"
    assert rows[0]["prompt_tokens"] > 0


def test_a_responses_stream_whose_last_event_is_larger_than_128_kib_ends_whole(platform_server):
    """The last event holds the whole response: with 20 logprobs a token, some hundreds of
    tokens take it past the 128 KiB line aiohttp reads by default."""
    slug, key = make_tenant(platform_server)
    body = {
        "model": MODEL, "input": "Count.", "max_output_tokens": 1500, "stream": True,
        "top_logprobs": 20, "include": ["message.output_text.logprobs"],
        "logit_bias": {"2": -100},  # never the end of sequence: every token it may have
    }  # fmt: skip
    events: list[dict] = []
    with httpx.stream(
        "POST", f"{platform_server.base_url}/v1/responses",
        headers={"Authorization": f"Bearer {key}"}, json=body, timeout=120,
    ) as response:  # fmt: skip
        assert response.status_code == 200
        longest = 0
        for line in response.iter_lines():
            if line.startswith("data: "):
                longest = max(longest, len(line))
                events.append(json.loads(line[6:]))
    assert events[-1]["type"] == "response.completed", [e["type"] for e in events[-3:]]
    assert longest > 128 * 1024
    usage = events[-1]["response"]["usage"]
    rows = wait_for(lambda: usage_rows(platform_server, slug), timeout=30)
    assert (rows[0]["outcome"], rows[0]["completion_tokens"]) == ("success", usage["output_tokens"])
