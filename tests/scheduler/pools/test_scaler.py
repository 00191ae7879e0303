"""Pools and the scaler with PostgreSQL and the real Redis fair queue: pools and their
engines from one launch profile, the scaler tick's decisions logged with reasons and sent to
the engine's node queue, carried out (or failed, or expired), and the operators' command.

The engines are registered but never started: the node task's supervisor calls are
replaced, everything else (queue samples, decisions, the log) is real."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from plumbing.errors import DomainError
from scheduler import worker_tasks
from scheduler.engines.supervisor import EngineStartError
from scheduler.models import (
    DecisionOutcome,
    Device,
    Engine,
    EngineStatus,
    Pool,
    ScalingDecision,
)
from scheduler.pools import scaler
from scheduler.pools.policies import fair_queue, sync_all_engines, sync_tenant
from scheduler.selectors import pool_engines, scaling_decisions
from scheduler.services import (
    engine_set_status,
    pool_add_engines,
    pool_apply_profile,
    pool_create,
    pool_update,
)
from tests.factories import TenantFactory
from tests.support.sent_tasks import SentTask, SentTasks
from workers import scaling_tasks

MODEL = "tiny-llama"
MODEL_CONFIG = {
    "model_type": "llama",
    "hidden_size": 128,
    "num_attention_heads": 2,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "dtype": "bfloat16",
}


@pytest.fixture
def device(db) -> Device:
    return Device.objects.create(
        node="node-a", kind="cpu", index=0, name="cpu", memory_bytes=2**34, capacity_units=64
    )


@pytest.fixture
def pool(device, tmp_path) -> Pool:
    (tmp_path / "config.json").write_text(json.dumps(MODEL_CONFIG))
    return pool_create(
        served_model_name=MODEL, model_path=str(tmp_path), footprint_units=4, hot_size=1,
        cold_max=2, target_wait_s=5.0, target_depth=4, sustain_s=30, quiet_period_s=60,
        max_num_seqs=8,
    )  # fmt: skip


@pytest.fixture
def sent(sent_tasks: SentTasks) -> list[SentTask]:
    """Node tasks the scaler sends, instead of a broker."""
    return sent_tasks.calls


@pytest.fixture
def supervisor_calls(monkeypatch) -> list[tuple[str, str]]:
    """engine_start/engine_stop as the supervisor leaves them, without processes."""
    calls: list[tuple[str, str]] = []

    def start(*, name: str) -> Engine:
        calls.append(("start", name))
        engine = Engine.objects.get(name=name)
        return engine_set_status(
            engine=engine, status=EngineStatus.READY, detail="ready in 1 s",
            kv_capacity_tokens=10_000, started=True,
        )  # fmt: skip

    def stop(*, name: str) -> Engine:
        calls.append(("stop", name))
        engine = Engine.objects.get(name=name)
        return engine_set_status(engine=engine, status=EngineStatus.STOPPED, detail="stopped")

    monkeypatch.setattr(scaler, "engine_start", start)
    monkeypatch.setattr(scaler, "engine_stop", stop)
    return calls


def tick(pool: Pool, at, capture) -> ScalingDecision | None:
    with capture(execute=True):
        return scaler.scale_pool(pool, fair_queue().snapshot(), at)


def test_engines_are_registered_from_the_pools_launch_profile(pool):
    engines = pool_add_engines(pool=pool, count=3, first_port=9100)
    assert [e.name for e in engines] == ["tiny-llama-1", "tiny-llama-2", "tiny-llama-3"]
    assert [e.port for e in engines] == [9100, 9101, 9102]
    for engine in engines:
        assert engine.status == EngineStatus.STOPPED
        assert (engine.model_path, engine.footprint_units, engine.max_num_seqs) == (
            pool.model_path, 4, 8,
        )  # fmt: skip
    more = pool_add_engines(pool=pool, count=1, first_port=9100)
    assert (more[0].name, more[0].port) == ("tiny-llama-4", 9103)


def test_a_stopped_engine_takes_the_pools_current_profile_before_it_starts(pool):
    engine = pool_add_engines(pool=pool, count=1, first_port=9100)[0]
    pool_update(pool=pool, max_num_seqs=24, footprint_units=8)
    pool_apply_profile(pool=pool, engine=engine)
    engine.refresh_from_db()
    assert (engine.max_num_seqs, engine.footprint_units) == (24, 8)


def test_a_pools_engines_take_its_adapter_slots(pool):
    pool_update(pool=pool, max_loras=3, max_lora_rank=8)
    engine = pool_add_engines(pool=pool, count=1, first_port=9100)[0]
    assert (engine.max_loras, engine.max_lora_rank) == (3, 8)
    pool_update(pool=pool, max_loras=2)
    pool_apply_profile(pool=pool, engine=engine)
    engine.refresh_from_db()
    assert engine.max_loras == 2
    with pytest.raises(DomainError, match="max_lora_rank must be one of"):
        pool_update(pool=pool, max_lora_rank=12)


def test_a_pool_refuses_bad_peaks_time_zones_and_sizes(pool):
    with pytest.raises(DomainError, match="days"):
        pool_update(pool=pool, peaks=[{"start": "08:00", "end": "09:00", "days": [9]}])
    with pytest.raises(DomainError, match="time zone"):
        pool_update(pool=pool, timezone="Mars/Olympus")
    with pytest.raises(DomainError, match="at least one engine"):
        pool_update(pool=pool, hot_size=0, cold_max=0)
    with pytest.raises(DomainError, match="exists already"):
        pool_create(served_model_name=MODEL, model_path="x", footprint_units=4)


def test_the_tick_starts_the_hot_engines_on_their_node_and_logs_why(
    pool, redis_db, sent, supervisor_calls, django_capture_on_commit_callbacks
):
    pool_add_engines(pool=pool, count=3, first_port=9100)
    now = timezone.now()

    decision = tick(pool, now, django_capture_on_commit_callbacks)
    assert decision is not None
    assert (decision.action, decision.code, decision.outcome) == ("start", "floor", "pending")
    assert decision.engines == ["tiny-llama-1"]
    assert "0 live < hot size 1" in decision.reason
    assert sent == [
        SentTask(
            worker_tasks.SCALE_ENGINE,
            (decision.pk, "tiny-llama-1", "start"),
            {"queue": "gpushare.node.node-a", "expires": pytest.approx(scaler.pending_timeout_s())},
        )
    ]
    # While it is being carried out, nothing else is decided (and the hold is not logged).
    assert tick(pool, now + timedelta(seconds=10), django_capture_on_commit_callbacks) is None

    assert scaling_tasks.scale_engine(*sent[0].args) == "done"
    decision.refresh_from_db()
    assert decision.outcome == DecisionOutcome.DONE
    assert "ready in 1 s" in decision.outcome_detail
    assert supervisor_calls == [("start", "tiny-llama-1")]
    assert scaling_decisions(pool=pool) == [decision]


def test_a_queue_over_target_for_the_sustain_period_starts_a_cold_engine(
    pool, redis_db, sent, supervisor_calls, django_capture_on_commit_callbacks
):
    hot, _, _ = pool_add_engines(pool=pool, count=3, first_port=9100)
    engine_set_status(engine=hot, status=EngineStatus.READY, kv_capacity_tokens=100)
    queue = fair_queue()
    sync_all_engines(queue)
    sync_tenant(TenantFactory.create(slug="acme", quota_units=16))
    for _ in range(5):  # too big to run on the hot engine's 100 tokens: they wait
        queue.enqueue(
            tenant="acme", pool=MODEL, request_class="standard", prompt_tokens=50,
            max_tokens=40, kv_bytes=90 * 1024,
        )  # fmt: skip
    start = timezone.now()

    decisions = [
        tick(pool, start + timedelta(seconds=s), django_capture_on_commit_callbacks)
        for s in range(0, 31, 10)
    ]
    # The first moments are a spike (logged once), then the pressure has lasted 30 s.
    assert [d.code if d else None for d in decisions] == ["spike", None, None, "sustained"]
    started = decisions[-1]
    assert started is not None
    assert started.engines == ["tiny-llama-2"]
    assert "5 waiting" in started.reason
    assert [c.args[1:] for c in sent] == [("tiny-llama-2", "start")]


def test_a_quiet_pool_drains_one_cold_engine_on_its_node(
    pool, redis_db, sent, supervisor_calls, django_capture_on_commit_callbacks
):
    engines = pool_add_engines(pool=pool, count=2, first_port=9100)
    for engine in engines:
        engine_set_status(engine=engine, status=EngineStatus.READY, kv_capacity_tokens=1_000)
    sync_all_engines(fair_queue())
    start = timezone.now()

    decisions = [
        tick(pool, start + timedelta(seconds=s), django_capture_on_commit_callbacks)
        for s in range(0, 61, 10)
    ]
    assert [d.action if d else None for d in decisions] == [None] * 6 + ["drain"]
    drained = decisions[-1]
    assert drained is not None
    assert drained.code == "quiet"
    assert len(drained.engines) == 1
    assert sent[0].queue == "gpushare.node.node-a"
    assert scaling_tasks.scale_engine(*sent[0].args) == "done"
    assert supervisor_calls == [("stop", drained.engines[0])]
    statuses = sorted(e.status for e in pool_engines(pool=pool))
    assert statuses == [EngineStatus.READY, EngineStatus.STOPPED]


def test_a_failed_start_is_logged_with_why_and_retried_only_after_a_pause(
    pool, redis_db, sent, monkeypatch, django_capture_on_commit_callbacks
):
    pool_add_engines(pool=pool, count=1, first_port=9100)

    def fail(*, name: str) -> Engine:
        engine = Engine.objects.get(name=name)
        engine_set_status(engine=engine, status=EngineStatus.FAILED, detail="died")
        raise EngineStartError("the engine died while starting")

    monkeypatch.setattr(scaler, "engine_start", fail)
    now = timezone.now()
    decision = tick(pool, now, django_capture_on_commit_callbacks)
    assert decision is not None
    assert scaling_tasks.scale_engine(*sent[0].args) == "failed"
    decision.refresh_from_db()
    assert decision.outcome == DecisionOutcome.FAILED
    assert "died while starting" in decision.outcome_detail

    retry_wait = tick(pool, now + timedelta(seconds=10), django_capture_on_commit_callbacks)
    assert retry_wait is not None
    assert retry_wait.code == "retry_wait"
    again = tick(pool, now + timedelta(seconds=40), django_capture_on_commit_callbacks)
    assert again is not None
    assert (again.action, again.engines) == ("start", ["tiny-llama-1"])


def test_a_decision_no_node_carried_out_in_time_fails_and_frees_the_pool(
    pool, redis_db, sent, settings, django_capture_on_commit_callbacks
):
    pool_add_engines(pool=pool, count=1, first_port=9100)
    old = timezone.now() - timedelta(hours=1)
    stale = tick(pool, old, django_capture_on_commit_callbacks)
    assert stale is not None
    assert stale.outcome == DecisionOutcome.PENDING

    settings.GPUSHARE_SCALER_PENDING_TIMEOUT_S = 60.0
    with django_capture_on_commit_callbacks(execute=True):
        result = scaling_tasks.scaler_tick()
    stale.refresh_from_db()
    assert stale.outcome == DecisionOutcome.FAILED
    assert "worker running on the engine's node" in stale.outcome_detail
    # Its failure was long ago: the tick started the engine again.
    assert result == {MODEL: "start"}
    # A late node task changes nothing about the expired decision.
    scaler.scaling_decision_engine_done(decision_id=stale.pk, engine="x", ok=True)
    stale.refresh_from_db()
    assert stale.outcome == DecisionOutcome.FAILED


def test_holds_are_logged_once_per_reason(pool, redis_db, sent, django_capture_on_commit_callbacks):
    pool_update(pool=pool, cold_max=0)
    hot = pool_add_engines(pool=pool, count=1, first_port=9100)[0]
    engine_set_status(engine=hot, status=EngineStatus.READY, kv_capacity_tokens=100)
    queue = fair_queue()
    sync_all_engines(queue)
    sync_tenant(TenantFactory.create(slug="acme", quota_units=16))
    for _ in range(5):
        queue.enqueue(
            tenant="acme", pool=MODEL, request_class="interactive", prompt_tokens=50,
            max_tokens=40, kv_bytes=90 * 1024,
        )  # fmt: skip
    start = timezone.now()
    logged = [
        tick(pool, start + timedelta(seconds=s), django_capture_on_commit_callbacks)
        for s in range(0, 61, 10)
    ]
    assert [d.code for d in logged if d] == ["spike", "at_max"]
    assert sent == []


def test_only_the_engine_agent_consumes_its_nodes_queue(settings):
    settings.GPUSHARE_NODE_NAME = "gpu-node-7"
    settings.GPUSHARE_ENGINE_AGENT = True
    added: list[str] = []

    class Queues:
        def select_add(self, name: str) -> None:
            added.append(name)

    class Instance:
        class app:
            class amqp:
                queues = Queues()

    scaling_tasks._consume_node_queue(sender="w@host", instance=Instance())
    assert added == ["gpushare.node.gpu-node-7"]
    # A dispatch worker leaves it to the agent: its restart must not strand an engine start.
    settings.GPUSHARE_ENGINE_AGENT = False
    scaling_tasks._consume_node_queue(sender="w@host", instance=Instance())
    assert added == ["gpushare.node.gpu-node-7"]


def test_the_pool_command_creates_adds_engines_sets_and_shows(device, tmp_path, redis_db):
    (tmp_path / "config.json").write_text(json.dumps(MODEL_CONFIG))
    out = StringIO()
    peaks = json.dumps([{"name": "lunch", "start": "11:30", "end": "13:30", "extra": 1}])
    call_command(
        "pool", "create", MODEL, "--model", str(tmp_path), "--units", "4", "--hot", "1",
        "--cold-max", "1", "--peaks", peaks, stdout=out,
    )  # fmt: skip
    call_command("pool", "add-engines", MODEL, "--count", "2", "--port", "9200", stdout=out)
    call_command("pool", "set", MODEL, "--target-wait", "2.5", "--disable", stdout=out)
    assert "Registered engine 'tiny-llama-2'" in out.getvalue()
    assert "(disabled)" in out.getvalue()

    shown = StringIO()
    call_command("pool", "show", MODEL, "--json", stdout=shown)
    data = json.loads(shown.getvalue())
    assert data[0]["engines"] == {"tiny-llama-1": "stopped", "tiny-llama-2": "stopped"}
    assert data[0]["enabled"] is False
    assert Pool.objects.get().target_wait_s == 2.5
    with pytest.raises(CommandError, match="No pool"):
        call_command("pool", "show", "nope")
    with pytest.raises(CommandError, match="not JSON"):
        call_command("pool", "set", MODEL, "--peaks", "lunch")


def test_a_pool_with_a_broken_schedule_in_the_database_does_not_stop_the_others(
    pool, redis_db, sent, django_capture_on_commit_callbacks
):
    pool_add_engines(pool=pool, count=1, first_port=9100)
    broken = Pool.objects.create(
        served_model_name="other", model_path=pool.model_path, footprint_units=4,
        peaks=[{"start": "noon", "end": "13:00"}],
    )  # fmt: skip
    with django_capture_on_commit_callbacks(execute=True):
        result = scaling_tasks.scaler_tick()
    assert result == {MODEL: "start"}
    assert not ScalingDecision.objects.filter(pool=broken).exists()
