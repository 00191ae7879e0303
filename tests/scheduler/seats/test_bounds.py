"""A pool's seat bounds: from the settings or the pool's own, checked, copied to its engines'
policies in the fair queue, and set and shown by `manage.py pool targets`."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from plumbing.errors import DomainError
from scheduler.pools.policies import fair_queue, sync_engine
from scheduler.seats.bounds import pool_bounds, pool_targets_set, settings_bounds
from tests.scheduler.pools.test_engine_queue import ready_engine

pytestmark = pytest.mark.django_db


def engine_fields(redis_db) -> dict[str, str]:
    return redis_db.hgetall(fair_queue().keys.engine("m", "e1"))


def test_with_no_targets_set_the_engine_bounds_no_class(redis_db, settings, tmp_path: Path) -> None:
    settings.GPUSHARE_TTFT_TARGETS_MS = {}
    settings.GPUSHARE_FIXED_SEATS_BELOW = {}
    sync_engine(ready_engine(tmp_path, 8))
    fields = engine_fields(redis_db)
    assert not [name for name in fields if name.startswith(("target:", "fixed:", "below:"))]
    (report,) = fair_queue().seat_reports()
    assert report.bounds == ()
    assert report.class_seats("offline") == 16  # every seat and place


def test_the_settings_targets_reach_the_engine_and_a_pool_overrides_them(
    redis_db, settings, tmp_path: Path
) -> None:
    settings.GPUSHARE_TTFT_TARGETS_MS = {"interactive": 300.0}
    settings.GPUSHARE_TARGET_QUANTILE = 0.99
    engine = ready_engine(tmp_path, 8)
    sync_engine(engine)
    fields = engine_fields(redis_db)
    assert float(fields["target:interactive"]) == 0.3
    assert float(fields["target_quantile"]) == 0.99

    bounds = pool_targets_set(
        pool="m", ttft_targets_ms={"standard": 2000}, fixed_seats_below={"interactive": 3}
    )
    assert (bounds.targets_from, bounds.fixed_from) == ("pool", "pool")
    sync_engine(engine)
    fields = engine_fields(redis_db)
    assert "target:interactive" not in fields  # the pool's own replace the settings'
    assert float(fields["target:standard"]) == 2.0
    assert int(fields["fixed:interactive"]) == 3

    pool_targets_set(pool="m", ttft_targets_ms=None)  # back to the settings' targets
    assert pool_bounds("m").ttft_targets_ms == {"interactive": 300.0}
    assert pool_bounds("m").fixed_seats_below == {"interactive": 3}
    pool_targets_set(pool="m", fixed_seats_below=None)
    assert pool_bounds("m").fixed_from == "settings"


@pytest.mark.parametrize(
    ("targets", "fixed", "says"),
    [
        ({"offline": 100}, None, "no classes below it"),
        ({"interactive": 0}, None, "must be over 0 ms"),
        ({"interactive": "fast"}, None, "must be a number"),
        ({"interactive": float("inf")}, None, "finite"),
        (None, {"interactive": 0}, "whole number >= 1"),
        (None, {"standard": 2.5}, "whole number >= 1"),
    ],
)
def test_bad_bounds_are_refused_with_a_message(targets, fixed, says) -> None:
    changes = {"ttft_targets_ms": targets} if targets is not None else {"fixed_seats_below": fixed}
    with pytest.raises(DomainError, match=says):
        pool_targets_set(pool="m", **changes)


def test_a_mistake_in_the_settings_names_the_setting(settings) -> None:
    settings.GPUSHARE_TTFT_TARGETS_MS = {"batch": 5.0}
    with pytest.raises(DomainError, match="GPUSHARE_TTFT_TARGETS_MS"):
        settings_bounds()


def test_the_command_sets_a_pools_targets_syncs_its_engines_and_shows_them(
    redis_db, settings, tmp_path: Path
) -> None:
    settings.GPUSHARE_TTFT_TARGETS_MS = {}
    sync_engine(ready_engine(tmp_path, 8))
    out = StringIO()
    call_command("pool", "targets", "m", "--ttft-ms", "interactive=250", stdout=out)
    assert "TTFT p99 targets interactive 250 ms (pool)" in out.getvalue()
    assert float(engine_fields(redis_db)["target:interactive"]) == 0.25  # at once

    out = StringIO()
    call_command("pool", "targets", "m", "--fixed-seats", "interactive=2", "--json", stdout=out)
    (shown,) = json.loads(out.getvalue())
    (engine,) = shown["engines"]
    (bound,) = engine["bounds"]
    assert (bound["class"], bound["fixed"], bound["target_ms"]) == ("interactive", 2, 250.0)
    assert engine["class_seats"]["standard"] == 2

    call_command(
        "pool", "targets", "m", "--ttft-ms", "none", "--fixed-seats", "none", stdout=StringIO()
    )
    assert not [n for n in engine_fields(redis_db) if n.startswith(("target:", "fixed:"))]
    with pytest.raises(CommandError, match="no classes below it"):
        call_command("pool", "targets", "m", "--ttft-ms", "offline=5", stdout=StringIO())
    with pytest.raises(CommandError, match="CLASS=NUMBER"):
        call_command("pool", "targets", "m", "--ttft-ms", "interactive", stdout=StringIO())
