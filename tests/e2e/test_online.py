"""The online path end to end: the official `openai` client -> web -> fair queue -> a real
Celery worker -> the real vLLM CPU engine, and back."""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest

from tests.e2e.conftest import MODEL, make_tenant
from tests.support.harness import Platform


def client_for(platform: Platform, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{platform.base_url}/v1", api_key=key, max_retries=0)


def usage_rows(platform: Platform, slug: str) -> list[dict]:
    return platform.shell(
        "import json; from tenants.models import UsageRecord as U; print(json.dumps(list("
        f"U.objects.filter(tenant__slug='{slug}').values('request_id', 'outcome', "
        "'prompt_tokens', 'completion_tokens', 'request_class', 'model', 'engine', "
        "'queue_wait_ms', 'ttft_ms', 'latency_ms', 'reserved_unit_seconds', 'error_code', "
        "'status_code'))))"
    )


def wait_for(predicate, timeout: float = 20.0, interval: float = 0.3):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError("condition not met in time")


def scheduler_check(platform: Platform) -> str:
    return platform.manage("scheduler", "check")


def test_a_tenant_lists_the_model_and_gets_chat_and_completions(platform_server):
    slug, key = make_tenant(platform_server)
    client = client_for(platform_server, key)
    assert [m.id for m in client.models.list()] == [MODEL]

    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello there"}], max_tokens=12
    )
    assert chat.choices[0].message.role == "assistant"
    assert isinstance(chat.choices[0].message.content, str)
    assert chat.usage is not None
    assert chat.usage.prompt_tokens > 0
    assert 0 < chat.usage.completion_tokens <= 12

    completion = client.completions.create(model=MODEL, prompt="once upon a time", max_tokens=8)
    assert completion.choices[0].text is not None
    assert completion.usage is not None
    assert 0 < completion.usage.completion_tokens <= 8

    rows = wait_for(lambda: (r := usage_rows(platform_server, slug)) and len(r) == 2 and r)
    assert {r["outcome"] for r in rows} == {"success"}
    by_tokens = {r["completion_tokens"] for r in rows}
    assert by_tokens == {chat.usage.completion_tokens, completion.usage.completion_tokens}
    assert all(r["model"] == MODEL and r["engine"] == MODEL for r in rows)
    assert all(r["reserved_unit_seconds"] > 0 and r["latency_ms"] > 0 for r in rows)


def test_streaming_chat_and_completion_end_with_usage_when_asked(platform_server):
    _, key = make_tenant(platform_server)
    client = client_for(platform_server, key)
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "stream please"}],
            max_tokens=10, stream=True, stream_options={"include_usage": True},
        )
    )  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert chunks[-1].usage is not None
    assert 0 < chunks[-1].usage.completion_tokens <= 10

    plain = list(client.completions.create(model=MODEL, prompt="abc", max_tokens=6, stream=True))
    assert plain
    assert all(getattr(c, "usage", None) is None for c in plain)


def test_the_raw_stream_is_openai_sse_ending_with_done(platform_server):
    _, key = make_tenant(platform_server)
    with httpx.stream(
        "POST", f"{platform_server.base_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
              "stream": True},
        timeout=60,
    ) as response:  # fmt: skip
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    first = json.loads(lines[0].removeprefix("data: "))
    assert first["object"] == "chat.completion.chunk"


def post(platform: Platform, key: str | None, body: object, **headers: str) -> httpx.Response:
    if key:
        headers["Authorization"] = f"Bearer {key}"
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers.setdefault("Content-Type", "application/json")
    return httpx.post(
        f"{platform.base_url}/v1/chat/completions", content=content, headers=headers, timeout=60
    )


CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def assert_openai_error(response: httpx.Response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "code", "param"}
    if code is not None:
        assert error["code"] == code, error
    return error


def test_each_error_has_its_status_and_openai_shape(platform_server):
    _, key = make_tenant(platform_server, classes="standard", rpm="3")
    assert_openai_error(post(platform_server, None, CHAT), 401, "invalid_api_key")
    assert_openai_error(post(platform_server, "gs-wrong", CHAT), 401, "invalid_api_key")
    assert_openai_error(
        post(platform_server, key, CHAT, **{"X-Request-Class": "interactive"}), 403,
        "class_not_allowed",
    )  # fmt: skip
    assert_openai_error(
        post(platform_server, key, {**CHAT, "model": "nope"}), 404, "model_not_found"
    )
    assert_openai_error(post(platform_server, key, b"{not json"), 400)
    assert_openai_error(post(platform_server, key, b"\xff\xfe"), 400)
    error = assert_openai_error(post(platform_server, key, {**CHAT, "max_tokens": -1}), 400)
    assert error["param"] == "max_tokens"
    assert_openai_error(
        post(platform_server, key, {**CHAT, "max_tokens": 10_000}), 400, "context_length_exceeded"
    )
    assert_openai_error(post(platform_server, key, b"x" * (5 * 1024 * 1024)), 413)
    # The 3-per-minute limit counts the request refused for its length (the engine counted
    # its prompt, so the limits counted it first) and two answered; the next gets 429.
    assert post(platform_server, key, CHAT).status_code == 200
    assert post(platform_server, key, CHAT).status_code == 200
    limited = post(platform_server, key, CHAT)
    assert_openai_error(limited, 429, "rate_limit_exceeded")
    assert int(limited.headers["Retry-After"]) >= 1


