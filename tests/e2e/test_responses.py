"""`POST /v1/responses` end to end, stateless: the official `openai` client -> web -> fair
queue -> the real vLLM CPU engine, whole and streamed, charged with the engine's real tokens."""

from __future__ import annotations

import json

import httpx

from tests.e2e.conftest import MODEL, make_tenant
from tests.e2e.test_online import client_for, scheduler_check, usage_rows, wait_for


def test_a_response_whole_and_streamed_is_charged_its_real_tokens(platform_server):
    slug, key = make_tenant(platform_server)
    client = client_for(platform_server, key)

    whole = client.responses.create(
        model=MODEL, input="tell me a story", instructions="Be brief.", max_output_tokens=8,
        store=True,  # accepted, and never kept: the engine is told store=false
    )  # fmt: skip
    assert whole.object == "response"
    assert isinstance(whole.output_text, str)
    assert whole.usage is not None
    assert whole.usage.input_tokens > 0
    assert 0 < whole.usage.output_tokens <= 8

    events = list(
        client.responses.create(
            model=MODEL, max_output_tokens=6, stream=True,
            input=[{"role": "user", "content": [{"type": "input_text", "text": "hello"}]}],
        )
    )  # fmt: skip
    kinds = [event.type for event in events]
    assert kinds[0] == "response.created"
    assert "response.output_text.delta" in kinds
    completed = events[-1]
    assert completed.type == "response.completed"
    streamed = completed.response.usage
    assert streamed is not None
    assert streamed.input_tokens > 0
    assert 0 < streamed.output_tokens <= 6

    rows = wait_for(lambda: (r := usage_rows(platform_server, slug)) and len(r) == 2 and r)
    assert {r["outcome"] for r in rows} == {"success"}
    charged = sorted((r["prompt_tokens"], r["completion_tokens"]) for r in rows)
    assert charged == sorted(
        [
            (whole.usage.input_tokens, whole.usage.output_tokens),
            (streamed.input_tokens, streamed.output_tokens),
        ]
    )
    report = scheduler_check(platform_server)
    assert "no drift" in report, report


def test_the_raw_stream_passes_the_engines_events_on_with_their_names(platform_server):
    _, key = make_tenant(platform_server)
    with httpx.stream(
        "POST", f"{platform_server.base_url}/v1/responses",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": MODEL, "input": "hi", "max_output_tokens": 4, "stream": True},
        timeout=60,
    ) as response:  # fmt: skip
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert lines[0] == "event: response.created"
    assert all(not line.endswith("[DONE]") for line in lines)  # OpenAI's Responses: no [DONE]
    names = [line.removeprefix("event: ") for line in lines[0::2]]
    datas = [json.loads(line.removeprefix("data: ")) for line in lines[1::2]]
    assert names == [data["type"] for data in datas]
    assert names[-1] == "response.completed"


def test_what_would_keep_state_in_a_shared_engine_is_refused_by_name(platform_server):
    _, key = make_tenant(platform_server)

    def post(**fields: object) -> httpx.Response:
        body = {"model": MODEL, "input": "hi", "max_output_tokens": 4, **fields}
        return httpx.post(
            f"{platform_server.base_url}/v1/responses", json=body,
            headers={"Authorization": f"Bearer {key}"}, timeout=60,
        )  # fmt: skip

    refused: list[tuple[dict[str, object], str]] = [
        ({"previous_response_id": "resp_123"}, "previous_response_id"),
        ({"background": True}, "background"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"tools": [{"type": "web_search"}]}, "tools"),
    ]
    for fields, param in refused:
        response = post(**fields)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == param
        assert error["type"] == "invalid_request_error"
