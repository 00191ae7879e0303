"""The console starts and stops a real vLLM CPU engine: the buttons queue a Celery task on
the engine's node, the node's engine agent runs the supervisor, and the engine's page follows
it (status, progress lines, log) until the engine is ready, then stopped again."""

from __future__ import annotations

import re
import time

import httpx
import pytest

from tests.e2e.conftest import MODEL, remove_engine
from tests.support.harness import Platform, free_port

ENGINE = "console-e2e"
PASSWORD = "pw-console-e2e"


def _csrf(html: str) -> str:
    match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
    assert match is not None, html[:2000]
    return match.group(1)


@pytest.fixture
def console(platform_server: Platform) -> httpx.Client:
    platform_server.shell(
        "from django.contrib.auth.models import User; "
        "from staff.roles import Role, role_assign; "
        f"u = User.objects.filter(username='console-op').first() or User.objects.create_user("
        f"'console-op', 'op@example.com', '{PASSWORD}', is_staff=True); "
        "role_assign(user=u, role=Role.ADMIN); print(1)"
    )
    client = httpx.Client(base_url=platform_server.base_url, timeout=30, follow_redirects=True)
    login = client.get("/admin/login/?next=/console/")
    page = client.post(
        "/admin/login/?next=/console/",
        data={
            "username": "console-op",
            "password": PASSWORD,
            "csrfmiddlewaretoken": _csrf(login.text),
            "next": "/console/",
        },
    )
    assert page.url.path == "/console/", page.text[:2000]
    return client


def _post(client: httpx.Client, action: str) -> str:
    page = client.get(f"/console/engines/{ENGINE}/")
    response = client.post(
        f"/console/engines/{ENGINE}/{action}/", data={"csrfmiddlewaretoken": _csrf(page.text)}
    )
    assert response.status_code == 200
    return response.text


def _wait_for(client: httpx.Client, status: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    seen = ""
    while time.monotonic() < deadline:
        seen = client.get(f"/console/engines/{ENGINE}/", headers={"HX-Request": "true"}).text
        if f'badge status-{status}"' in seen:
            return seen
        assert "status-failed" not in seen, seen
        time.sleep(2)
    raise AssertionError(f"{ENGINE} not {status} within {timeout} s:\n{seen}")


def test_the_console_starts_and_stops_a_real_engine(
    platform_server: Platform, console: httpx.Client
):
    platform_server.manage(
        "engine", "create", ENGINE, "--served-model-name", f"{MODEL}-console", "--units", "4",
        "--port", str(free_port()), "--max-model-len", "1024", "--if-missing",
    )  # fmt: skip
    try:
        preview = console.get(f"/console/engines/{ENGINE}/").text
        assert "fits on" in preview
        assert preview.count('class="unit used"') >= 8  # the demo engine and this one

        started = _post(console, "start")
        assert f"Starting {ENGINE}" in started
        ready = _wait_for(console, "ready", timeout=600)
        assert "KV capacity" in ready  # the supervisor's detail
        assert "start requested from the console" in ready
        assert f"{ENGINE}: ready in" in ready  # its progress lines, through Redis
        overview = console.get("/console/").text
        assert f'data-engine="{ENGINE}"><title>' in overview  # now drawn on the device

        stopping = _post(console, "stop")
        assert f"Stopping {ENGINE}" in stopping
        stopped = _wait_for(console, "stopped", timeout=180)
        assert f"{ENGINE}: stopped" in stopped
        # Both actions ran in the agent, not in a dispatch worker.
        agent_log = (platform_server.workdir / "agent.log").read_text(errors="replace")
        worker_log = (platform_server.workdir / "worker.log").read_text(errors="replace")
        for task in ("workers.engine_start[", "workers.engine_stop["):
            assert task in agent_log
            assert task not in worker_log
    finally:
        remove_engine(platform_server, ENGINE)
