"""The scaler: a tick that samples each pool's online queue, decides with
`scheduler.pools.scaling.decide`, logs the decision and has it carried out on the engine's node.

Starting or stopping an engine must run on the node its device is on (the process is local
there), so a start or drain is sent to that node's own queue (`scheduler.worker_tasks`). The
tick itself can run on any worker; a Redis lock keeps two ticks from deciding at once.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta
from functools import partial

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from fairqueue.domain import Snapshot
from plumbing.errors import DomainError
from plumbing.redis import redis_client
from scheduler import worker_tasks
from scheduler.engines.supervisor import engine_start, engine_stop
from scheduler.models import (
    DecisionOutcome,
    Engine,
    Pool,
    ScalingAction,
    ScalingDecision,
)
from scheduler.pools.names import pool_id
from scheduler.pools.policies import fair_queue, sync_engine
from scheduler.pools.scaling import (
    Decision,
    EngineView,
    LastAction,
    PeakError,
    PoolPolicy,
    QueueSample,
    decide,
    parse_peaks,
)
from scheduler.selectors import pool_engines, pool_list
from scheduler.services import (
    pool_apply_profile,
    scaling_decision_engine_done,
    scaling_decision_record,
    scaling_decisions_expire,
)

log = logging.getLogger(__name__)

ONLINE_CLASSES = ("interactive", "standard")
SAMPLES_KEY = "gs:scaler:samples:{pool}"
LOCK_KEY = "gs:scaler:lock"
# Holds worth a line in the log (the reason changed); routine ones are not kept.
QUIET_HOLDS = ("steady", "in_progress")


def policy_of(pool: Pool) -> PoolPolicy:
    return PoolPolicy(
        hot_size=pool.hot_size,
        cold_max=pool.cold_max,
        target_wait_s=pool.target_wait_s,
        target_depth=pool.target_depth,
        sustain_s=pool.sustain_s,
        quiet_period_s=pool.quiet_period_s,
        peak_lead_s=pool.peak_lead_s,
        peaks=tuple(parse_peaks(pool.peaks)),
        timezone=pool.timezone,
    )


def sample_from(snapshot: Snapshot, pool: str, at: datetime) -> QueueSample:
    rows = [r for r in snapshot.queues if r.pool == pool and r.request_class in ONLINE_CLASSES]
    waits = [r.oldest_wait_s for r in rows if r.oldest_wait_s is not None and r.waiting]
    return QueueSample(
        at=at,
        waiting=sum(r.waiting for r in rows),
        oldest_wait_s=max(waits, default=0.0),
        running=sum(r.running for r in rows),
    )


def samples_keep(pool: Pool, sample: QueueSample) -> list[QueueSample]:
    """Store this tick's sample and return the pool's recent history, oldest first."""
    key = SAMPLES_KEY.format(pool=pool_id(pool.served_model_name))
    horizon = max(pool.sustain_s, pool.quiet_period_s) + 60
    stamp = sample.at.timestamp()
    value = json.dumps([stamp, sample.waiting, sample.oldest_wait_s, sample.running])
    client = redis_client()
    pipe = client.pipeline()
    pipe.zadd(key, {value: stamp})
    pipe.zremrangebyscore(key, "-inf", stamp - horizon)
    pipe.expire(key, int(horizon) + 60)
    pipe.zrange(key, 0, -1)
    raw = pipe.execute()[-1]
    samples = []
    for item in raw:
        at, waiting, oldest, running = json.loads(item)
        samples.append(
            QueueSample(
                at=datetime.fromtimestamp(at, tz=sample.at.tzinfo),
                waiting=int(waiting),
                oldest_wait_s=float(oldest),
                running=int(running),
            )
        )
    return samples


def last_action(pool: Pool) -> LastAction | None:
    latest = (
        ScalingDecision.objects.filter(
            pool=pool, action__in=(ScalingAction.START, ScalingAction.DRAIN)
        )
        .order_by("-at", "-pk")
        .first()
    )
    if latest is None:
        return None
    return LastAction(
        action=latest.action,
        at=latest.at,
        pending=latest.outcome == DecisionOutcome.PENDING,
        failed=latest.outcome == DecisionOutcome.FAILED,
    )


def engine_views(engines: list[Engine], snapshot: Snapshot) -> list[EngineView]:
    return [
        EngineView(
            name=e.name,
            status=str(e.status),
            max_num_seqs=e.max_num_seqs,
            in_flight=snapshot.engine_inflight.get(e.name, 0),
            started_at=e.started_at,
        )
        for e in engines
    ]


def _worth_logging(pool: Pool, decision: Decision) -> bool:
    if decision.changes_something:
        return True
    if decision.code in QUIET_HOLDS:
        return False
    previous = ScalingDecision.objects.filter(pool=pool).order_by("-at", "-pk").first()
    return previous is None or previous.code != decision.code


def pending_timeout_s() -> float:
    return float(settings.GPUSHARE_SCALER_PENDING_TIMEOUT_S)


def _send(decision_id: int, engine: str, node: str, action: str) -> None:
    worker_tasks.scale_engine(decision_id, engine, node, action, expires=pending_timeout_s())


def scale_pool(pool: Pool, snapshot: Snapshot, now: datetime) -> ScalingDecision | None:
    """One pool's tick: sample, decide, log, send. Returns the logged decision, if any."""
    history = samples_keep(pool, sample_from(snapshot, pool_id(pool.served_model_name), now))
    with transaction.atomic():
        # The row lock: one decision at a time for the pool, whoever ticks.
        pool = Pool.objects.select_for_update().get(pk=pool.pk)
        engines = list(pool_engines(pool=pool))
        decision = decide(
            policy=policy_of(pool),
            engines=engine_views(engines, snapshot),
            samples=history,
            now=now,
            last=last_action(pool),
        )
        if not _worth_logging(pool, decision):
            return None
        record = scaling_decision_record(pool=pool, decision=decision, at=now)
        by_name = {e.name: e for e in engines}
        for name in decision.engines:
            engine = by_name[name]
            if decision.action == ScalingAction.START:
                pool_apply_profile(pool=pool, engine=engine)
            transaction.on_commit(
                partial(_send, record.pk, engine.name, engine.device.node, decision.action)
            )
    log.info("scaler: %s %s (%s): %s", pool, decision.action, decision.code, decision.reason)
    return record


