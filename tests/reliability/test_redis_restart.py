"""The platform's Redis SIGKILLed and started again (AOF on, as in production) mid-load.

Redis holds the fair queue, the leases, the job events and Celery's broker. Online requests
in flight when it dies end cleanly: a whole answer, a 503 (or another OpenAI-shaped error)
or a stream that ends with an error event and `data: [DONE]`; never a hang, never a 500.
Once Redis is back new requests succeed, nothing stays reserved, and a batch that was in
progress completes with each line answered once.

The Celery worker, web and beat run under a supervisor as they do when deployed (compose's
restart policy, Kubernetes): kombu's Redis transport can end the worker process when the
broker goes away (a race in its reconnect, "Unrecoverable error: AttributeError ... hostname"),
and a deployment restarts it. The test says whether a restart was needed; what it proves
must hold either way."""

from __future__ import annotations

import json
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai

from tests.reliability.conftest import MODEL, Stack
from tests.reliability.helpers import (
    Answer,
    Supervisor,
    chat_body,
    make_tenant,
    post,
    reserved_totals,
    scheduler_check,
    wait_until,
)

REQUESTS = 24
BATCH_LINES = 120


def batch_jsonl(count: int) -> bytes:
    lines = []
    for i in range(count):
        body = {"model": MODEL, "max_tokens": 32, "messages": [{"role": "user", "content": "hi"}]}
        line = {"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions",
                "body": body}  # fmt: skip
        lines.append(json.dumps(line))
    return ("\n".join(lines) + "\n").encode()


def unclean(answer: Answer) -> str | None:
    """Why this answer is not a clean end, or None."""
    if answer.exception is not None:
        return answer.exception  # a hang or a connection the server broke off
    if answer.status not in (200, 429, 503):
        return f"status {answer.status}"
    if answer.status != 200:
        body = answer.body
        if not (isinstance(body, dict) and isinstance(body.get("error"), dict)):
            return f"{answer.status} not OpenAI-shaped"
    elif answer.body is None and not answer.done:
        return "stream without [DONE]"
    return None


def test_online_requests_fail_cleanly_and_a_batch_completes_across_a_redis_restart(
    stack: Stack,
) -> None:
    platform = stack.platform
    _, key = make_tenant(platform, quota_units="8")
    client = openai.OpenAI(base_url=f"{platform.base_url}/v1", api_key=key, max_retries=0)
    uploaded = client.files.create(file=("in.jsonl", batch_jsonl(BATCH_LINES)), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    bodies = [chat_body(400, stream=i % 2 == 0) for i in range(REQUESTS)]
    with Supervisor(platform, ["worker", "agent", "web", "beat"]) as supervisor:
        check_across_the_restart(stack, client, key, batch.id, bodies)
    print(f"restarted by the supervisor: {supervisor.restarts or 'nothing'}")


def check_across_the_restart(
    stack: Stack, client: openai.OpenAI, key: str, batch_id: str, bodies: list[dict[str, Any]]
) -> None:
    platform, server, queue = stack.platform, stack.redis, stack.fair_queue()
    with httpx.Client(base_url=platform.base_url) as http, ThreadPoolExecutor(REQUESTS) as pool:
        futures = [pool.submit(post, http, key, body) for body in bodies]
        wait_until(lambda: sum(queue.snapshot().engine_inflight.values()) >= 8, 60, "jobs running")
        server.kill()
        time.sleep(3)
        server.start()
        restarted_at = time.monotonic()
        answers = [f.result() for f in futures]
    in_flight = Counter(unclean(a) or f"clean {a.status}" for a in answers)
    print(f"\nin flight across the restart: {dict(in_flight)}")

    # New work: how long until the platform answers 200 again, and what came before.
    after: list[Answer] = []
    with httpx.Client(base_url=platform.base_url) as http:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            after.append(post(http, key, chat_body(16, stream=len(after) % 2 == 1)))
            if [a.status for a in after[-6:]] == [200] * 6:
                break
    recovered_s = time.monotonic() - restarted_at
    print(f"after the restart: {dict(Counter(unclean(a) or 'clean' for a in after))}, "
          f"6 in a row answered 200 {recovered_s:.1f} s after Redis was back")  # fmt: skip

    done = wait_until(
        lambda: (b := client.batches.retrieve(batch_id)).status
        in ("completed", "failed", "expired", "cancelled") and b,
        300, "the batch finished",
    )  # fmt: skip
    output = client.files.content(done.output_file_id).content.splitlines()
    errors = (
        client.files.content(done.error_file_id).content.splitlines() if done.error_file_id else []
    )
    seen = Counter(json.loads(line)["custom_id"] for line in output + errors if line.strip())
    print(f"batch: {done.status}, {len(output)} lines answered, {len(errors)} errors")
    assert done.status == "completed", done
    assert set(seen) == {f"req-{i}" for i in range(BATCH_LINES)}
    assert max(seen.values()) == 1

    wait_until(lambda: reserved_totals(queue) == (0, 0), 30, "reservations back to zero")
    report = scheduler_check(platform)
    assert "no drift" in report, report
    print("after the restart: nothing reserved, no drift")

    assert [unclean(a) for a in answers if unclean(a)] == []
    assert [unclean(a) for a in after if unclean(a)] == []
    assert [a.status for a in after[-6:]] == [200] * 6
