"""A pool's KV reservation mode: from the settings or the pool's own, checked, copied to its
engines' policies in the fair queue, and set and shown by `manage.py pool reservation`."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from plumbing.errors import DomainError
from scheduler.pools.policies import fair_queue, sync_engine
from scheduler.reservation.modes import (
    pool_reservation,
    pool_reservation_set,
    settings_reservation,
)
from tests.scheduler.pools.test_engine_queue import ready_engine

pytestmark = pytest.mark.django_db


def engine_fields(redis_db) -> dict[str, str]:
    return redis_db.hgetall(fair_queue().keys.engine("m", "e1"))


def test_engines_predict_by_default_and_a_pool_may_reserve_the_worst_case(
    redis_db, settings, tmp_path: Path
) -> None:
    settings.GPUSHARE_KV_RESERVATION = "predict"
    settings.GPUSHARE_OUTPUT_QUANTILE = 0.9
    engine = ready_engine(tmp_path, 8)
    sync_engine(engine)
    fields = engine_fields(redis_db)
    assert (fields["reservation"], float(fields["out_quantile"])) == ("predict", 0.9)

    assert pool_reservation_set(pool="m", mode="worst").source == "pool"
    sync_engine(engine)
    assert engine_fields(redis_db)["reservation"] == "worst"
    assert pool_reservation_set(pool="m", mode=None) == pool_reservation("m")
    assert pool_reservation("m").mode == "predict"


def test_a_mistake_is_refused_with_a_message(settings) -> None:
    with pytest.raises(DomainError, match="predict or worst"):
        pool_reservation_set(pool="m", mode="optimistic")
    settings.GPUSHARE_KV_RESERVATION = "best"
    with pytest.raises(DomainError, match="GPUSHARE_KV_RESERVATION"):
        settings_reservation()
    settings.GPUSHARE_KV_RESERVATION = "worst"
    settings.GPUSHARE_OUTPUT_QUANTILE = 0.2
    with pytest.raises(DomainError, match="GPUSHARE_OUTPUT_QUANTILE"):
        settings_reservation()


def test_the_command_sets_a_pools_mode_syncs_its_engines_and_shows_them(
    redis_db, settings, tmp_path: Path
) -> None:
    settings.GPUSHARE_KV_RESERVATION = "predict"
    sync_engine(ready_engine(tmp_path, 8))
    out = StringIO()
    call_command("pool", "reservation", "m", "--mode", "worst", stdout=out)
    assert "m: worst case (pool)" in out.getvalue()
    assert engine_fields(redis_db)["reservation"] == "worst"  # at once

    out = StringIO()
    call_command("pool", "reservation", "m", "--mode", "inherit", "--json", stdout=out)
    (shown,) = json.loads(out.getvalue())
    assert (shown["mode"], shown["source"]) == ("predict", "settings")
    (engine,) = shown["engines"]
    assert engine["mode"] == "predict"
    assert engine["free_bytes"] == engine["budget_bytes"] > 0
    with pytest.raises(CommandError, match="Name the pool"):
        call_command("pool", "reservation", "--mode", "worst", stdout=StringIO())
