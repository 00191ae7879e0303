"""Routing within a pool, with PostgreSQL and the real Redis fair queue: only a ready engine
gets jobs (not one that is starting or still warming), a draining engine gets no new job
while its in-flight one finishes, and a job goes to the ready engine with the most free KV
(ties: fewest in flight)."""

from __future__ import annotations

import json
import time

import pytest
import redis

from fairqueue.domain import JobRejected
from fairqueue.queue import FairQueue
from scheduler.engines import supervisor
from scheduler.engines.supervisor import Timeouts, engine_stop
from scheduler.models import Device, Engine, EngineStatus
from scheduler.pools.policies import (
    enqueue_resyncing,
    fair_queue,
    sync_all_engines,
    sync_engine,
    sync_engines_if_changed,
    sync_tenant,
)
from scheduler.services import engine_set_status
from tenants.models import Tenant
from tests.factories import TenantFactory

MODEL = "tiny-llama"
POOL = MODEL
MODEL_CONFIG = {
    "model_type": "llama",
    "hidden_size": 128,
    "num_attention_heads": 2,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "dtype": "bfloat16",
}
# 2 x 2 layers x 2 heads x 64 x 2 bytes
BYTES_PER_TOKEN = 1024
JOB_TOKENS = 100
FAST = Timeouts(start_s=5, drain_s=1, stop_s=2, http_s=0.5, generate_s=1)


@pytest.fixture
def model_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(MODEL_CONFIG))
    return tmp_path


@pytest.fixture
def device(db) -> Device:
    return Device.objects.create(
        node="n1", kind="cpu", index=0, name="cpu", memory_bytes=2**34, capacity_units=64
    )


@pytest.fixture
def queue(redis_db: redis.Redis, db) -> FairQueue:
    queue = fair_queue()
    sync_tenant(TenantFactory.create(slug="acme", quota_units=16))
    return queue


def make_engine(device: Device, model_dir, name: str, status: str, *, kv_tokens: int = 10_000,
                port: int = 1) -> Engine:  # fmt: skip
    # Port 1 refuses connections at once: nothing here talks to an engine.
    return Engine.objects.create(
        name=name, model_path=str(model_dir), served_model_name=MODEL, device=device,
        footprint_units=4, port=port, status=status, kv_capacity_tokens=kv_tokens,
        max_num_seqs=32,
    )  # fmt: skip


def enqueue(queue: FairQueue, count: int = 1) -> None:
    for _ in range(count):
        queue.enqueue(
            tenant="acme", pool=POOL, request_class="standard", prompt_tokens=JOB_TOKENS // 2,
            max_tokens=JOB_TOKENS // 2, kv_bytes=JOB_TOKENS * BYTES_PER_TOKEN,
        )  # fmt: skip


def picks(queue: FairQueue, count: int) -> list[str]:
    jobs = [queue.pick(POOL) for _ in range(count)]
    return [job.engine_id if job else "" for job in jobs]


@pytest.mark.parametrize(
    "status", [EngineStatus.STARTING, EngineStatus.WARMING, EngineStatus.FAILED,
               EngineStatus.STOPPED, EngineStatus.DRAINING],
)  # fmt: skip
def test_an_engine_that_is_not_ready_gets_no_job(queue, device, model_dir, status):
    make_engine(device, model_dir, "ready", EngineStatus.READY, kv_tokens=1_000)
    # Much more free KV: it would be chosen first if it were in the pool.
    make_engine(device, model_dir, "other", status, kv_tokens=100_000, port=2)
    sync_all_engines(queue)
    enqueue(queue, 4)

    assert queue.pool_engines(POOL) == ["ready"]
    assert picks(queue, 4) == ["ready"] * 4
    with pytest.raises(redis.ResponseError):
        queue.pick(POOL, "other")  # not even a direct pick reaches it


