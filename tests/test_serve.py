"""The web's launcher (`python -m config.serve`): uvicorn's command line with a server that
wakes once a second, in one process and in `--workers` children; a real process serves and
stops on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import uvicorn
from uvicorn.supervisors import multiprocess

from config import serve
from tests.e2e.harness import free_port

REPO = Path(__file__).resolve().parent.parent


async def _noop_app(scope, receive, send):  # pragma: no cover - never called
    pass


def test_each_tick_counts_as_uvicorns_once_a_second_work(monkeypatch):
    """uvicorn refreshes its `date` header when the tick counter is a multiple of 10: every
    one of our ticks must be one, or the header would go stale for ten of them."""
    monkeypatch.setattr(serve, "TICK_S", 0.01)
    server = serve.CalmServer(uvicorn.Config(_noop_app))
    seen: list[int] = []

    async def on_tick(counter: int) -> bool:
        seen.append(counter)
        return len(seen) == 5

    monkeypatch.setattr(server, "on_tick", on_tick)
    asyncio.run(server.main_loop())
    assert seen == [0, 10, 20, 30, 40]


@pytest.fixture
def installed():
    command_line = serve._command_line()
    server, worker = command_line.Server, multiprocess.Process
    serve.install()
    yield
    command_line.Server = server
    multiprocess.Process = worker  # type: ignore[misc]


def test_install_makes_uvicorns_command_line_and_its_workers_build_the_calm_server(installed):
    assert serve._command_line().Server is serve.CalmServer
    worker = multiprocess.Process(uvicorn.Config(_noop_app), sockets=[])
    assert isinstance(worker.server, serve.CalmServer)


def test_a_real_process_serves_with_a_date_header_and_stops_on_sigterm():
    port = free_port()
    command = [sys.executable, "-m", "config.serve", "config.asgi:application",
               "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]  # fmt: skip
    process = subprocess.Popen(command, cwd=REPO, env=os.environ.copy())
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, "the web exited"
            try:
                response = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the web did not answer within 60 s"
                time.sleep(0.2)
        assert response.status_code == 200
        assert response.headers["date"].endswith(" GMT")
        process.send_signal(signal.SIGTERM)
        # uvicorn shuts down, then raises the signal it caught again: the exit says SIGTERM.
        assert process.wait(timeout=10) == -signal.SIGTERM
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
