"""Engine logs to the agent's stdout: each engine writes `<GPUSHARE_ENGINE_DIR>/<name>.log`
(the supervisor's own lines and vLLM's output); the agent follows every such file and writes
each new line with the engine's name in front, so the node's log collector (`kubectl logs`,
`docker compose logs`) has them. The files stay: the console and a failed start's detail
read their ends.

Pure file reading, no Django: `LogFollower.poll` reads what was appended since the last poll
(a line still being written waits for its newline), starts a file over when it was truncated
or replaced, and skips what a file already held when the agent started (that was said by an
earlier agent)."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from plumbing import wire
from plumbing.json_logs import utc_time

log = logging.getLogger(__name__)

# The most read from one file at one poll: a burst is written over the next polls.
CHUNK_BYTES = 256 * 1024
# A line without a newline past this is written as it is (a progress bar of a huge width).
MAX_PARTIAL_BYTES = 64 * 1024


@dataclass
class _Followed:
    inode: int
    offset: int
    partial: bytes = b""


def prefixed(engine: str, line: str) -> str:
    """How an engine's line appears in the agent's output."""
    return f"[engine {engine}] {line}"


def as_json(engine: str, line: str) -> str:
    """How it appears with GPUSHARE_LOG_FORMAT=json: a line of the agent's JSON log (logger
    `engine`, level INFO, stamped when the agent read it), the engine's line its message."""
    entry = {"time": utc_time(time.time()), "level": "INFO", "logger": "engine", "message": line}
    return wire.dumps(entry | {"engine": engine})


class LogFollower:
    """Follows the `*.log` files of a folder; `write` gets each new line, as `shown` shows it
    (`prefixed` or `as_json`)."""

    def __init__(
        self,
        directory: Path,
        write: Callable[[str], None],
        shown: Callable[[str, str], str] = prefixed,
    ) -> None:
        self.directory = directory
        self._write = write
        self._shown = shown
        self._files: dict[Path, _Followed] = {}
        self._started = False

    def poll(self) -> int:
        """Writes the lines appended since the last poll; returns how many."""
        first = not self._started
        self._started = True
        try:
            paths = sorted(self.directory.glob("*.log"))
        except OSError:
            return 0
        for gone in set(self._files) - set(paths):
            del self._files[gone]
        return sum(self._poll_file(path, skip_existing=first) for path in paths)

    def _poll_file(self, path: Path, *, skip_existing: bool) -> int:
        try:
            stat = path.stat()
        except OSError:
            return 0
        followed = self._files.get(path)
        if followed is None or followed.inode != stat.st_ino or stat.st_size < followed.offset:
            # New (from its start, unless it was there before the agent), replaced or
            # truncated (from its start).
            start = stat.st_size if skip_existing and followed is None else 0
            followed = self._files[path] = _Followed(inode=stat.st_ino, offset=start)
        if stat.st_size == followed.offset:
            return 0
        try:
            with path.open("rb") as file:
                file.seek(followed.offset)
                data = file.read(CHUNK_BYTES)
        except OSError:
            return 0
        followed.offset += len(data)
        data = followed.partial + data
        *lines, rest = data.split(b"\n")
        if len(rest) > MAX_PARTIAL_BYTES:
            lines.append(rest)
            rest = b""
        followed.partial = rest
        engine = path.stem
        for raw in lines:
            self._write(self._shown(engine, raw.decode(errors="replace").rstrip("\r")))
        return len(lines)


def follow_in_thread(
    follower: LogFollower, stop: threading.Event, every_s: float = 0.5
) -> threading.Thread:
    """Polls until `stop` is set, in a daemon thread; a last poll after it is set."""

    def run() -> None:
        while True:
            stopping = stop.wait(every_s)
            try:
                follower.poll()
            except Exception:  # the next poll tries again
                log.warning("could not follow the engines' logs", exc_info=True)
            if stopping:
                return

    thread = threading.Thread(target=run, name="engine-logs", daemon=True)
    thread.start()
    return thread


def stdout_writer(stream_fd: int = 1) -> Callable[[str], None]:
    """Writes whole lines to a file descriptor (stdout), each in one write, so that lines of
    the agent's own log and the engines' are never interleaved within a line."""
    lock = threading.Lock()

    def write(line: str) -> None:
        data = (line + "\n").encode(errors="replace")
        with lock:
            while data:
                data = data[os.write(stream_fd, data) :]

    return write