def test_with_only_warming_engines_jobs_wait_and_go_to_the_first_that_becomes_ready(
    queue, device, model_dir
):
    warming = make_engine(device, model_dir, "w1", EngineStatus.WARMING)
    sync_all_engines(queue)
    with pytest.raises(JobRejected):  # a pool with no ready engine takes no job at all
        enqueue(queue)
    starting = make_engine(device, model_dir, "w2", EngineStatus.READY, kv_tokens=500, port=2)
    sync_all_engines(queue)
    enqueue(queue, 2)
    engine_set_status(engine=starting, status=EngineStatus.DRAINING)
    sync_all_engines(queue)
    assert queue.pick(POOL) is None  # nothing ready: the jobs wait

    engine_set_status(engine=warming, status=EngineStatus.READY)
    sync_all_engines(queue)
    assert picks(queue, 2) == ["w1", "w1"]


def test_a_draining_engine_takes_no_new_job_while_its_in_flight_job_finishes(
    queue, device, model_dir
):
    old = make_engine(device, model_dir, "old", EngineStatus.READY, kv_tokens=100_000)
    make_engine(device, model_dir, "new", EngineStatus.READY, kv_tokens=10_000, port=2)
    sync_all_engines(queue)
    enqueue(queue)
    running = queue.pick(POOL)
    assert running is not None
    assert running.engine_id == "old"  # most free KV

    engine_set_status(engine=old, status=EngineStatus.DRAINING)
    sync_all_engines(queue)
    enqueue(queue, 3)
    assert picks(queue, 3) == ["new"] * 3
    assert supervisor._picked_for(old) == 1  # the drain waits for it

    assert queue.release(running.pool, running.job_id, 50, 20, attempt=running.attempt)
    assert supervisor._picked_for(old) == 0
    assert queue.snapshot().engine_reserved_bytes.get("old", 0) == 0
    enqueue(queue)
    assert picks(queue, 1) == ["new"]


def test_stopping_an_engine_takes_it_out_of_the_pool_before_the_drain_waits(
    queue, device, model_dir, monkeypatch
):
    make_engine(device, model_dir, "a", EngineStatus.READY, kv_tokens=100_000)
    make_engine(device, model_dir, "b", EngineStatus.READY, port=2)
    sync_all_engines(queue)
    enqueue(queue)
    in_flight = queue.pick(POOL)
    assert in_flight is not None
    assert in_flight.engine_id == "a"
    seen: dict[str, object] = {}

    def drain(engine: Engine, **_: object) -> None:
        seen["pool"] = queue.pool_engines(POOL)  # no periodic sync has run
        seen["picked"] = supervisor._picked_for(engine)
        enqueue(queue)
        seen["next"] = queue.pick(POOL)

    monkeypatch.setattr(supervisor, "_drain", drain)
    # Its process counts as alive (there is none: nothing here starts an engine).
    monkeypatch.setattr(supervisor, "_process_alive", lambda engine: True)
    stopped = engine_stop(name="a", timeouts=FAST)

    assert stopped.status == EngineStatus.STOPPED
    assert seen["pool"] == ["b"]
    assert seen["picked"] == 1
    assert getattr(seen["next"], "engine_id", None) == "b"
    assert queue.release(in_flight.pool, in_flight.job_id, 50, 10, attempt=in_flight.attempt)


def test_a_stopped_engine_stays_out_of_the_pool_if_a_stale_row_put_it_back_meanwhile(
    queue, device, model_dir, monkeypatch
):
    stale = make_engine(device, model_dir, "a", EngineStatus.READY, kv_tokens=100_000)
    make_engine(device, model_dir, "b", EngineStatus.READY, port=2)
    sync_all_engines(queue)
    # During the drain, something that read the row while it was ready syncs it again.
    monkeypatch.setattr(supervisor, "_drain", lambda engine, **_: sync_engine(stale, queue))
    monkeypatch.setattr(supervisor, "_process_alive", lambda engine: True)
    engine_stop(name="a", timeouts=FAST)

    assert queue.pool_engines(POOL) == ["b"]


