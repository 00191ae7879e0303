"""Money over real traffic: what a real engine's answers used, priced, is what `/v1/spend`
says; and a hard-stopped budget refuses the tenant's next request with 429
insufficient_quota."""

from __future__ import annotations

import time
from decimal import Decimal
from typing import Any

import httpx

from tests.e2e.conftest import MODEL, make_tenant
from tests.support.harness import Platform


def chat(platform: Platform, key: str) -> httpx.Response:
    return httpx.post(
        f"{platform.base_url}/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "Count: 1 2 3"}],
            "max_tokens": 4,
        },
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )


def test_spend_prices_real_usage_and_a_hard_stop_refuses(platform_server: Platform):
    slug, key = make_tenant(platform_server)
    platform_server.manage("price", "set", MODEL, "--input", "1000", "--output", "3000")
    used = {"prompt": 0, "completion": 0}
    for _ in range(2):
        answer = chat(platform_server, key)
        assert answer.status_code == 200, answer.text
        used["prompt"] += answer.json()["usage"]["prompt_tokens"]
        used["completion"] += answer.json()["usage"]["completion_tokens"]

    def spent() -> dict[str, Any] | None:
        body = httpx.get(
            f"{platform_server.base_url}/v1/spend",
            params={"period": "day"},
            headers={"Authorization": f"Bearer {key}"},
        ).json()["total"]
        return body if body["requests"] == 2 else None  # the ledger's flush is periodic

    deadline = time.monotonic() + 45
    total = spent()
    while total is None and time.monotonic() < deadline:
        time.sleep(0.5)
        total = spent()
    assert total is not None
    assert (total["prompt_tokens"], total["completion_tokens"]) == (
        used["prompt"],
        used["completion"],
    )
    expected = (Decimal(used["prompt"]) * 1000 + Decimal(used["completion"]) * 3000) / 10**6
    assert Decimal(total["money"]) == expected

    platform_server.manage(
        "budget", "set", slug, "--amount", str(expected / 2), "--period", "day", "--hard-stop"
    )
    checked = platform_server.manage_json("budget", "check")
    assert [c["thresholds"] for c in checked if c["tenant"] == slug] == [[50, 80, 100]]
    # The web reads the stops from a cache trusted for GPUSHARE_AUTH_CACHE_S.
    deadline = time.monotonic() + 20
    refused = chat(platform_server, key)
    while refused.status_code == 200 and time.monotonic() < deadline:
        time.sleep(1)
        refused = chat(platform_server, key)
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "insufficient_quota"
