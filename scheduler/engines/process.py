"""The engine's operating-system process: spawn it detached, tell whether it lives, end it.

An engine must outlive the command that starts it (`manage.py engine start` returns once the
engine is ready), so it runs in its own session (process group) with its output in a log
file, and the database keeps its pid. Stopping signals the whole group, because vLLM runs
its engine core and workers as child processes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from contextlib import suppress
from pathlib import Path

from scheduler.engines.launch import LaunchSpec

# Popen objects of engines this process started, so their exit is reaped (a zombie would
# look alive) and Python does not warn about a child still running when one is collected.
_children: dict[int, subprocess.Popen[bytes]] = {}


def spawn(spec: LaunchSpec, *, log_path: Path, cwd: Path) -> int:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            spec.argv,
            cwd=cwd,
            env=spec.env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    _children[process.pid] = process
    return process.pid


def _proc_state(pid: int) -> str | None:
    """The state letter from /proc/<pid>/stat, or None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    except OSError:
        return "?"
    # The command name may contain spaces and parentheses; the state follows the last ')'.
    return stat.rsplit(")", 1)[1].split()[0]


def is_running(pid: int) -> bool:
    child = _children.get(pid)
    if child is not None:
        return child.poll() is None
    if Path("/proc").is_dir():
        return _proc_state(pid) not in (None, "Z", "X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_engine_process(pid: int, *, port: int) -> bool:
    """The pid is (still) a vLLM server on that port, not a process that reused the pid."""
    if not is_running(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True  # no /proc: trust the pid
    return b"vllm.entrypoints.openai.api_server" in cmdline and str(port).encode() in cmdline


def exit_code(pid: int) -> int | None:
    child = _children.get(pid)
    return child.poll() if child is not None else None


def terminate(pid: int, *, timeout_s: float) -> bool:
    """SIGTERM the engine's process group, then SIGKILL after `timeout_s`. True if it ended
    gracefully."""
    try:
        pgid = os.getpgid(pid)
    except ProcessLookupError:
        return True
    with suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not is_running(pid):
            _children.pop(pid, None)
            return True
        time.sleep(0.2)
    with suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    child = _children.pop(pid, None)
    if child is not None:
        child.wait(timeout=10)
    return False


def log_tail(path: Path, *, lines: int = 15) -> str:
    """The last lines of an engine's log: what it said before it died, or what it is doing."""
    try:
        with path.open("rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - 64 * 1024))
            text = log.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