def test_a_request_routed_by_a_cached_ready_row_does_not_bring_a_drained_engine_back(
    queue, device, model_dir
):
    engine = make_engine(device, model_dir, "a", EngineStatus.READY)
    sync_all_engines(queue)
    cached = Engine.objects.get(pk=engine.pk)  # as the web's routes hold it
    engine_set_status(engine=engine, status=EngineStatus.DRAINING)
    sync_all_engines(queue)  # the drain took it out of the picks

    with pytest.raises(JobRejected) as rejected:
        enqueue_resyncing(
            lambda: enqueue(queue), engine=cached, tenant=Tenant.objects.get(slug="acme"),
            queue=queue,
        )  # fmt: skip
    assert rejected.value.reason == "no_engine"
    assert queue.pool_engines(POOL) == []


def test_a_job_goes_to_the_ready_engine_with_the_most_free_kv(queue, device, model_dir):
    make_engine(device, model_dir, "small", EngineStatus.READY, kv_tokens=1_000)
    make_engine(device, model_dir, "large", EngineStatus.READY, kv_tokens=3_000, port=2)
    make_engine(device, model_dir, "medium", EngineStatus.READY, kv_tokens=2_000, port=3)
    sync_all_engines(queue)
    enqueue(queue, 12)
    # Each job reserves 100 tokens: large goes first until its free KV falls to medium's.
    got = picks(queue, 12)
    assert got[:10] == ["large"] * 10
    assert got[10:] == ["medium", "large"]  # a tie at 2,000 free: medium has none in flight


def test_ties_in_free_kv_go_to_the_engine_with_fewest_jobs_in_flight(queue, device, model_dir):
    make_engine(device, model_dir, "busy", EngineStatus.READY, kv_tokens=1_100)
    make_engine(device, model_dir, "idle", EngineStatus.READY, kv_tokens=1_000, port=2)
    sync_all_engines(queue)
    enqueue(queue)
    first = queue.pick(POOL)
    assert first is not None
    assert first.engine_id == "busy"
    # Now both have 1,000 tokens free; "busy" has a job in flight, "idle" none.
    enqueue(queue)
    assert picks(queue, 1) == ["idle"]


def test_housekeeping_copies_the_engines_again_only_after_one_was_saved(
    queue, device, model_dir, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        make_engine(device, model_dir, "first", EngineStatus.READY)
    assert sync_engines_if_changed(queue) == 1
    queue.remove_engine("first")  # the copy is not read back while no engine changed
    assert sync_engines_if_changed(queue) is None
    assert queue.pool_engines(POOL) == []

    with django_capture_on_commit_callbacks(execute=True):
        make_engine(device, model_dir, "second", EngineStatus.READY, port=2)
    assert sync_engines_if_changed(queue) == 2
    assert sorted(queue.pool_engines(POOL)) == ["first", "second"]

    with django_capture_on_commit_callbacks(execute=True):
        Engine.objects.get(name="second").delete()
    assert sync_engines_if_changed(queue) == 1
    assert queue.pool_engines(POOL) == ["first"]


def test_housekeeping_copies_the_engines_after_the_recheck_interval_whatever_happened(
    queue, device, model_dir, settings
):
    settings.GPUSHARE_CHANGE_RECHECK_S = 0.2
    make_engine(device, model_dir, "first", EngineStatus.READY)
    assert sync_engines_if_changed(queue) == 1
    # A change no signal sees (queryset.update), and a copy that went missing.
    Engine.objects.filter(name="first").update(status=EngineStatus.FAILED)
    assert sync_engines_if_changed(queue) is None
    assert queue.pool_engines(POOL) == ["first"]
    time.sleep(0.3)
    assert sync_engines_if_changed(queue) == 0
    assert queue.pool_engines(POOL) == []
