"""The web's launcher (`python -m plumbing.serve`): uvicorn's command line with a server that
wakes once a second, in one process and in `--workers` children, and keeps idle connections
longer than clients do; a real process serves, keeps a connection idle past 5 s, and stops on
SIGTERM."""

from __future__ import annotations

import asyncio
import http.client
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

from plumbing import serve
from tests.support.harness import free_port

REPO = Path(__file__).resolve().parents[2]


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


@pytest.mark.parametrize(
    ("extra", "expected"), [([], serve.KEEP_ALIVE_S), (["--timeout-keep-alive", "7"], 7)]
)
def test_idle_connections_stay_open_longer_than_clients_keep_them_unless_told(
    installed, monkeypatch, extra, expected
):
    seen: dict[str, object] = {}
    monkeypatch.setattr(serve._command_line(), "run", lambda app, **options: seen.update(options))
    monkeypatch.setattr(sys, "argv", ["serve", "config.asgi:application", *extra])
    with pytest.raises(SystemExit) as ended:
        serve.main()
    assert ended.value.code == 0
    assert seen["timeout_keep_alive"] == expected
    assert expected > httpx.Limits().keepalive_expiry  # the client lets go first


def _status_on(connection: http.client.HTTPConnection, path: str) -> int:
    connection.request("GET", path)
    response = connection.getresponse()
    response.read()
    return response.status


def test_a_real_process_serves_with_a_date_header_and_stops_on_sigterm():
    port = free_port()
    command = [sys.executable, "-m", "plumbing.serve", "config.asgi:application",
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
        # A connection idle past uvicorn's own 5 s is still open and answers.
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            assert _status_on(connection, "/healthz") == 200
            first = connection.sock
            time.sleep(6)
            assert _status_on(connection, "/healthz") == 200  # not RemoteDisconnected
            assert connection.sock is first
        finally:
            connection.close()
        process.send_signal(signal.SIGTERM)
        # uvicorn shuts down, then raises the signal it caught again: the exit says SIGTERM.
        assert process.wait(timeout=10) == -signal.SIGTERM
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
