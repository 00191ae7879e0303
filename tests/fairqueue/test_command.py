"""`manage.py scheduler`: thin over FairQueue; these check the wiring and the exit status."""

from io import StringIO

import pytest
import redis
from django.core.management import call_command
from django.core.management.base import CommandError
from pytest_django.fixtures import Settings

from fairqueue import EnginePolicy, FairQueue, TenantPolicy
from tests.fairqueue.conftest import FAIRQUEUE_REDIS_URL

UNIT = 256 * 1024 * 1024


@pytest.fixture
def live(fq: FairQueue, settings: Settings) -> FairQueue:
    settings.REDIS_URL = FAIRQUEUE_REDIS_URL
    fq.set_tenant_policy("acme", TenantPolicy(1, 4 * UNIT))
    fq.set_engine_policy(EnginePolicy("e1", "chat", 8 * UNIT, 4))
    for _ in range(2):
        fq.enqueue(tenant="acme", pool="chat", request_class="standard", prompt_tokens=10,
                   max_tokens=10, kv_bytes=UNIT)  # fmt: skip
    assert fq.pick("chat", "e1") is not None
    return fq


def run(*args: str) -> str:
    out = StringIO()
    call_command("scheduler", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def test_check_passes_when_totals_match_in_flight_jobs(live: FairQueue) -> None:
    output = run("check")
    assert "tenant acme: 1 unit = 0.25 GiB reserved" in output
    assert "no drift" in output


def test_check_fails_on_drift_and_repair_fixes_it(live: FairQueue, fq_redis: redis.Redis) -> None:
    fq_redis.hincrby(live.keys.lease("chat", "acme"), "held", UNIT)
    with pytest.raises(CommandError, match="1 drift"):
        run("check")
    assert "repaired" in run("check", "--repair")
    assert "no drift" in run("check")


def test_status_lists_queues_and_reservations(live: FairQueue) -> None:
    output = run("status")
    assert "chat / standard / acme: 1, 1," in output
    assert "engine e1: 1 unit = 0.25 GiB reserved, 1 in flight" in output


def test_sweep_reaps_and_expires(live: FairQueue) -> None:
    assert run("sweep") == "reaped 0 lease(s), expired 0 job(s)\n"


def test_simulate_prints_shares_and_jains_index(live: FairQueue, fq_redis: redis.Redis) -> None:
    keys_before = fq_redis.dbsize()
    output = run("simulate", "--weights", "1,3", "--ticks", "400")
    assert "tenant2  3" in output
    assert "Jain's index" in output
    assert fq_redis.dbsize() == keys_before  # its own keys, cleaned up
