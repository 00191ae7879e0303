"""Tracing as an operator turns it on: the standard OTEL_* settings in the environment of
the platform's real processes (the web under `plumbing.serve`, a Celery worker, beat and the
engine agent, started as tests/e2e starts them), spans sent over OTLP/HTTP to a collector
(here the test's, which decodes what the exporter sends). One chat request gives one trace
made of the web's and the worker's spans, each process under its own service name; the
engine is an OpenAI-shaped stand-in on another node, so no engine process is started."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.scheduler.online.test_admission import MODEL, MODEL_CONFIG
from tests.support.harness import Database, Platform
from tests.tracing.test_request_trace import _Engine

REDIS_URL = os.environ.get("GPUSHARE_TRACING_REDIS_URL", "redis://127.0.0.1:6379/12")


class _Collector(BaseHTTPRequestHandler):
    """An OTLP/HTTP collector's /v1/traces: keeps (service name, span name, trace id, parent
    span id, span id) of each span."""

    spans: list[tuple[str, str, str, str, str]] = []

    def do_POST(self) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(self.rfile.read(int(self.headers["Content-Length"])))
        for resource_spans in request.resource_spans:
            attributes = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    _Collector.spans.append((
                        attributes.get("service.name", ""), span.name, span.trace_id.hex(),
                        span.parent_span_id.hex(), span.span_id.hex(),
                    ))  # fmt: skip
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def _serve(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def traced_platform(tmp_path: Path) -> Iterator[tuple[Platform, int]]:
    _Collector.spans, _Engine.seen = [], []
    collector, engine = _serve(_Collector), _serve(_Engine)
    database = Database(os.environ.get("DATABASE_URL", ""), tmp_path)
    import redis

    redis.Redis.from_url(REDIS_URL).flushdb()
    platform = Platform(tmp_path, database_url=database.url, redis_url=REDIS_URL)
    platform.env.update({
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{collector.server_address[1]}",
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # ms: spans leave each process at once
    })  # fmt: skip
    try:
        platform.start()
        yield platform, engine.server_address[1]
    finally:
        platform.stop()
        database.drop()
        collector.shutdown()
        engine.shutdown()


def test_the_platforms_processes_send_one_trace_per_request(traced_platform, tmp_path):
    platform, engine_port = traced_platform
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(MODEL_CONFIG))
    # A ready engine on a node no agent here runs: the stand-in answers for it.
    platform.shell(
        "import json\n"
        "from scheduler.models import Device, Engine, EngineStatus\n"
        "from scheduler.pools.policies import sync_engine\n"
        "d = Device.objects.create(node='elsewhere', kind='cpu', index=0, name='cpu',"
        " memory_bytes=2**34, capacity_units=64)\n"
        f"e = Engine.objects.create(name='e1', model_path={str(model_dir)!r},"
        f" served_model_name={MODEL!r}, device=d, footprint_units=4, host='127.0.0.1',"
        f" port={engine_port}, status=EngineStatus.READY, kv_capacity_tokens=10000,"
        " max_num_seqs=32)\n"
        "sync_engine(e)\n"
        "print(json.dumps(e.pk))\n"
    )
    key = platform.manage_json("tenant", "create", "acme", "--quota-units", "4")["api_key"]["key"]

    answer = httpx.post(
        f"{platform.base_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text

    wanted = {"gpushare.admit", "gpushare.queue.wait", "gpushare.answer", "gpushare.run",
              "gpushare.dispatch", "gpushare.engine"}  # fmt: skip
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if wanted <= {name for _, name, *_ in _Collector.spans}:
            break
        time.sleep(0.1)
    by_name = {name: (service, trace, parent, span) for service, name, trace, parent, span
               in _Collector.spans if name in wanted}  # fmt: skip
    assert set(by_name) == wanted, platform.logs()
    assert len({trace for _, trace, _, _ in by_name.values()}) == 1  # one trace
    services = {name: service for name, (service, *_) in by_name.items()}
    assert services["gpushare.admit"] == services["gpushare.answer"] == "gpushare-web"
    assert services["gpushare.run"] == services["gpushare.engine"] == "gpushare-worker"
    # The worker's run is the web's queue wait's child, across processes and Redis.
    assert by_name["gpushare.run"][2] == by_name["gpushare.queue.wait"][3]
    # The engine got the call's context.
    assert _Engine.seen[-1]["traceparent"].split("-")[2] == by_name["gpushare.engine"][3]
