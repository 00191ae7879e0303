"""The whole platform as a user runs it, for end-to-end tests: its own database, web
(uvicorn), a Celery worker and beat, the node's engine agent, and a real vLLM CPU engine,
each a real process.

Tests talk to it over HTTP only, and prepare it with the operators' `manage.py` commands.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlunparse

import httpx
import psycopg

REPO = Path(__file__).resolve().parents[2]
# Beat's sends and the workers' runs of its periodic tasks: noise in a failure's log tail.
ROUTINE_LOG_LINE = re.compile(
    r"Sending due task|Task workers\.telemetry_rollup\[[^]]*\] (received|succeeded)"
)


def free_port(avoid: frozenset[int] | set[int] = frozenset()) -> int:
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if port not in avoid:
            return port


def _with_database(url: str, name: str) -> str:
    return urlunparse(urlparse(url)._replace(path=f"/{name}"))


class Database:
    """A fresh database of the same server as DATABASE_URL (or a SQLite file)."""

    def __init__(self, base_url: str, workdir: Path) -> None:
        self.is_postgres = base_url.startswith(("postgres://", "postgresql://"))
        if self.is_postgres:
            self.name = f"gs_e2e_{uuid.uuid4().hex[:8]}"
            self._admin_url = base_url
            with psycopg.connect(base_url, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{self.name}"')
            self.url = _with_database(base_url, self.name)
        else:
            self.url = f"sqlite:///{workdir / 'e2e.sqlite3'}"

    def drop(self) -> None:
        if self.is_postgres:
            with psycopg.connect(self._admin_url, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


class Platform:
    def __init__(self, workdir: Path, *, database_url: str, redis_url: str) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "CELERY_BROKER_URL": redis_url,
            "GPUSHARE_VAR_DIR": str(workdir),
            "GPUSHARE_DEMO_MODEL_DIR": os.environ.get(
                "GPUSHARE_DEMO_MODEL_DIR", str(REPO / "var" / "models" / "tiny-llama")
            ),
            "GPUSHARE_HOUSEKEEPING_INTERVAL_S": "1",
            # Room on the CPU device for the platform's engine and the ones tests add.
            "GPUSHARE_CPU_KVCACHE_GIB": "4",
            "PYTHONUNBUFFERED": "1",
        }
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    # --- operators' commands --------------------------------------------------------------

    def manage(self, *args: str, timeout: float = 600) -> str:
        result = subprocess.run(
            [sys.executable, "manage.py", *args], cwd=REPO, env=self.env,
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        if result.returncode != 0:
            raise AssertionError(
                f"manage.py {' '.join(args)} failed ({result.returncode}):\n"
                f"{result.stdout}\n{result.stderr}"
            )
        return result.stdout

    def manage_json(self, *args: str) -> Any:
        return json.loads(self.manage(*args, "--json"))

    def shell(self, code: str) -> Any:
        """Runs Python in the platform's Django and returns what it prints as JSON."""
        output = self.manage("shell", "--no-imports", "-c", code)
        return json.loads(output.strip().splitlines()[-1])

    # --- processes ------------------------------------------------------------------------

    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 - lives with the process
        self.processes[name] = subprocess.Popen(
            args, cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip

    def start(self) -> None:
        self.manage("migrate", "--noinput")
        celery = [sys.executable, "-m", "celery", "-A", "config"]
        worker = ["--pool", "threads", "--concurrency", "16", "--loglevel", "INFO"]
        # No gossip, mingle or heartbeat: nothing here watches Celery's events, and the
        # heartbeat alone sent a message every 2 s (as platform/Dockerfile runs it).
        quiet = ["--without-gossip", "--without-mingle", "--without-heartbeat"]
        self._spawn("worker", [*celery, "worker", *worker, *quiet])
        # The node's engine agent: the only process that starts, stops and checks engines.
        self._spawn("agent", [sys.executable, "-m", "agent", "--concurrency", "4"])
        self._spawn("beat", [*celery, "beat", "--loglevel", "INFO"])
        uvicorn = [sys.executable, "-m", "plumbing.serve", "config.asgi:application"]
        address = ["--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning"]
        self._spawn("web", [*uvicorn, *address])
        self.wait_http("/healthz", timeout=60)

    def wait_http(self, path: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.assert_alive()
            try:
                if httpx.get(self.base_url + path, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise AssertionError(f"{path} did not answer 200 within {timeout} s\n{self.logs()}")

    def assert_alive(self) -> None:
        for name, process in self.processes.items():
            if process.poll() is not None:
                raise AssertionError(f"{name} exited with {process.returncode}\n{self.logs()}")

    def logs(self, lines: int = 40) -> str:
        """The last lines of each process's log and each engine's, without the routine
        periodic tasks."""
        parts = []
        paths = sorted(self.workdir.glob("*.log")) + sorted(self.workdir.glob("engines/*.log"))
        for path in paths:
            kept = [
                line
                for line in path.read_text(errors="replace").splitlines()
                if not ROUTINE_LOG_LINE.search(line)
            ]
            parts.append(f"--- {path.name}\n" + "\n".join(kept[-lines:]))
        return "\n".join(parts)

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)


# --- Engines through the node's engine agent -----------------------------------------------


def engine_state(platform: Platform, name: str) -> dict[str, Any]:
    return platform.shell(
        "import json; from scheduler.models import Engine as E; "
        f"e = E.objects.get(name={name!r}); "
        "print(json.dumps({'status': e.status, 'pid': e.pid, 'detail': e.status_detail, "
        "'url': e.base_url, 'started_at': e.started_at.isoformat() if e.started_at else None}))"
    )


def start_engine_through_agent(platform: Platform, name: str, timeout: float) -> dict[str, Any]:
    """Starts the engine as the console does: a task on its node's queue, which the node's
    engine agent takes; returns the engine's state once it is ready."""
    platform.shell(
        "from scheduler import worker_tasks; from scheduler.selectors import engine_get; "
        f"engine = engine_get(name={name!r}); "
        "worker_tasks.engine_start(engine.name, engine.device.node); print('null')"
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(10)  # a shell costs a Django start-up: not too often on a busy machine
        platform.assert_alive()
        state = engine_state(platform, name)
        if state["status"] == "ready":
            return state
        if state["status"] == "failed":
            raise AssertionError(f"{name} failed: {state['detail']}\n{platform.logs()}")
    raise AssertionError(f"{name} not ready within {timeout} s\n{platform.logs()}")


# --- Restarting one process (batch durability tests) ---------------------------------------


def kill_process(platform: Platform, name: str, sig: signal.Signals = signal.SIGKILL) -> None:
    """Kills one of the platform's processes with its children (SIGKILL: no clean-up)."""
    process = platform.processes[name]
    if process.poll() is None:
        os.killpg(process.pid, sig)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:  # a warm shutdown that takes too long
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def start_process(platform: Platform, name: str, env: dict[str, str] | None = None) -> None:
    """Starts a killed process again with the same command line, and `env` on top of the
    platform's; its output is appended to the same log."""
    args = platform.processes[name].args
    log = open(platform.workdir / f"{name}.log", "ab")  # noqa: SIM115 - lives with the process
    platform.processes[name] = subprocess.Popen(
        args, cwd=REPO, env={**platform.env, **(env or {})}, stdout=log,
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    if name == "web":
        platform.wait_http("/healthz", timeout=60)


def restart_process(
    platform: Platform,
    name: str,
    env: dict[str, str] | None = None,
    sig: signal.Signals = signal.SIGTERM,
) -> None:
    kill_process(platform, name, sig)
    start_process(platform, name, env)
