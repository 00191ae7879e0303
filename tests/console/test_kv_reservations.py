"""The queues page's KV reservations, through Django's test client over real rows and the
real Redis (REDIS_URL): each pool's mode, each engine's reservations against its budget, what
it measured beyond them, the share of the budget picks may fill while it preempts, and each
tenant's predicted output."""

from __future__ import annotations

import re
from html import unescape

import pytest
from django.test import Client

from capacity.units import UNIT_BYTES
from fairqueue import EnginePolicy
from scheduler.pools.policies import fair_queue

pytestmark = pytest.mark.django_db


def section(html: str) -> str:
    found = re.search(r'<section class="card" id="kv">.*?</section>', html, re.S)
    assert found is not None
    return unescape(re.sub(r"<[^>]+>", " ", found.group(0)))


def run_answers(count: int, tokens: int) -> None:
    queue = fair_queue()
    for _ in range(count):
        job = queue.enqueue(
            tenant="acme", pool="llama", request_class="standard", prompt_tokens=10,
            max_tokens=1000, kv_bytes=UNIT_BYTES, kv_floor=UNIT_BYTES // 8, kv_token=1000,
            observed=True,
        )  # fmt: skip
        picked = queue.pick("llama", "llama-a")
        assert picked is not None
        assert picked.job_id == job.job_id
        assert queue.release(job.pool, job.job_id, 10, tokens)


@pytest.mark.usefixtures("engine")
def test_the_page_shows_each_engines_reservations_and_the_tenants_predictions(
    console: Client,
) -> None:
    queue = fair_queue()
    queue.set_engine_policy(
        EnginePolicy("llama-a", "llama", kv_budget_bytes=8 * UNIT_BYTES, max_num_seqs=16,
                     reservation="predict")
    )  # fmt: skip
    run_answers(8, 300)
    queue.enqueue(
        tenant="acme", pool="llama", request_class="standard", prompt_tokens=10,
        max_tokens=1000, kv_bytes=UNIT_BYTES, kv_floor=UNIT_BYTES // 2, kv_token=1000,
    )  # fmt: skip
    assert queue.pick("llama", "llama-a") is not None
    queue.set_engine_load("llama", "llama-a", 0.1, kv_usage=0.75, preempted=4)
    text = " ".join(section(console.get("/console/queues/").content.decode()).split())
    assert "Pool llama : predict: prompt + p95" in text
    assert "llama-a a prediction" in text
    reserved = (UNIT_BYTES // 2 + 300 * 1000) / UNIT_BYTES
    assert f"{reserved:.2f} / 8.00 units" in text
    assert f"{6 - reserved:.2f} units" in text  # measured beyond the reservations
    assert "0.80" in text  # picks may fill 80 % while it preempts
    assert "acme 300 tokens" in text


@pytest.mark.usefixtures("engine")
def test_an_engine_reserving_the_worst_case_says_so(console: Client, settings) -> None:
    settings.GPUSHARE_KV_RESERVATION = "worst"
    fair_queue().set_engine_policy(
        EnginePolicy("llama-a", "llama", kv_budget_bytes=8 * UNIT_BYTES, max_num_seqs=16)
    )
    text = " ".join(section(console.get("/console/queues/").content.decode()).split())
    assert "Pool llama : worst case (settings)" in text
    assert "llama-a the worst case 0.00 / 8.00 units" in text