def test_a_model_the_tenant_may_not_use_is_403(platform_server):
    _, key = make_tenant(platform_server, models="some-other-model")
    assert_openai_error(post(platform_server, key, CHAT), 403, "model_not_allowed")
    assert client_for(platform_server, key).models.list().data == []


def test_a_request_larger_than_quota_and_burst_is_refused_not_queued(platform_server):
    # 0 units of quota: no reservation can ever fit.
    _, key = make_tenant(platform_server, quota_units="0")
    assert_openai_error(post(platform_server, key, CHAT), 429, "insufficient_quota")


def test_two_tenants_at_once_both_get_answers(platform_server):
    keys = [make_tenant(platform_server)[1] for _ in range(2)]
    answers: dict[int, list[int]] = {0: [], 1: []}

    def send(index: int) -> None:
        client = client_for(platform_server, keys[index])
        for _ in range(4):
            chat = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": f"tenant {index}"}],
                max_tokens=16,
            )  # fmt: skip
            answers[index].append(chat.usage.completion_tokens if chat.usage else 0)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert [len(answers[0]), len(answers[1])] == [4, 4]
    assert all(tokens > 0 for tokens in answers[0] + answers[1])


def test_a_cancelled_stream_frees_its_reservation(platform_server):
    slug, key = make_tenant(platform_server)
    # 4,000 tokens take the tiny model seconds: long enough to go away in the middle.
    body = {**CHAT, "max_tokens": 4000, "stream": True, "ignore_eos": True}
    with httpx.stream(
        "POST", f"{platform_server.base_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"}, json=body, timeout=60,
    ) as response:  # fmt: skip
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: {"):
                break  # one chunk, then the client goes away
    rows = wait_for(lambda: usage_rows(platform_server, slug), timeout=60)
    assert rows[0]["outcome"] == "cancelled", rows
    assert rows[0]["completion_tokens"] < 4000
    report = scheduler_check(platform_server)
    assert "no drift" in report, report


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_get_on_an_inference_endpoint_is_refused_cleanly(platform_server, path):
    _, key = make_tenant(platform_server)
    response = httpx.get(
        platform_server.base_url + path, headers={"Authorization": f"Bearer {key}"}
    )
    assert response.status_code in (400, 405)
    assert "error" in response.json()


def test_n_samples_and_a_list_of_prompts_are_served_and_charged_whole(platform_server):
    slug, key = make_tenant(platform_server)
    client = client_for(platform_server, key)
    # lm-evaluation-harness's `local-completions` with batch_size > 1: a list of prompts.
    listed = client.completions.create(
        model=MODEL, prompt=["one", "two words", "and three words"], max_tokens=4, n=2,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert sorted(c.index for c in listed.choices) == list(range(6))
    assert listed.usage is not None
    assert listed.usage.completion_tokens == 6 * 4
    samples = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "pick a number"}], max_tokens=3,
        n=3, stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )  # fmt: skip
    chunks = list(samples)
    assert {c.choices[0].index for c in chunks if c.choices} == {0, 1, 2}
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 3 * 3
    rows = wait_for(lambda: (r := usage_rows(platform_server, slug)) and len(r) == 2 and r)
    assert sorted(r["completion_tokens"] for r in rows) == [9, 24]
    assert {r["outcome"] for r in rows} == {"success"}
    report = scheduler_check(platform_server)
    assert "no drift" in report, report


def test_a_flex_service_tier_runs_as_offline_work(platform_server):
    slug, key = make_tenant(platform_server)
    client = client_for(platform_server, key)
    answer = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "whenever"}], max_tokens=4,
        service_tier="flex",
    )  # fmt: skip
    assert answer.choices
    rows = wait_for(lambda: usage_rows(platform_server, slug))
    assert rows[0]["request_class"] == "offline"


def test_raw_answers_carry_the_request_id_and_the_rate_limit_headers(platform_server):
    slug, key = make_tenant(platform_server, rpm="100", tpm="100000")
    client = client_for(platform_server, key)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=4
    )
    answer = raw.parse()
    assert answer.choices
    assert raw.headers["x-ratelimit-limit-requests"] == "100"
    assert raw.headers["x-ratelimit-remaining-requests"] == "99"
    assert raw.headers["x-ratelimit-limit-tokens"] == "100000"
    assert int(raw.headers["x-ratelimit-remaining-tokens"]) < 100000
    assert raw.headers["x-ratelimit-reset-requests"].endswith("s")
    rows = wait_for(lambda: usage_rows(platform_server, slug))
    assert raw.headers["x-request-id"] == rows[0]["request_id"]
    # A streamed answer carries them too, and the official client exposes its id.
    with client.completions.with_streaming_response.create(
        model=MODEL, prompt="abc", max_tokens=3, stream=True
    ) as streamed:
        assert streamed.headers["x-ratelimit-remaining-requests"] == "98"
        assert streamed.headers["x-request-id"]
        assert list(streamed.iter_lines())
