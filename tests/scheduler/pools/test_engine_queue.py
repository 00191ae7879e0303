"""An engine's own waiting queue: how many requests beyond its seats the fair queue lets it
hold (GPUSHARE_ENGINE_QUEUED_PER_SEAT) and the seats offline work leaves free
(GPUSHARE_OFFLINE_RESERVE_PER_SEAT), as synced from the database, and the class priority
each request carries into that queue."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from protocol.classes import REQUEST_CLASSES, engine_priority
from scheduler.engines.calls import engine_body
from scheduler.models import Device, Engine, EngineStatus
from scheduler.pools.policies import fair_queue, sync_engine
from tests.scheduler.online.test_admission import MODEL_CONFIG

pytestmark = pytest.mark.django_db


def ready_engine(model_dir: Path, max_num_seqs: int) -> Engine:
    (model_dir / "config.json").write_text(json.dumps(MODEL_CONFIG))
    device = Device.objects.create(
        node="n1", kind="cpu", index=0, name="cpu", memory_bytes=2**34, capacity_units=64
    )
    return Engine.objects.create(
        name="e1", model_path=str(model_dir), served_model_name="m", device=device,
        footprint_units=4, port=1, status=EngineStatus.READY, kv_capacity_tokens=10_000,
        max_num_seqs=max_num_seqs,
    )  # fmt: skip


@pytest.mark.parametrize(("per_seat", "seats", "queued"), [(1.0, 16, 16), (0.25, 10, 3), (0, 8, 0)])
def test_an_engine_is_given_its_queue_per_seat(
    redis_db, settings, tmp_path: Path, per_seat: float, seats: int, queued: int
) -> None:
    settings.GPUSHARE_ENGINE_QUEUED_PER_SEAT = per_seat
    sync_engine(ready_engine(tmp_path, seats))
    policy = redis_db.hgetall(fair_queue().keys.engine("m", "e1"))
    assert int(policy["max_num_seqs"]) == seats
    assert int(policy["queued"]) == queued


@pytest.mark.parametrize(
    ("per_seat", "seats", "reserve"),
    [(0.25, 4, 1), (0.25, 10, 3), (0, 8, 0), (0.25, 1, 0), (1, 3, 2)],
)
def test_an_engine_is_given_its_offline_reserve_and_gate_margin(
    redis_db, settings, tmp_path: Path, per_seat: float, seats: int, reserve: int
) -> None:
    settings.GPUSHARE_OFFLINE_RESERVE_PER_SEAT = per_seat
    settings.GPUSHARE_OFFLINE_GATE_MARGIN = 0.15
    sync_engine(ready_engine(tmp_path, seats))
    policy = redis_db.hgetall(fair_queue().keys.engine("m", "e1"))
    assert int(policy["offline_reserve"]) == reserve
    assert float(policy["offline_gate_margin"]) == 0.15


def test_the_engine_gets_the_class_priority_never_the_clients() -> None:
    request = {
        "endpoint": "completions", "body": {"model": "m", "prompt": "hi", "priority": -100},
        "stream": False, "tenant_id": 1,
    }  # fmt: skip
    # Inside a class, the fair queue's order (the stamp); across classes, the class first,
    # whatever the stamps: an interactive request of a large stamp goes before standard work.
    stamps = [10.0**9, 5.0, 0.0]
    priorities = [
        engine_body(request, cls, stamp)["priority"]
        for cls, stamp in zip(REQUEST_CLASSES, stamps, strict=True)
    ]
    assert priorities == [
        engine_priority(c, s) for c, s in zip(REQUEST_CLASSES, stamps, strict=True)
    ]
    assert priorities == sorted(set(priorities))
    low, high = (engine_body(request, "standard", s)["priority"] for s in (1.0, 2.5))
    assert low < high
