"""The Batch API end to end with the official `openai` client: files.create, batches.create,
poll, files.content against the real engine; validation failures; cancel mid-run; expiry; the
load gate; and durability with real processes: a worker SIGKILLed mid-batch, Redis losing
its data (FLUSHDB), the web process killed and started again.

Each durability test checks the same thing at the end: every custom_id of the input appears
exactly once across the output and error files, and the counts add up."""

from __future__ import annotations

import json
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest
import redis

from tests.e2e.conftest import E2E_REDIS_URL, MODEL, make_tenant
from tests.support.harness import Platform, kill_process, restart_process, start_process

FINAL = ("completed", "failed", "expired", "cancelled")
# The worker's lease for the kill test: short, so the reaper returns the dead worker's jobs
# within seconds rather than the default two minutes.
SHORT_LEASE = {"GPUSHARE_SCHED_LEASE_S": "4"}


def client_for(platform: Platform, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{platform.base_url}/v1", api_key=key, max_retries=0)


def chat_jsonl(count: int, max_tokens: int = 16, prefix: str = "req") -> bytes:
    lines = []
    for i in range(count):
        body = {
            "model": MODEL,
            "max_tokens": max_tokens,
            "temperature": 0,
            "messages": [{"role": "user", "content": f"tell me about item {i}"}],
        }
        item = {"custom_id": f"{prefix}-{i}", "method": "POST",
                "url": "/v1/chat/completions", "body": body}  # fmt: skip
        lines.append(json.dumps(item))
    return ("\n".join(lines) + "\n").encode()


def submit(client: openai.OpenAI, content: bytes, **options: Any) -> Any:
    uploaded = client.files.create(file=("input.jsonl", content), purpose="batch")
    return client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        **options,
    )


def wait_batch(
    client: openai.OpenAI,
    batch_id: str,
    until: Any = lambda b: b.status in FINAL,
    timeout: float = 180.0,
) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if until(batch):
            return batch
        time.sleep(0.3)
    raise AssertionError(f"batch {batch_id} not there in {timeout} s: {batch}")


def completed(batch: Any) -> int:
    return batch.request_counts.completed if batch.request_counts else 0


def jsonl(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    content = client.files.content(file_id).content
    return [json.loads(line) for line in content.splitlines() if line.strip()]


def assert_each_line_once(client: openai.OpenAI, batch: Any, count: int) -> tuple[list, list]:
    output = jsonl(client, batch.output_file_id)
    errors = jsonl(client, batch.error_file_id)
    seen = Counter(line["custom_id"] for line in output + errors)
    assert set(seen) == {f"req-{i}" for i in range(count)}
    assert max(seen.values()) == 1, [cid for cid, n in seen.items() if n > 1]
    counts = batch.request_counts
    assert (counts.total, counts.completed, counts.failed) == (count, len(output), len(errors))
    for line in output:
        assert line["error"] is None
        assert line["response"]["status_code"] == 200
        assert line["response"]["body"]["choices"][0]["message"]["role"] == "assistant"
    return output, errors


def direct_engine_seconds(platform: Platform, content: bytes, concurrency: int = 16) -> float:
    """How long the same requests take sent straight to the engine, 16 at a time: the
    baseline for the batch's throughput, measured on the same (shared) machine."""
    base_url, key = platform.shell(
        "import json; from scheduler.models import Engine; "
        "from scheduler.engines.auth import engine_api_key; url = Engine.objects.get().base_url; "
        "print(json.dumps([url, engine_api_key(url)]))"
    )
    bodies = [json.loads(line)["body"] for line in content.splitlines()]
    auth = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=base_url, headers=auth, timeout=120) as http:
        started = time.monotonic()
        with ThreadPoolExecutor(concurrency) as pool:
            codes = list(pool.map(lambda b: http.post("/v1/chat/completions", json=b), bodies))
        elapsed = time.monotonic() - started
    assert {r.status_code for r in codes} == {200}
    return elapsed


def set_offline_threshold(platform: Platform, threshold: float) -> None:
    """Holds the engine's load at or over (0) or under (0.4) its offline threshold, and
    tells the scheduler at once. The threshold moves, not the load: the load is sampled."""
    platform.shell(
        "from scheduler.models import Engine; "
        "from scheduler.pools.policies import sync_all_engines; "
        f"Engine.objects.update(offline_load_threshold={threshold}); sync_all_engines(); "
        "print(1)"
    )


def line_runs(platform: Platform, batch_id: str) -> dict[str, int]:
    return platform.shell(
        "import json; from scheduler.models import BatchLine; print(json.dumps(dict("
        f"BatchLine.objects.filter(batch__public_id='{batch_id}')"
        ".values_list('custom_id', 'runs'))))"
    )


