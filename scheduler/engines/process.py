"""The engine's operating-system process: spawn it detached, tell whether it lives, end it.

An engine must outlive the command that starts it (`manage.py engine start` returns once the
engine is ready), so it runs in its own session (process group) with its output in a log
file, and the database keeps its pid. Stopping signals the whole group, because vLLM runs
its engine core and workers as child processes.

An engine runs tenants' requests, so it is kept from what the platform holds: its working
directory is a directory of its own (`work_dir`), never the repository, and where the agent
may switch users (it runs as root) it runs as the user an operator names (`RunAs`), with
that user's primary group and only the supplementary groups named with it.
"""

from __future__ import annotations

import grp
import os
import pwd
import signal
import subprocess
import time
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from scheduler.engines.launch import LaunchSpec

# Popen objects of engines this process started, so their exit is reaped (a zombie would
# look alive) and Python does not warn about a child still running when one is collected.
_children: dict[int, subprocess.Popen[bytes]] = {}


class RunAsError(ValueError):
    pass


@dataclass(frozen=True)
class RunAs:
    """The user an engine runs as, with its primary group and its only other groups."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]


def _gid(group: str) -> int:
    try:
        return int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
    except KeyError:
        raise RunAsError(f"no group {group!r} on this machine") from None


def run_as(user: str, groups: Sequence[str] = ()) -> RunAs | None:
    """The engines' user (a name or uid; empty: the agent's own, None), or RunAsError when
    this machine has no such user or group, or when the agent may not switch to it (only
    root may start a process as another user)."""
    if not user:
        return None
    try:
        entry = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
    except KeyError:
        raise RunAsError(f"no user {user!r} on this machine") from None
    if entry.pw_uid == 0:
        raise RunAsError("engines may not run as root: name an unprivileged user")
    if os.geteuid() != 0 and entry.pw_uid != os.geteuid():
        raise RunAsError(
            f"only an agent running as root may start engines as {entry.pw_name!r}; this one "
            f"runs as uid {os.geteuid()}"
        )
    return RunAs(entry.pw_name, entry.pw_uid, entry.pw_gid, tuple(_gid(g) for g in groups))


def work_dir(path: Path, user: RunAs | None) -> Path:
    """The engine's working directory: its own, created if missing, readable by its user
    only (and by the agent, which made it)."""
    path.mkdir(parents=True, exist_ok=True)
    if user is not None and os.geteuid() == 0:
        os.chown(path, user.uid, user.gid)
    path.chmod(0o700)
    return path


def spawn(spec: LaunchSpec, *, log_path: Path, cwd: Path, user: RunAs | None = None) -> int:
    """Starts the engine in its own session, in `cwd`, as `user` where one is named (its
    groups only: without `extra_groups` a child keeps root's supplementary groups)."""
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
            user=user.uid if user else None,
            group=user.gid if user else None,
            extra_groups=list(user.groups) if user else None,
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
