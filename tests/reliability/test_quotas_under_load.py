"""500 concurrent requests from 10 tenants with tiny quotas, with the fair queue sampled all
the while: no tenant ever holds more than its quota plus burst, no engine runs more than its
seats, and every request is answered (200, 429 or 503) before the client's timeout.

The tenants: two with no quota at all (every request is refused, 429), two with nothing but
burst (they borrow only while the engine has idle room, so under this load they mostly
wait), four with one unit, one with a 10-requests-a-minute limit and one with a small
tokens-a-minute limit."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter, defaultdict
from typing import Any

import httpx

from capacity.units import UNIT_BYTES
from scheduler.pools.policies import engine_queue
from tests.reliability.conftest import Stack
from tests.reliability.helpers import (
    CLIENT_TIMEOUT_S,
    chat_body,
    make_tenant,
    reserved_totals,
    scheduler_check,
    wait_until,
)

PER_TENANT = 50
SEATS = 16
IN_FLIGHT = SEATS + engine_queue(SEATS)
TENANTS: list[dict[str, str]] = [
    {"quota_units": "0", "burst_units": "0"},
    {"quota_units": "0", "burst_units": "0"},
    {"quota_units": "0", "burst_units": "1"},
    {"quota_units": "0", "burst_units": "1"},
    {"quota_units": "1", "burst_units": "0"},
    {"quota_units": "1", "burst_units": "0"},
    {"quota_units": "1", "burst_units": "0"},
    {"quota_units": "1", "burst_units": "0"},
    {"quota_units": "1", "burst_units": "0", "rpm": "10"},
    {"quota_units": "1", "burst_units": "0", "tpm": "2000"},
]


class Sampler(threading.Thread):
    """Reads the fair queue's reservations as fast as it can until stopped."""

    def __init__(self, queue: Any, limits: dict[str, int]) -> None:
        super().__init__(daemon=True)
        self.queue = queue
        self.limits = limits
        self.violations: list[str] = []
        self.stopped = threading.Event()
        self.samples = 0
        self.peak_tenant: dict[str, int] = defaultdict(int)
        self.peak_inflight = 0
        self.peak_waiting = 0

    def run(self) -> None:
        while not self.stopped.is_set():
            snap = self.queue.snapshot()
            self.samples += 1
            for tenant, nbytes in snap.tenant_reserved_bytes.items():
                self.peak_tenant[tenant] = max(self.peak_tenant[tenant], nbytes)
            self.peak_inflight = max([self.peak_inflight, *snap.engine_inflight.values()])
            self.peak_waiting = max(self.peak_waiting, sum(r.waiting for r in snap.queues))
            self.check(snap)
            time.sleep(0.02)

    def check(self, snap: Any) -> None:
        for tenant, nbytes in snap.tenant_reserved_bytes.items():
            limit = self.limits.get(tenant)
            if limit is not None and nbytes > limit:
                self.violations.append(f"{tenant} held {nbytes} > {limit}")
        for engine, jobs in snap.engine_inflight.items():
            if jobs > IN_FLIGHT:  # its seats, and the requests waiting in its own queue
                self.violations.append(f"{engine} held {jobs} > {IN_FLIGHT}")


def parsed(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text[:2000]


async def one(http: httpx.AsyncClient, key: str, stream: bool) -> tuple[int, Any]:
    body = chat_body(96, stream=stream)
    headers = {"Authorization": f"Bearer {key}"}
    if not stream:
        response = await http.post("/v1/chat/completions", json=body, headers=headers)
        return response.status_code, parsed(response)
    async with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as resp:
        if resp.status_code != 200:
            await resp.aread()
            return resp.status_code, parsed(resp)
        lines = [line async for line in resp.aiter_lines() if line.startswith("data: ")]
        # A stream that does not end with [DONE] counts as a failure (status 0).
        return (200 if lines and lines[-1] == "data: [DONE]" else 0), lines[-3:]


async def flood(base_url: str, keys: list[tuple[str, str]]) -> list[tuple[str, int, Any]]:
    limits = httpx.Limits(max_connections=600, max_keepalive_connections=600)
    async with httpx.AsyncClient(
        base_url=base_url, timeout=CLIENT_TIMEOUT_S, limits=limits
    ) as http:

        async def tagged(slug: str, key: str, i: int) -> tuple[str, int, Any]:
            try:
                status, body = await one(http, key, stream=i % 5 == 0)
            except httpx.HTTPError as exc:  # a client timeout is a hang: status 0
                return slug, 0, f"{type(exc).__name__}: {exc}"
            return slug, status, body

        tasks = [tagged(slug, key, i) for i in range(PER_TENANT) for slug, key in keys]
        return await asyncio.gather(*tasks)


def test_quotas_hold_at_every_sample_and_every_request_is_answered(stack: Stack) -> None:
    platform, queue = stack.platform, stack.fair_queue()
    keys: list[tuple[str, str]] = []
    limits: dict[str, int] = {}
    for options in TENANTS:
        slug, key = make_tenant(platform, **options)
        keys.append((slug, key))
        limits[slug] = (int(options["quota_units"]) + int(options["burst_units"])) * UNIT_BYTES
    sampler = Sampler(queue, limits)
    sampler.start()
    started = time.monotonic()
    try:
        results = asyncio.run(flood(platform.base_url, keys))
    finally:
        sampler.stopped.set()
        sampler.join(timeout=10)
    elapsed = time.monotonic() - started

    statuses = Counter(status for _, status, _ in results)
    per_tenant = {slug: dict(Counter(s for t, s, _ in results if t == slug)) for slug, _ in keys}
    print(f"\n{len(results)} requests in {elapsed:.1f} s: {dict(statuses)}")
    print(f"{sampler.samples} samples; peak in flight {sampler.peak_inflight}, "
          f"peak waiting {sampler.peak_waiting}")  # fmt: skip
    for slug, _ in keys:
        peak = sampler.peak_tenant.get(slug, 0) / UNIT_BYTES
        print(f"  {slug} limit {limits[slug] / UNIT_BYTES:g} u, peak {peak:.4f} u: "
              f"{per_tenant[slug]}")  # fmt: skip

    assert len(results) == PER_TENANT * len(TENANTS)
    odd = [(status, body) for _, status, body in results if status not in (200, 429, 503)]
    assert odd == [], odd[:5]
    for _, status, body in results:
        if status != 200:
            assert isinstance(body, dict), body
            assert "error" in body, body
    assert sampler.samples > 50
    assert sampler.violations == []
    for slug, _ in keys[:2]:  # no quota, no burst: nothing is ever admitted
        assert per_tenant[slug].get(200, 0) == 0, per_tenant[slug]
    assert per_tenant[keys[8][0]].get(200, 0) <= 10  # 10 a minute
    assert statuses[200] > 0

    wait_until(lambda: reserved_totals(queue) == (0, 0), 30, "reservations back to zero")
    report = scheduler_check(platform)
    assert "no drift" in report, report
