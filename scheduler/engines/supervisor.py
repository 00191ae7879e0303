"""The engine supervisor: start an engine and see it through starting -> warming -> ready,
drain and stop it, and notice when one has died.

The engine process outlives the command that starts it: it runs detached in its own session,
its output goes to `<GPUSHARE_ENGINE_DIR>/<name>.log`, and its pid and status live in the
database. So any process (a Celery worker, the run script, the console) finds a ready engine
through the database (`scheduler.selectors.engine_ready_for_tenant`, `Engine.base_url`), and
any process can stop it. `engine_refresh` is the crash check: a live status whose process is
gone becomes `failed`, with the end of its log, so it is never silently used.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis
from django.conf import settings
from django.db import transaction

from plumbing.errors import DomainError
from scheduler.engines import cpu_affinity, cpu_cores, oom, process
from scheduler.engines.auth import engine_api_key
from scheduler.engines.client import EngineClient, EngineError
from scheduler.engines.launch import EngineLaunch, build_launch
from scheduler.engines.vllm_env import VllmEnvMissing, find_vllm_python
from scheduler.gpu_inventory import node_name
from scheduler.models import LIVE_STATUSES, DeviceKind, Engine, EngineStatus, EngineTask
from scheduler.pools.policies import engine_pool, fair_queue, sync_engine
from scheduler.selectors import engine_get
from scheduler.services import engine_check_room_to_start, engine_set_status

log = logging.getLogger(__name__)
Progress = Callable[[str], None]
POLL_INTERVAL_S = 1.0
# How often a long start says it is still alive.
PROGRESS_EVERY_S = 10.0
WARMUP_PROMPT = "Hello"
# The status detail of an engine whose process has been sent SIGTERM by engine_stop.
STOPPING_DETAIL = "stopping process"
# How much of a dead engine's log is searched for an out-of-memory error: vLLM's shutdown
# after its engine core died prints tracebacks and warnings after the error itself.
OOM_TAIL_LINES = 200
# How long a failed warm-up waits for the process to end: an engine core that ran out of
# memory answers its request with an error, then its server exits.
WARMUP_DEATH_WAIT_S = 5.0


class EngineStartError(DomainError):
    http_status = 503
    code = "engine_start_failed"


def _quiet(_: str) -> None:
    pass


@dataclass(frozen=True)
class Timeouts:
    start_s: float
    drain_s: float
    stop_s: float
    http_s: float
    generate_s: float

    @classmethod
    def from_settings(cls) -> Timeouts:
        return cls(
            start_s=settings.GPUSHARE_ENGINE_START_TIMEOUT_S,
            drain_s=settings.GPUSHARE_ENGINE_DRAIN_TIMEOUT_S,
            stop_s=settings.GPUSHARE_ENGINE_STOP_TIMEOUT_S,
            http_s=settings.GPUSHARE_ENGINE_HTTP_TIMEOUT_S,
            generate_s=settings.GPUSHARE_ENGINE_GENERATE_TIMEOUT_S,
        )


def engine_log_path(engine: Engine) -> Path:
    return Path(settings.GPUSHARE_ENGINE_DIR) / f"{engine.name}.log"


def engine_work_dir(engine: Engine) -> Path:
    """The engine's working directory: one of its own, not the repository, whose packages
    would be importable from it and whose files it could read by relative paths."""
    return Path(settings.GPUSHARE_ENGINE_DIR) / "work" / engine.name


def engine_client(engine: Engine, timeouts: Timeouts | None = None) -> EngineClient:
    timeouts = timeouts or Timeouts.from_settings()
    return EngineClient(
        engine.base_url,
        api_key=engine_api_key(engine.base_url),
        timeout_s=timeouts.http_s,
        generate_timeout_s=timeouts.generate_s,
    )


_shared_clients: dict[str, EngineClient] = {}
_shared_clients_lock = threading.Lock()


def shared_engine_client(engine: Engine) -> EngineClient:
    """One HTTP client per engine address and process, with the settings' timeouts, shared
    by the worker's threads and its periodic checks (httpx clients are thread-safe): a new
    client costs a few ms of CPU and a new connection, more than the call it makes. Not to
    be closed by its users."""
    with _shared_clients_lock:
        client = _shared_clients.get(engine.base_url)
        if client is None:
            client = _shared_clients[engine.base_url] = engine_client(engine)
        return client


def _process_alive(engine: Engine) -> bool:
    return engine.pid is not None and process.is_engine_process(engine.pid, port=engine.port)


def _death_detail(engine: Engine, what: str) -> str:
    """Why the engine failed, with the end of its log; it starts with "out of memory" when
    its process is gone and ran out of memory (`_out_of_memory`), so the console's engine
    list shows it first."""
    code = process.exit_code(engine.pid) if engine.pid is not None else None
    exit_text = f" (exit code {code})" if code is not None else ""
    tail = process.log_tail(engine_log_path(engine))
    detail = f"{what}{exit_text}. Last lines of {engine_log_path(engine)}:\n{tail}"
    cause = _out_of_memory(engine, code)
    return f"out of memory ({cause}): {detail}" if cause is not None else detail


def _out_of_memory(engine: Engine, code: int | None) -> str | None:
    """If the engine's process is gone and ran out of memory (`oom.oom_cause`), why, counted
    for gpushare_engine_oom_total and logged at ERROR, once per run however many processes
    see it die; None otherwise (a process that still runs has not died of anything yet)."""
    if engine.pid is None or process.is_running(engine.pid):
        return None
    cause = oom.oom_cause(
        log_tail=process.log_tail(engine_log_path(engine), lines=OOM_TAIL_LINES),
        exit_code=code,
        stop_requested=engine.status_detail.startswith(STOPPING_DETAIL),
    )
    if cause is not None:
        started = f"{engine.started_at.timestamp():.3f}" if engine.started_at else ""
        oom.engine_oom_note(
            engine=engine.name,
            model=engine.served_model_name,
            run=f"{engine.pid}:{started}",
            cause=cause,
        )
    return cause


def engine_refresh(*, engine: Engine) -> Engine:
    """The crash check: an engine whose status says its process runs, but whose process is
    gone, is marked failed (with why). Cheap: no HTTP. Safe to call from anywhere, often.

    The row is read again under a lock before it is written: `engine` may have been read
    before another process moved it on (a stop that ended, a new start), and that process's
    word stands. A process gone after `engine_stop` sent it SIGTERM is a stop, not a
    failure."""
    if engine.status not in LIVE_STATUSES or _process_alive(engine):
        return engine
    with transaction.atomic():
        current = Engine.objects.select_for_update().filter(pk=engine.pk).first()
        if current is None or current.status != engine.status or current.pid != engine.pid:
            if current is not None:
                engine.refresh_from_db(fields=["status", "status_detail", "pid", "updated_at"])
            return engine
        if current.status_detail.startswith(STOPPING_DETAIL):
            engine_set_status(
                engine=engine, status=EngineStatus.STOPPED, detail="stopped", clear_pid=True
            )
            return engine
        detail = _death_detail(engine, f"process {engine.pid} is gone while {engine.status}")
        engine_set_status(engine=engine, status=EngineStatus.FAILED, detail=detail, clear_pid=True)
    return engine


def engine_check_unreachable(*, name: str) -> bool:
    """A call could not reach the engine: if it runs on this node and its process is gone, it
    is failed and out of the fair queue now, not at the next periodic check, so that the job
    given back to the queue is not picked for it again. True if it was failed."""
    here = node_name(settings.GPUSHARE_NODE_NAME)
    engine = (
        Engine.objects.select_related("device", "dedicated_tenant")
        .filter(name=name, device__node=here, status__in=LIVE_STATUSES)
        .first()
    )
    if engine is None or engine_refresh(engine=engine).status != EngineStatus.FAILED:
        return False
    _leave_fair_queue(engine)
    return True


def engine_health_check(*, engine: Engine, timeouts: Timeouts | None = None) -> Engine:
    """The crash check plus /health for a ready engine. A ready engine that misses
    GPUSHARE_ENGINE_HEALTH_MISSES checks in a row is failed rather than sent work, and its
    process stopped: one miss is often a stall (a machine short of CPU), not a dead engine,
    and a failed engine whose process lives on would hold its port and memory, so it could
    not be started again."""
    engine_refresh(engine=engine)
    if engine.status != EngineStatus.READY:
        return engine
    if _answers_health(engine, timeouts):
        if engine.health_misses:
            _count_health_misses(engine, 0)
        return engine
    misses = engine.health_misses + 1
    allowed = max(1, settings.GPUSHARE_ENGINE_HEALTH_MISSES)
    if misses < allowed:
        log.warning("engine %s missed /health (%d of %d in a row)", engine.name, misses, allowed)
        _count_health_misses(engine, misses)
        return engine
    _fail_deaf(engine, misses, timeouts or Timeouts.from_settings())
    return engine


def _count_health_misses(engine: Engine, misses: int) -> None:
    # A plain UPDATE: the count is no reason to reload the routes cached from engine rows.
    Engine.objects.filter(pk=engine.pk).update(health_misses=misses)
    engine.health_misses = misses


def _fail_deaf(engine: Engine, misses: int, timeouts: Timeouts) -> None:
    """Failed first, so that no new work goes to it; then its process is stopped."""
    detail = f"/health at {engine.base_url} did not answer 200 in {misses} checks in a row"
    engine_set_status(engine=engine, status=EngineStatus.FAILED, detail=f"{detail} while ready")
    _leave_fair_queue(engine)
    if engine.pid is not None and process.is_engine_process(engine.pid, port=engine.port):
        graceful = process.terminate(engine.pid, timeout_s=timeouts.stop_s)
        how = "stopped" if graceful else f"killed after {timeouts.stop_s:.0f} s without exiting"
        detail = f"{detail} while ready; its process {engine.pid} was {how}"
        engine_set_status(engine=engine, status=EngineStatus.FAILED, detail=detail, clear_pid=True)
    log.warning("engine %s failed: %s", engine.name, engine.status_detail)


def _answers_health(engine: Engine, timeouts: Timeouts | None) -> bool:
    if timeouts is None:  # the periodic check, every few seconds: the process's client
        return shared_engine_client(engine).health()
    with engine_client(engine, timeouts) as client:
        return client.health()


def engines_check_all(*, node: str | None = None, timeouts: Timeouts | None = None) -> list[Engine]:
    """The periodic check (the telemetry sampler, on the workers' ticker): every live engine on
    this node gets the crash check and, if ready, /health. Returns the engines that are failed
    now."""
    here = node or node_name(settings.GPUSHARE_NODE_NAME)
    engines = Engine.objects.select_related("device").filter(
        device__node=here, status__in=LIVE_STATUSES
    )
    checked = [engine_health_check(engine=engine, timeouts=timeouts) for engine in engines]
    return [engine for engine in checked if engine.status == EngineStatus.FAILED]


def _check_startable(engine: Engine) -> None:
    here = node_name(settings.GPUSHARE_NODE_NAME)
    if engine.device.node != here:
        raise EngineStartError(
            f"Engine '{engine.name}' is on {engine.device.key}; start it on node "
            f"'{engine.device.node}', not here ('{here}')."
        )
    if not Path(engine.model_path, "config.json").is_file():
        raise EngineStartError(
            f"Model folder {engine.model_path} has no config.json (for the demo model run "
            "scripts/make_tiny_model.py with the vLLM environment's python)."
        )


def engine_cpu_cores(engine: Engine) -> tuple[int, ...]:
    """A CPU engine's share of this node's CPUs (`cpu_cores`): the engines registered on its
    device divide them in the order of their ids; () for a GPU engine or a lone CPU one."""
    if engine.device.kind != DeviceKind.CPU:
        return ()
    siblings = list(
        Engine.objects.filter(device=engine.device).order_by("pk").values_list("pk", flat=True)
    )
    return cpu_cores.engine_cores(
        sorted(os.sched_getaffinity(0)), engines=len(siblings), position=siblings.index(engine.pk)
    )


def _launch(engine: Engine) -> int:
    try:
        python = find_vllm_python(
            configured=settings.GPUSHARE_VLLM_PYTHON, cache_dir=Path(settings.GPUSHARE_CACHE_DIR)
        )
    except VllmEnvMissing as exc:
        raise EngineStartError(str(exc)) from None
    try:
        user = process.run_as(settings.GPUSHARE_ENGINE_USER, settings.GPUSHARE_ENGINE_GROUPS)
    except process.RunAsError as exc:
        raise EngineStartError(f"GPUSHARE_ENGINE_USER: {exc}") from None
    cwd = process.work_dir(engine_work_dir(engine), user)
    spec = build_launch(
        EngineLaunch(
            model_path=str(Path(engine.model_path).resolve()),
            served_model_name=engine.served_model_name,
            host=engine.host,
            port=engine.port,
            max_model_len=engine.max_model_len,
            max_num_seqs=engine.max_num_seqs,
            footprint_units=engine.footprint_units,
            device_kind=engine.device.kind,
            device_index=engine.device.index,
            device_memory_bytes=engine.device.memory_bytes,
            task=engine.task,
            max_loras=engine.max_loras,
            max_lora_rank=engine.max_lora_rank,
            kv_blocks=int(settings.GPUSHARE_ENGINE_KV_BLOCKS),
            cpu_cores=engine_cpu_cores(engine),
        ),
        python=str(python),
        base_env=os.environ,
        api_key=engine_api_key(engine.base_url),
        # Its own user's caches go in its own directory: the platform's HOME is not its.
        home=str(cwd) if user is not None else None,
        metrics_token=settings.GPUSHARE_ENGINE_METRICS_TOKEN,
    )
    log_path = engine_log_path(engine)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("a") as log:
        log.write(f"\n=== gpushare: starting engine {engine.name}: {' '.join(spec.argv)}\n")
    return process.spawn(spec, log_path=log_path, cwd=cwd, user=user)


def engine_start(
    *, name: str, on_progress: Progress = _quiet, timeouts: Timeouts | None = None
) -> Engine:
    """Start the engine and return once it is ready (or raise EngineStartError, with the
    engine marked failed and its process ended). Starting an engine that is already starting
    waits for it instead of launching a second process; a ready one is returned as it is."""
    timeouts = timeouts or Timeouts.from_settings()
    with transaction.atomic():
        # The row lock makes two concurrent starts of one engine launch one process.
        engine = (
            Engine.objects.select_for_update(of=("self",))
            .select_related("device", "dedicated_tenant")
            .get(pk=engine_get(name=name).pk)
        )
        engine_refresh(engine=engine)
        if engine.status == EngineStatus.READY:
            on_progress(f"{engine.name} is already ready at {engine.base_url}")
            return engine
        attach = engine.status in (EngineStatus.STARTING, EngineStatus.WARMING)
        if engine.status == EngineStatus.DRAINING:
            raise EngineStartError(f"Engine '{name}' is draining; stop it before starting it.")
        if not attach:
            _check_startable(engine)
            engine_check_room_to_start(engine=engine)
            _check_port_free(engine)
            pid = _launch(engine)
            engine_set_status(
                engine=engine,
                status=EngineStatus.STARTING,
                detail=f"process {pid} launched; log {engine_log_path(engine)}",
                pid=pid,
                started=True,
            )
    verb = "waiting for" if attach else "started"
    on_progress(f"{engine.name}: {verb} process {engine.pid}, log {engine_log_path(engine)}")
    try:
        _wait_until_ready(engine, on_progress=on_progress, timeouts=timeouts)
    except EngineStartError as exc:
        _fail_start(engine, str(exc), timeouts=timeouts)
        raise
    return engine


def _check_port_free(engine: Engine) -> None:
    with engine_client(engine) as client:
        if client.health():
            raise EngineStartError(
                f"Something already answers at {engine.base_url}; choose another port for "
                f"'{engine.name}' or stop what runs there."
            )


def _fail_start(engine: Engine, detail: str, *, timeouts: Timeouts) -> None:
    if engine.pid is not None and process.is_running(engine.pid):
        process.terminate(engine.pid, timeout_s=timeouts.stop_s)
    engine_set_status(engine=engine, status=EngineStatus.FAILED, detail=detail, clear_pid=True)


def _wait_until_ready(engine: Engine, *, on_progress: Progress, timeouts: Timeouts) -> None:
    started = time.monotonic()
    deadline = started + timeouts.start_s
    last_said = started
    last_line = ""
    with engine_client(engine, timeouts) as client:
        while not client.health():
            now = time.monotonic()
            if engine.pid is None or not process.is_running(engine.pid):
                raise EngineStartError(_death_detail(engine, "the engine died while starting"))
            if now > deadline:
                raise EngineStartError(
                    _death_detail(engine, f"not healthy within {timeouts.start_s:.0f} s")
                )
            if now - last_said >= PROGRESS_EVERY_S:
                line = process.log_tail(engine_log_path(engine), lines=1)
                news = f": {line[:160]}" if line != last_line else ""
                on_progress(f"  starting ({now - started:.0f} s){news}")
                last_said, last_line = now, line
            time.sleep(POLL_INTERVAL_S)
        elapsed = time.monotonic() - started
        _pin_cpu_engine_core(engine)
        engine_set_status(
            engine=engine,
            status=EngineStatus.WARMING,
            detail=f"healthy after {elapsed:.0f} s; warming with one real generation",
        )
        on_progress(f"{engine.name}: healthy after {elapsed:.0f} s, warming")
        _warm_up(engine, client)
        _mark_ready(engine, client, elapsed=time.monotonic() - started, on_progress=on_progress)


def _pin_cpu_engine_core(engine: Engine) -> None:
    """A CPU engine's EngineCore onto its Worker's CPUs (see `cpu_affinity`), before the
    warm-up, so that no generation runs with it spinning on another core. Never raises."""
    if engine.device.kind == DeviceKind.CPU and engine.pid is not None:
        cpu_affinity.pin_engine_core(engine.pid)


def _warm_up(engine: Engine, client: EngineClient) -> None:
    """One real generation (or embedding): the first request compiles and allocates, and
    proves the model actually answers, before any tenant's request is sent."""
    embeds = engine.task == EngineTask.EMBED
    what = "embedding" if embeds else "generation"
    try:
        if embeds:
            body = client.embeddings({"model": engine.served_model_name, "input": WARMUP_PROMPT})
        else:
            body = client.completion(
                {"model": engine.served_model_name, "prompt": WARMUP_PROMPT, "max_tokens": 4}
            )
    except EngineError as exc:
        _wait_gone(engine, WARMUP_DEATH_WAIT_S)
        detail = _death_detail(engine, f"the warm-up {what} failed: {exc}")
        raise EngineStartError(detail) from None
    if not body.get("data" if embeds else "choices"):
        raise EngineStartError(f"the warm-up {what} returned nothing: {body}")


def _wait_gone(engine: Engine, seconds: float) -> None:
    """Until the engine's process has ended, `seconds` at most."""
    deadline = time.monotonic() + seconds
    while engine.pid is not None and process.is_running(engine.pid):
        if time.monotonic() >= deadline:
            return
        time.sleep(0.2)


def _mark_ready(
    engine: Engine, client: EngineClient, *, elapsed: float, on_progress: Progress
) -> None:
    try:
        metrics = client.metrics()
    except EngineError as exc:
        raise EngineStartError(f"could not read {engine.base_url}/metrics: {exc}") from None
    capacity = metrics.kv_capacity_tokens
    if capacity is None:
        raise EngineStartError(
            f"{engine.base_url}/metrics has no vllm:cache_config_info with num_gpu_blocks and "
            "block_size, so its KV capacity is unknown"
        )
    detail = (
        f"ready in {elapsed:.0f} s; KV capacity {capacity} tokens "
        f"({metrics.num_blocks} blocks of {metrics.block_size})"
    )
    _count_health_misses(engine, 0)  # a miss of its previous run says nothing of this one
    engine_set_status(
        engine=engine,
        status=EngineStatus.READY,
        detail=detail,
        kv_capacity_tokens=capacity,
        block_size=metrics.block_size,
    )
    on_progress(
        f"{engine.name}: {detail}; serving '{engine.served_model_name}' at {engine.base_url}"
    )


def engine_stop(
    *, name: str, on_progress: Progress = _quiet, timeouts: Timeouts | None = None
) -> Engine:
    """Drain, then stop. Draining takes the engine out of the scheduler's choice (only ready
    engines get work) and waits until the engine reports nothing running or waiting, up to
    the drain timeout; then the process group gets SIGTERM, and SIGKILL if it lingers."""
    timeouts = timeouts or Timeouts.from_settings()
    engine = engine_refresh(engine=engine_get(name=name))
    if engine.status not in LIVE_STATUSES:
        if engine.pid is not None and _process_alive(engine):
            # A deaf engine failed by an older version kept its process running.
            on_progress(f"{engine.name}: stopping process {engine.pid} of the failed engine")
            process.terminate(engine.pid, timeout_s=timeouts.stop_s)
        else:
            on_progress(f"{engine.name} is {engine.status}; nothing to stop")
        if engine.status == EngineStatus.FAILED:
            engine_set_status(
                engine=engine,
                status=EngineStatus.STOPPED,
                detail="stopped after failing",
                clear_pid=True,
            )
        return engine
    if engine.status in (EngineStatus.READY, EngineStatus.DRAINING):
        # An engine already draining (the console's Drain) still has in-flight work to end.
        if engine.status == EngineStatus.READY:
            engine_set_status(engine=engine, status=EngineStatus.DRAINING, detail="draining")
        _leave_fair_queue(engine)
        on_progress(f"{engine.name}: draining (up to {timeouts.drain_s:.0f} s)")
        _drain(engine, timeouts=timeouts, on_progress=on_progress)
    graceful = True
    if engine.pid is not None and process.is_running(engine.pid):
        # Said in the row first, so that a crash check that sees the process gone from here
        # on knows it is stopping, not failed.
        engine_set_status(
            engine=engine,
            status=EngineStatus(engine.status),
            detail=f"{STOPPING_DETAIL} {engine.pid}",
        )
        on_progress(f"{engine.name}: stopping process {engine.pid}")
        graceful = process.terminate(engine.pid, timeout_s=timeouts.stop_s)
    detail = "stopped" if graceful else f"killed after {timeouts.stop_s:.0f} s without exiting"
    engine_set_status(engine=engine, status=EngineStatus.STOPPED, detail=detail, clear_pid=True)
    _leave_fair_queue(engine)  # again: a row read before the drain may have put it back
    on_progress(f"{engine.name}: {detail}")
    return engine


def _leave_fair_queue(engine: Engine) -> None:
    """No new picks for a draining engine from now on, not from the next periodic sync."""
    try:
        sync_engine(engine)
    except redis.RedisError as exc:  # the periodic sync removes it once Redis answers
        log.warning("could not take %s out of the fair queue: %s", engine.name, exc)


def _picked_for(engine: Engine) -> int:
    """Jobs the fair queue handed to the engine that have not ended: a job picked just
    before the drain may not have reached the engine yet."""
    try:
        queue = fair_queue()
        usage = queue.keys.engine_usage(engine_pool(engine), engine.name)
        return int(queue.redis.hget(usage, "inflight") or 0)
    except redis.RedisError:
        return 0


def _drain(engine: Engine, *, timeouts: Timeouts, on_progress: Progress) -> None:
    deadline = time.monotonic() + timeouts.drain_s
    with engine_client(engine, timeouts) as client:
        while time.monotonic() < deadline:
            try:
                in_flight = max(client.metrics().in_flight, _picked_for(engine))
            except EngineError:
                return  # it cannot be asked, so it cannot be finishing anything for us
            if in_flight == 0:
                on_progress(f"{engine.name}: drained")
                return
            on_progress(f"  draining: {in_flight:g} requests in flight")
            time.sleep(POLL_INTERVAL_S)
    on_progress(f"{engine.name}: drain timeout; stopping with work in flight")