def test_a_batch_runs_through_the_openai_client_and_lands_in_the_ledger(platform_server):
    slug, key = make_tenant(platform_server)
    client = client_for(platform_server, key)
    count = 200
    started = time.monotonic()
    batch = submit(client, chat_jsonl(count), metadata={"purpose": "e2e"})
    assert batch.status == "validating"
    assert batch.metadata == {"purpose": "e2e"}

    progress = wait_batch(client, batch.id, lambda b: completed(b) > 0)
    assert progress.status in ("in_progress", "finalizing", "completed")
    done = wait_batch(client, batch.id)
    assert done.status == "completed"
    _, errors = assert_each_line_once(client, done, count)
    assert errors == []
    assert done.error_file_id is None
    assert done.in_progress_at <= done.finalizing_at <= done.completed_at
    batch_s = time.monotonic() - started
    direct_s = direct_engine_seconds(platform_server, chat_jsonl(count))
    print(
        f"\n{count} lines: batch {count / batch_s:.1f} lines/s (submit to completed as polled), "
        f"the engine called directly 16 at a time {count / direct_s:.1f} req/s, "
        f"ratio {direct_s / batch_s:.2f}"
    )
    assert client.files.retrieve(done.output_file_id).purpose == "batch_output"

    rows = platform_server.shell(
        "import json; from tenants.models import UsageRecord as U; print(json.dumps(list("
        f"U.objects.filter(tenant__slug='{slug}').values_list('request_class', 'batch_id', "
        "'outcome').order_by().distinct())))"
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        total = platform_server.shell(
            "from tenants.models import UsageRecord as U; "
            f"print(U.objects.filter(tenant__slug='{slug}').count())"
        )
        if total >= count:
            break
        time.sleep(1)
    breakdown = platform_server.shell(
        "import json; from django.db.models import Count; "
        "from tenants.models import UsageRecord as U; "
        f"print(json.dumps(list(U.objects.filter(tenant__slug='{slug}').values_list("
        "'outcome', 'error_code', 'status_code').annotate(n=Count('pk')).order_by())))"
    )
    reruns = {cid: n for cid, n in line_runs(platform_server, done.id).items() if n != 1}
    assert (total, reruns) == (count, {}), breakdown
    assert rows == [["offline", done.id, "success"]]
    assert [b.id for b in client.batches.list(limit=5)] == [done.id]


def test_a_bad_file_fails_the_batch_with_line_errors_and_runs_nothing(platform_server):
    slug, key = make_tenant(platform_server)
    client = client_for(platform_server, key)
    bad = (
        chat_jsonl(2)
        + b'{"custom_id": "req-0", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'
        + b'{"custom_id": "x", "method": "POST", "url": "/v1/completions", "body": {}}\n'
        + chat_jsonl(1, prefix="other").replace(MODEL.encode(), b"no-such-model")
    )
    batch = wait_batch(client, submit(client, bad).id)
    assert batch.status == "failed"
    assert batch.failed_at is not None
    assert [(e.line, e.code) for e in batch.errors.data] == [
        (3, "duplicate_custom_id"),
        (4, "invalid_url"),
        (5, "model_not_found"),
    ]
    assert batch.request_counts.total == 0
    count = platform_server.shell(
        "from tenants.models import UsageRecord as U; "
        f"print(U.objects.filter(tenant__slug='{slug}').count())"
    )
    assert count == 0


def test_files_and_batches_are_the_tenants_own(platform_server):
    slug, key = make_tenant(platform_server)
    teammate_key = platform_server.manage_json("key", "create", slug, "--name", "teammate")["key"]
    _, outsider_key = make_tenant(platform_server)
    owner, teammate = client_for(platform_server, key), client_for(platform_server, teammate_key)
    outsider = client_for(platform_server, outsider_key)
    batch = submit(owner, chat_jsonl(2))

    assert teammate.batches.retrieve(batch.id).id == batch.id
    assert teammate.files.retrieve(batch.input_file_id).id == batch.input_file_id
    with pytest.raises(openai.NotFoundError):
        outsider.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        outsider.files.content(batch.input_file_id)
    with pytest.raises(openai.NotFoundError):
        outsider.batches.cancel(batch.id)
    assert list(outsider.batches.list()) == []
    assert list(outsider.files.list()) == []
    assert wait_batch(owner, batch.id).status == "completed"


def test_cancel_mid_run_lets_running_lines_finish_and_delivers_them(platform_server):
    _, key = make_tenant(platform_server)
    client = client_for(platform_server, key)
    count = 400
    batch = submit(client, chat_jsonl(count, max_tokens=32))
    wait_batch(client, batch.id, lambda b: completed(b) >= 5)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    done = wait_batch(client, batch.id)
    assert done.status == "cancelled"
    assert done.cancelling_at is not None
    assert done.cancelled_at is not None
    output, errors = assert_each_line_once(client, done, count)
    assert 5 <= len(output) < count
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}


