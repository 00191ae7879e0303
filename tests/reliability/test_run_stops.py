"""`make run` stops as a user stops it: Ctrl-C in its terminal (SIGINT to the terminal's
foreground process group, every process of it at once), the terminal closed (SIGHUP to it),
or `kill <pid>` (SIGTERM to the script alone, as a process manager stops its main process).
Within 30 s the engine is drained and stopped, and no process of the platform is left.

`scripts/run.sh` runs here exactly as `make run` runs it, with a database, a Redis database,
ports and a var directory of its own, in a session of its own as a terminal's shell would
start it."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sqlite3
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import redis

REPO = Path(__file__).resolve().parents[2]
RUN_REDIS_URL = os.environ.get("GPUSHARE_RUN_REDIS_URL", "redis://127.0.0.1:6379/14")
STOP_WITHIN_S = 30


def signals_at_default() -> None:
    for sent in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sent, signal.SIG_DFL)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def descendants(root: int) -> set[int]:
    """Every process below `root` now (by /proc's parent links)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


# SIGTERM to the script's group would reach the script alone too: each platform process runs
# in a session of its own (scripts/run.sh), and nothing else runs in the foreground then.
@pytest.mark.parametrize(
    ("sent", "to_group"),
    [(signal.SIGINT, True), (signal.SIGHUP, True), (signal.SIGTERM, False)],
    ids=["ctrl-c", "hangup", "kill"],
)
def test_make_run_stops_on_a_signal_and_leaves_nothing(tmp_path, sent, to_group) -> None:
    redis.Redis.from_url(RUN_REDIS_URL).flushdb()
    port, engine_port = free_port(), free_port()
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'run.sqlite3'}",
        "REDIS_URL": RUN_REDIS_URL,
        "GPUSHARE_VAR_DIR": str(tmp_path / "var"),
        "GPUSHARE_DEMO_MODEL_DIR": str(REPO / "var" / "models" / "tiny-llama"),
        "GPUSHARE_DEMO_ENGINE": "stops",
        "GPUSHARE_PORT": str(port),
        "GPUSHARE_DEMO_ENGINE_PORT": str(engine_port),
        "GPUSHARE_WORKER_THREADS": "2",
    }
    log = (tmp_path / "run.log").open("wb")
    platform: set[int] = set()
    # A terminal's shell starts a job as its own process group, the terminal's foreground,
    # with the signals at their default whatever its own are (a suite run under nohup, or in
    # the background of a script, ignores SIGHUP or SIGINT, and run.sh could not trap them).
    run = subprocess.Popen(
        ["bash", "scripts/run.sh"], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True, preexec_fn=signals_at_default,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and run.poll() is None:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        assert run.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
        platform = descendants(run.pid)
        assert len(platform) >= 5  # worker, agent, beat, web and the engine (and their own)

        started = time.monotonic()
        if to_group:
            os.killpg(run.pid, sent)  # the whole foreground group, as the terminal does
        else:
            os.kill(run.pid, sent)  # the script alone
        run.wait(timeout=STOP_WITHIN_S + 30)
        took = time.monotonic() - started
        left = {pid for pid in platform if alive(pid)}
        while left and time.monotonic() - started < STOP_WITHIN_S:
            time.sleep(0.2)
            left = {pid for pid in platform if alive(pid)}
        output = (tmp_path / "run.log").read_text()[-3000:]
        assert took < STOP_WITHIN_S, output
        assert not left, (left, output)
        with sqlite3.connect(tmp_path / "run.sqlite3") as db:  # stopped through the agent
            status = db.execute("SELECT status FROM scheduler_engine WHERE name = 'stops'")
            assert status.fetchall() == [("stopped",)], output
        with socket.socket() as sock:  # nothing listens on the engine's port any more
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a server would
            sock.bind(("127.0.0.1", engine_port))
    finally:  # whatever happened, nothing of it outlives the test
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
        for pid in platform | descendants(run.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        log.close()
