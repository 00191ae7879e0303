"""The gate in front of every route of an engine (engine_side/gpushare_engine_gate.py), as
pure ASGI logic with a stand-in application. On the real vLLM CPU engine:
tests/e2e/test_engine_vllm_cpu.py."""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import json
import sys
from types import ModuleType
from typing import Any

import pytest

from scheduler.engines.launch import ENGINE_SIDE_DIR, GATE_MIDDLEWARE

KEY = "k" * 64


def load_gate() -> ModuleType:
    module_name, _ = GATE_MIDDLEWARE.split(".")
    path = ENGINE_SIDE_DIR / f"{module_name}.py"
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gate_module = load_gate()


def call(scope: dict[str, Any], key: str | None = KEY) -> tuple[list[dict[str, Any]], bool]:
    """The messages the gate sent and whether the application behind it was called."""
    reached: list[bool] = []
    sent: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(True)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        sent.append(message)

    gate = gate_module.EngineKeyGate(app, key=key)
    asyncio.run(gate(scope, receive, send))
    return sent, bool(reached)


def http(path: str, method: str = "POST", authorization: bytes | None = None) -> dict[str, Any]:
    headers = [(b"host", b"127.0.0.1:8100"), (b"content-type", b"application/json")]
    if authorization is not None:
        headers.append((b"authorization", authorization))
    return {"type": "http", "method": method, "path": path, "headers": headers}


PATHS = ["/invocations", "/tokenize", "/metrics", "/pooling", "/score", "/rerank",
         "/classify", "/v1/completions", "/v2/rerank", "/openapi.json", "/docs", "/",
         "/health/", "//health", "/health/../v1/models", "/a-route-vllm-adds-later"]  # fmt: skip


WRONG = [None, b"", b"Bearer", b"Bearer ", b"Basic " + KEY.encode(), KEY.encode(),
         b"Bearer " + KEY.encode() + b"x", b"Bearer " + KEY[:-1].encode(),
         b"Bearer EMPTY"]  # fmt: skip


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("authorization", WRONG)
def test_every_path_but_health_is_refused_without_the_key(path, authorization) -> None:
    for method in ("POST", "GET", "OPTIONS", "HEAD"):
        sent, reached = call(http(path, method, authorization))
        assert not reached
        assert sent[0]["status"] == 401
        error = json.loads(sent[1]["body"])["error"]
        assert error["code"] == "invalid_api_key"
        assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize("path", PATHS)
def test_the_key_opens_every_path(path) -> None:
    for scheme in (b"Bearer ", b"bearer "):
        sent, reached = call(http(path, authorization=scheme + KEY.encode()))
        assert reached
        assert sent == []


def test_health_answers_anyone_and_the_server_s_own_events_pass() -> None:
    assert call(http("/health", "GET")) == ([], True)
    assert call({"type": "lifespan"}) == ([], True)


def test_a_websocket_without_the_key_is_closed_before_it_is_accepted() -> None:
    scope: dict[str, Any] = {"type": "websocket", "path": "/v1/realtime", "headers": []}
    sent, reached = call(scope)
    assert not reached
    assert sent == [{"type": "websocket.close", "code": 1008}]
    scope["headers"] = [(b"authorization", b"Bearer " + KEY.encode())]
    assert call(scope) == ([], True)


def test_an_engine_without_a_key_refuses_everything_but_health(monkeypatch) -> None:
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    for key in ("", None):
        sent, reached = call(http("/v1/models", authorization=b"Bearer "), key=key)
        assert not reached
        assert sent[0]["status"] == 401
    assert call(http("/health", "GET"), key="")[1]


def test_the_key_is_read_from_the_engines_environment(monkeypatch) -> None:
    monkeypatch.setenv("VLLM_API_KEY", "from-env")
    assert gate_module.EngineKeyGate(None).allows([(b"Authorization", b"Bearer from-env")])
    assert not gate_module.EngineKeyGate(None).allows([(b"authorization", b"Bearer other")])


def test_the_engines_path_holds_the_gate_and_its_site_importing_the_standard_library() -> None:
    # The folder is the engine's whole PYTHONPATH: the gate, and the start-up of every one of
    # its processes (sitecustomize.py: tests/scheduler/engines/test_engine_side_site.py).
    files = {p.name for p in ENGINE_SIDE_DIR.iterdir() if p.name != "__pycache__"}
    assert files == {"gpushare_engine_gate.py", "sitecustomize.py"}
    for name in files:
        tree = ast.parse((ENGINE_SIDE_DIR / name).read_text())
        imported = {
            (node.module or "" if isinstance(node, ast.ImportFrom) else alias.name).split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom)
            for alias in node.names
        }
        assert imported - {"__future__"} <= sys.stdlib_module_names, name


def test_the_scrape_token_opens_metrics_and_nothing_else() -> None:
    scrape = b"Bearer scrape-token"

    def gate(token: str) -> Any:
        return gate_module.EngineKeyGate(None, key=KEY, metrics_token=token)

    assert gate("scrape-token").allows([(b"authorization", scrape)], "/metrics")
    for path in ("/metrics/", "/v1/completions", "/tokenize", "/invocations"):
        assert not gate("scrape-token").allows([(b"authorization", scrape)], path)
    assert not gate("").allows([(b"authorization", b"Bearer ")], "/metrics")
    assert gate("scrape-token").allows([(b"authorization", b"Bearer " + KEY.encode())], "/tokenize")