def test_the_load_gate_holds_offline_lines_until_the_load_falls(platform_server):
    _, key = make_tenant(platform_server)
    client = client_for(platform_server, key)
    set_offline_threshold(platform_server, 0.0)
    try:
        batch = submit(client, chat_jsonl(20))
        wait_batch(client, batch.id, lambda b: b.status == "in_progress")
        time.sleep(5)
        held = client.batches.retrieve(batch.id)
        assert held.status == "in_progress"
        assert completed(held) == 0
        # Online work still runs meanwhile.
        answer = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert answer.choices[0].message.role == "assistant"
    finally:
        set_offline_threshold(platform_server, 0.4)
    done = wait_batch(client, batch.id)
    assert done.status == "completed"
    assert_each_line_once(client, done, 20)


def test_after_its_window_a_batch_expires_and_still_delivers_what_finished(platform_server):
    _, key = make_tenant(platform_server)
    client = client_for(platform_server, key)
    count = 400
    batch = submit(client, chat_jsonl(count, max_tokens=32))
    wait_batch(client, batch.id, lambda b: completed(b) >= 5)
    try:
        # In one step: no more offline admission (so some lines are surely left), and the
        # window runs out now (the clock is the database's expires_at).
        platform_server.shell(
            "from django.utils import timezone; from scheduler.models import Batch, Engine; "
            "from scheduler.pools.policies import sync_all_engines; "
            "Engine.objects.update(offline_load_threshold=0.0); sync_all_engines(); "
            f"print(Batch.objects.filter(public_id='{batch.id}')"
            ".update(expires_at=timezone.now()))"
        )
        done = wait_batch(client, batch.id)
    finally:
        set_offline_threshold(platform_server, 0.4)
    assert done.status == "expired"
    assert done.expired_at is not None
    output, errors = assert_each_line_once(client, done, count)
    assert len(output) >= 5
    assert errors
    assert {e["error"]["code"] for e in errors} == {"batch_expired"}


def test_a_batch_survives_its_worker_being_killed_mid_run(platform_server):
    _, key = make_tenant(platform_server)
    client = client_for(platform_server, key)
    count = 300
    restart_process(platform_server, "worker", env=SHORT_LEASE)
    try:
        batch = submit(client, chat_jsonl(count, max_tokens=48))
        wait_batch(client, batch.id, lambda b: completed(b) >= 20, timeout=240)
        log_path = platform_server.workdir / "worker.log"
        kill_process(platform_server, "worker")  # SIGKILL: leases held, results unwritten
        before_kill = log_path.stat().st_size
        killed_at = completed(client.batches.retrieve(batch.id))
        assert killed_at < count
        start_process(platform_server, "worker", env=SHORT_LEASE)
        done = wait_batch(client, batch.id, timeout=300)
    finally:
        restart_process(platform_server, "worker")
    assert done.status == "completed"
    _, errors = assert_each_line_once(client, done, count)
    assert errors == []
    with log_path.open("rb") as log:
        log.seek(before_kill)
        after = log.read().decode(errors="replace")
    assert "leases reaped" in after  # the dead worker's jobs came back through the reaper


def test_a_batch_survives_redis_losing_everything(platform_server):
    _, key = make_tenant(platform_server)
    client = client_for(platform_server, key)
    count = 300
    batch = submit(client, chat_jsonl(count, max_tokens=48))
    wait_batch(client, batch.id, lambda b: completed(b) >= 20, timeout=240)
    redis.Redis.from_url(E2E_REDIS_URL).flushdb()  # the queue, leases, policies, broker
    assert completed(client.batches.retrieve(batch.id)) < count
    done = wait_batch(client, batch.id, timeout=300)
    assert done.status == "completed"
    _, errors = assert_each_line_once(client, done, count)
    assert errors == []
    runs = line_runs(platform_server, batch.id)
    assert any(n >= 2 for n in runs.values())  # lines Redis lost were fed again


def test_a_batch_survives_a_web_restart(platform_server):
    _, key = make_tenant(platform_server)
    client = client_for(platform_server, key)
    count = 150
    batch = submit(client, chat_jsonl(count))
    wait_batch(client, batch.id, lambda b: completed(b) >= 5)
    kill_process(platform_server, "web")
    start_process(platform_server, "web")
    done = wait_batch(client, batch.id)
    assert done.status == "completed"
    assert_each_line_once(client, done, count)