def scaler_tick() -> dict[str, str]:
    """Every few seconds: each enabled pool's decision (see scheduler.pools.scaling)."""
    client = redis_client()
    interval = float(settings.GPUSHARE_SCALER_INTERVAL_S)
    if not client.set(LOCK_KEY, "1", nx=True, ex=max(1, int(interval * 3))):
        return {}
    try:
        now = timezone.now()
        scaling_decisions_expire(older_than=now - timedelta(seconds=pending_timeout_s()))
        pools = list(pool_list(enabled_only=True))
        if not pools:  # nothing to scale: spare Redis the snapshot's round trips
            return {}
        snapshot = fair_queue().snapshot()
        done: dict[str, str] = {}
        for pool in pools:
            try:
                record = scale_pool(pool, snapshot, now)
            except (DomainError, PeakError) as exc:  # a bad pool must not stop the others
                log.warning("scaler: pool %s: %s", pool, exc)
                continue
            done[pool.served_model_name] = record.action if record else "hold"
        return done
    finally:
        client.delete(LOCK_KEY)


def scale_engine_carry_out(decision_id: int, engine: str, action: str) -> str:
    """Carry out one engine of a decision, on the engine's node: start (through warming to
    ready, then it takes picks at once) or drain then stop."""
    try:
        if action == ScalingAction.START:
            started = engine_start(name=engine)
            sync_engine(started)
            detail = started.status_detail
        else:
            stopped = engine_stop(name=engine)
            detail = stopped.status_detail
    except DomainError as exc:
        scaling_decision_engine_done(decision_id=decision_id, engine=engine, ok=False,
                                     detail=str(exc)[-2000:])  # fmt: skip
        return "failed"
    scaling_decision_engine_done(decision_id=decision_id, engine=engine, ok=True, detail=detail)
    return "done"
