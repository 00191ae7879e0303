"""Engines that ran out of memory: which deaths of an engine's process are out-of-memory
deaths, and how many each engine has had.

The supervisor learns of an engine's death in two places (`engine_refresh`, the crash check
every process runs; and a start that waits on a process that dies), from three things: the
process's exit code (known where the process is this process's child: the agent that
started it), the end of its log, and whether the platform asked it to stop. `oom_cause`
reads those three alone, so it is tested without a process.

vLLM reports no out-of-memory in an answer: an engine core that runs out of memory dies,
its server answers 500 (`EngineDeadError`) or drops the connection and exits, and the
dispatch worker's "engine unavailable" check (`engine_check_unreachable`) leads to the
crash check, which reads the log.

The count is cluster-wide: a Redis hash (`OOM_KEY`, field `engine<TAB>model`) that every
web replica reads alike for `gpushare_engine_oom_total` on /metrics/cluster, as the
rejections' counts are kept. One death is counted once, whichever process notices it first:
the run (engine, pid, start) is claimed with SET NX before the count moves.
"""

from __future__ import annotations

import logging
import re
import signal

import redis

from plumbing.redis import redis_client

log = logging.getLogger(__name__)

OOM_KEY = "gs:telemetry:engine_oom"
_SEEN_KEY = "gs:telemetry:engine_oom:seen:{run}"
# A run's claim outlives any check that could still notice the same death.
_SEEN_TTL_S = 24 * 3600
_SEP = "\t"

# The line the supervisor writes to an engine's log before it launches it (`_launch`):
# what comes before the last one was said by an earlier run of the engine.
START_MARKER = "=== gpushare: starting engine "

# What vLLM and torch print when memory runs out, and the cause each is reported as.
_LOG_CAUSES: tuple[tuple[re.Pattern[str], str], ...] = (
    # torch.OutOfMemoryError (torch.cuda.OutOfMemoryError before torch 2.5): "CUDA out of
    # memory. Tried to allocate ..."; a raw CUDA allocation: "CUDA error: out of memory".
    (
        re.compile(r"OutOfMemoryError|CUDA out of memory|CUDA error: out of memory"),
        "CUDA out of memory",
    ),
    # vLLM's start, after the profiling run: nothing left, or too little for one request of
    # max_model_len (kv_cache_utils._check_enough_kv_cache_memory).
    (
        re.compile(
            r"No available memory for the cache blocks"
            r"|KV cache is needed, which is larger than the available KV cache memory"
        ),
        "no memory left for the KV cache",
    ),
    # vLLM's start on a GPU whose other processes hold more than its share leaves free.
    (
        re.compile(r"Free memory on device .* on startup is less than desired GPU memory"),
        "the GPU's free memory is below what the engine asks for",
    ),
)
_KILLED = (-signal.SIGKILL, 128 + signal.SIGKILL)  # Popen's form, a shell's form
KILLED_CAUSE = "killed by SIGKILL the platform did not send (the kernel's OOM killer?)"


def last_run(log_tail: str) -> str:
    """The part of an engine's log its latest run wrote (all of it if the start line is
    further back than the tail)."""
    at = log_tail.rfind(START_MARKER)
    return log_tail[at:] if at >= 0 else log_tail


def oom_cause(*, log_tail: str, exit_code: int | None, stop_requested: bool) -> str | None:
    """Why an engine's process that is gone ran out of memory, or None if it did not.

    - The platform asked it to stop (SIGTERM, then SIGKILL after the stop timeout): never
      an out-of-memory death, whatever its end printed.
    - A clean exit (0): never.
    - Its latest run's log says torch or CUDA ran out of memory, or vLLM found no memory for
      its KV cache: out of memory, with that cause.
    - Killed by SIGKILL that the platform did not send: taken for the kernel's OOM killer,
      the one sender of SIGKILL on a node besides the platform and an operator's `kill -9`.
      Known only where the exit code is (`exit_code` None: this process did not start it),
      and only for the server process: the OOM killer's usual victim is vLLM's engine core
      (the largest process), whose death the server reports without its signal.
    """
    if stop_requested or exit_code == 0:
        return None
    text = last_run(log_tail)
    for pattern, cause in _LOG_CAUSES:
        if pattern.search(text):
            return cause
    if exit_code in _KILLED:
        return KILLED_CAUSE
    return None


def engine_oom_note(
    *, engine: str, model: str, run: str, cause: str, client: redis.Redis | None = None
) -> bool:
    """Counts one out-of-memory death of the engine's run `run` (its pid and start), once
    however many processes notice it, and logs it at ERROR. True if this call counted it.
    Never raises: the count must not keep the engine from being marked failed."""
    try:
        client = client or redis_client()
        if not client.set(_SEEN_KEY.format(run=f"{engine}:{run}"), 1, nx=True, ex=_SEEN_TTL_S):
            return False
        client.hincrby(OOM_KEY, f"{engine}{_SEP}{model}", 1)
    except redis.RedisError:
        log.exception("engine %s ran out of memory (%s); could not count it", engine, cause)
        return False
    log.error("engine %s (%s) ran out of memory: %s", engine, model, cause)
    return True


def engine_oom_counts(client: redis.Redis | None = None) -> dict[tuple[str, str], int]:
    """(engine, model) -> out-of-memory deaths so far."""
    counts: dict[tuple[str, str], int] = {}
    for field, value in (client or redis_client()).hgetall(OOM_KEY).items():
        name = field.decode() if isinstance(field, bytes) else field
        engine, _, model = name.partition(_SEP)
        counts[(engine, model)] = int(value)
    return counts
