"""`/v1/embeddings` end to end: an `embed` engine (vLLM's pooling runner over the demo
model) started beside the demo engine, the official `openai` client, the fair queue, the
worker and the ledger; each model refuses the other kind of request."""

from __future__ import annotations

import base64

import openai
import pytest

from tests.e2e.conftest import MODEL, make_tenant, remove_engine
from tests.e2e.test_online import client_for, scheduler_check, usage_rows, wait_for
from tests.support.harness import Platform, free_port

ENGINE = "embed-e2e"
EMBED_MODEL = f"{MODEL}-embed"


@pytest.fixture(scope="module")
def embed_engine(platform_server: Platform):
    platform_server.manage(
        "engine", "create", ENGINE, "--served-model-name", EMBED_MODEL, "--task", "embed",
        "--units", "4", "--port", str(free_port()), "--max-model-len", "512", "--if-missing",
    )  # fmt: skip
    try:
        started = platform_server.manage("engine", "start", ENGINE, timeout=600)
        assert "READY" in started, started
        yield ENGINE
    finally:
        remove_engine(platform_server, ENGINE)


def test_embeddings_are_served_queued_and_charged(platform_server, embed_engine):
    slug, key = make_tenant(platform_server)
    client = client_for(platform_server, key)
    models = [m.id for m in client.models.list()]
    assert EMBED_MODEL in models

    one = client.embeddings.create(model=EMBED_MODEL, input="the quick brown fox")
    assert len(one.data) == 1
    width = len(one.data[0].embedding)
    assert width > 0
    assert all(isinstance(x, float) for x in one.data[0].embedding)
    assert one.usage.prompt_tokens > 0

    many = client.embeddings.create(
        model=EMBED_MODEL, input=["first text", "a second, longer text", "third"]
    )
    assert [d.index for d in many.data] == [0, 1, 2]
    assert {len(d.embedding) for d in many.data} == {width}
    # The same text embeds the same, whoever's requests run beside it.
    again = client.embeddings.create(model=EMBED_MODEL, input=["third"])
    assert again.data[0].embedding == pytest.approx(many.data[2].embedding, abs=1e-4)

    raw = client.embeddings.with_raw_response.create(
        model=EMBED_MODEL, input="packed", encoding_format="base64"
    )
    assert raw.headers["x-request-id"]
    packed = raw.parse().data[0].embedding
    # The client decodes base64 itself when it asked for floats; asked for base64, it is text.
    assert isinstance(packed, str)
    assert len(base64.b64decode(packed)) == 4 * width

    rows = wait_for(lambda: (r := usage_rows(platform_server, slug)) and len(r) == 4 and r)
    assert {r["outcome"] for r in rows} == {"success"}
    assert {r["model"] for r in rows} == {EMBED_MODEL}
    assert all(r["completion_tokens"] == 0 and r["prompt_tokens"] > 0 for r in rows)
    assert sum(r["prompt_tokens"] for r in rows) >= one.usage.prompt_tokens + 3
    assert raw.headers["x-request-id"] in {r["request_id"] for r in rows}
    report = scheduler_check(platform_server)
    assert "no drift" in report, report


def test_each_model_refuses_the_other_kind_of_request(platform_server, embed_engine):
    _, key = make_tenant(platform_server)
    client = client_for(platform_server, key)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model=EMBED_MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
    assert refused.value.code == "model_not_supported"
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model=MODEL, input="hi")
    assert refused.value.code == "model_not_supported"
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model=EMBED_MODEL, input="hi", extra_body={"stream": True})
    assert refused.value.param == "stream"
