"""LoRA adapters end to end: an engine of the demo model with one adapter slot, two adapters
of one tenant registered with `manage.py adapter register` (scripts/make_tiny_adapters.py),
the official `openai` client. An answer through an adapter differs from the base model's;
another tenant finds no such model; the engine loads an adapter when a request names it and
unloads its least recently used one to make room; a batch line names one; an adapter the
engine cannot load is an error, not a retry; a removed adapter is unloaded and refused."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import httpx
import openai
import pytest

from tests.e2e.conftest import MODEL, make_tenant, remove_engine
from tests.e2e.test_batches import jsonl, wait_batch
from tests.e2e.test_online import client_for, wait_for
from tests.support.adapters import write_adapter
from tests.support.harness import Platform, free_port

ENGINE = "lora-e2e"
BASE = f"{MODEL}-lora"
PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def lora_engine(platform_server: Platform):
    platform_server.manage(
        "engine", "create", ENGINE, "--served-model-name", BASE, "--units", "4",
        "--port", str(free_port()), "--max-model-len", "512", "--max-num-seqs", "8",
        "--max-loras", "1", "--max-lora-rank", "8", "--if-missing",
    )  # fmt: skip
    try:
        started = platform_server.manage("engine", "start", ENGINE, timeout=600)
        assert "READY" in started, started
        yield ENGINE
    finally:
        remove_engine(platform_server, ENGINE)


def complete(client: openai.OpenAI, model: str) -> str:
    answer = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0)
    assert answer.model == model
    return answer.choices[0].text


def loaded(platform: Platform) -> dict[str, list[str]]:
    rows = json.loads(platform.manage("adapter", "list", "--json"))
    return {row["name"]: row["loaded_on"] for row in rows}


def engine_models(platform: Platform) -> set[str]:
    """What the engine itself serves now (its /v1/models, with its key)."""
    url = platform.shell(
        "import json; from scheduler.models import Engine; "
        f"print(json.dumps(Engine.objects.get(name='{ENGINE}').base_url))"
    )
    key = platform.manage("engine", "key", ENGINE).strip()
    answer = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=10)
    return {m["id"] for m in answer.json()["data"]}


def ask(platform: Platform, key: str, model: str) -> httpx.Response:
    return httpx.post(
        f"{platform.base_url}/v1/completions",
        json={"model": model, "prompt": PROMPT, "max_tokens": 2},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )


def not_found(platform: Platform, key: str, model: str) -> dict:
    """The 404's error, the model's name in it made `MODEL`."""
    response = ask(platform, key, model)
    assert response.status_code == 404, response.text
    error = response.json()["error"]
    assert error["code"] == "model_not_found"
    return {k: str(v).replace(model, "MODEL") for k, v in error.items()}


def test_adapters_are_loaded_called_refused_and_unloaded(
    platform_server: Platform, lora_engine: str, tmp_path: Path
):
    owner, key = make_tenant(platform_server)
    _, other_key = make_tenant(platform_server)
    tag = uuid.uuid4().hex[:6]
    first, second = f"ft-{tag}-a", f"ft-{tag}-b"
    for name, seed in ((first, "tiny-a"), (second, "tiny-b")):
        folder = write_adapter(tmp_path, seed)
        registered = platform_server.manage(
            "adapter", "register", owner, name, "--base", BASE, "--from", str(folder)
        )
        assert f"Registered adapter '{name}'" in registered
    client, other = client_for(platform_server, key), client_for(platform_server, other_key)

    # Each tenant's /v1/models: its own adapters only.
    assert {BASE, first, second} <= {m.id for m in client.models.list()}
    theirs = {m.id for m in other.models.list()}
    assert BASE in theirs
    assert not {first, second} & theirs

    # An answer through an adapter is not the base model's; the engine loaded it for it.
    base = complete(client, BASE)
    through_first = complete(client, first)
    assert through_first != base
    assert loaded(platform_server)[first] == [ENGINE]

    # Another tenant naming it gets what an unknown model gets, word for word.
    assert not_found(platform_server, other_key, first) == not_found(
        platform_server, other_key, f"no-such-{tag}"
    )

    # The engine holds one adapter: a stream through the second unloads the first.
    stream = client.chat.completions.create(
        model=second, messages=[{"role": "user", "content": PROMPT}], max_tokens=8,
        temperature=0, stream=True,
    )  # fmt: skip
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert loaded(platform_server) == {first: [], second: [ENGINE]}
    assert first not in engine_models(platform_server)
    # ... and the first comes back when asked for, with the same weights.
    assert complete(client, first) == through_first

    # A batch line may name an adapter.
    line = {
        "custom_id": "one", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": second, "messages": [{"role": "user", "content": PROMPT}],
                 "max_tokens": 8, "temperature": 0},
    }  # fmt: skip
    uploaded = client.files.create(file=("in.jsonl", json.dumps(line).encode()), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    batch = wait_batch(client, batch.id)
    assert batch.status == "completed", batch
    [output] = jsonl(client, batch.output_file_id)
    assert output["response"]["status_code"] == 200
    assert output["response"]["body"]["model"] == second

    # An adapter whose weights vLLM cannot read is answered with an error, not retried, and
    # the engine goes on serving.
    broken = write_adapter(tmp_path, "tiny-c")
    (broken / "adapter_model.safetensors").write_bytes(b"not a safetensors file")
    third = f"ft-{tag}-c"
    platform_server.manage(
        "adapter", "register", owner, third, "--base", BASE, "--from", str(broken)
    )
    with pytest.raises(openai.InternalServerError, match="could not be loaded"):
        complete(client, third)
    assert complete(client, first) == through_first

    # Removed: unloaded from the engine and, within the adapters' cache, refused.
    assert "Removed" in platform_server.manage("adapter", "remove", second)
    assert second not in engine_models(platform_server)
    assert second not in loaded(platform_server)
    wait_for(lambda: ask(platform_server, key, second).status_code == 404, timeout=15)
    assert not_found(platform_server, key, second)["message"] == "The model 'MODEL' does not exist."
    assert second not in {m.id for m in client.models.list()}
