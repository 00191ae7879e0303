"""What the last start or stop of an engine reported, for the console's engine page.

Starting an engine takes a minute or more and stopping one waits for its drain, longer than
a web request should; the console sends the action to the engine's node and shows progress
by polling the engine's status and detail (the supervisor writes them), its log and the
lines reported here, which live in Redis for an hour.
"""

from __future__ import annotations

import time

from plumbing.redis import redis_client

PROGRESS_KEY = "gs:console:engine-progress:{name}"
# Set while a start or stop the console asked for has not finished (the task may still be
# waiting for a worker), so the engine's page keeps following it; the TTL covers a task
# that never ran.
PENDING_KEY = "gs:console:engine-pending:{name}"
PROGRESS_LINES = 40
PROGRESS_TTL_S = 3600


def progress_note(name: str, line: str) -> None:
    key = PROGRESS_KEY.format(name=name)
    stamp = time.strftime("%H:%M:%S", time.gmtime())
    pipe = redis_client().pipeline()
    pipe.rpush(key, f"{stamp} {line}")
    pipe.ltrim(key, -PROGRESS_LINES, -1)
    pipe.expire(key, PROGRESS_TTL_S)
    pipe.execute()


def progress_lines(name: str) -> list[str]:
    """What the last start or stop of the engine reported, oldest first."""
    return [str(line) for line in redis_client().lrange(PROGRESS_KEY.format(name=name), 0, -1)]


def progress_begin(name: str, line: str, *, pending: bool = True) -> None:
    """A new action: its lines replace the previous action's."""
    client = redis_client()
    client.delete(PROGRESS_KEY.format(name=name))
    if pending:
        client.set(PENDING_KEY.format(name=name), 1, ex=PROGRESS_TTL_S)
    progress_note(name, line)


def action_pending(name: str) -> bool:
    return bool(redis_client().exists(PENDING_KEY.format(name=name)))


def action_done(name: str) -> None:
    redis_client().delete(PENDING_KEY.format(name=name))
