"""The Batch API with PostgreSQL and Redis: create, validate, feed a window at a time into
the fair queue, collect results written through the worker's hook, finalize; cancel, expiry,
budget; a lost Redis and a job run twice neither lose nor duplicate a line.

The engine is registered as ready but not running (prompts are counted by the byte bound);
a stand-in worker picks jobs from the real fair queue and ends them as the dispatch loop does
(`finish`: the release with the run's last words, then `settle`)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.utils import timezone

from fairqueue.domain import Job
from fairqueue.queue import FairQueue
from scheduler.batches.feeder import batch_line_finished, batch_process, batches_tick_if_changed
from scheduler.batches.objects import batch_object
from scheduler.batches.selectors import batch_get
from scheduler.models import Batch, BatchLine, BatchStatus, Device, Engine, EngineStatus, LineState
from scheduler.pools.policies import fair_queue
from tenants.models import UsageRecord
from tests.conftest import bearer_client
from workers.dispatch import last_words, settle
from workers.runner import RunResult

MODEL = "tiny-llama"
MODEL_CONFIG = {
    "model_type": "llama",
    "hidden_size": 128,
    "num_attention_heads": 2,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "dtype": "bfloat16",
    "max_position_embeddings": 4096,
    "vocab_size": 512,
}


@pytest.fixture
def files_dir(settings, tmp_path):
    settings.GPUSHARE_BATCH_FILES_DIR = tmp_path / "files"
    return settings.GPUSHARE_BATCH_FILES_DIR


@pytest.fixture
def engine(db, tmp_path) -> Engine:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(MODEL_CONFIG))
    device = Device.objects.create(
        node="n1", kind="cpu", index=0, name="cpu", memory_bytes=2**33, capacity_units=32
    )
    # Port 1 refuses connections at once: the feeder falls back to the byte bound.
    return Engine.objects.create(
        name=MODEL,
        model_path=str(model_dir),
        served_model_name=MODEL,
        device=device,
        footprint_units=4,
        port=1,
        status=EngineStatus.READY,
        kv_capacity_tokens=200_000,
        max_model_len=4096,
        max_num_seqs=16,
    )


@pytest.fixture
def queue(redis_db, engine) -> FairQueue:
    return fair_queue()


def chat_jsonl(
    count: int, *, start: int = 0, max_tokens: int = 8, user: str | None = None
) -> bytes:
    lines = []
    for i in range(start, start + count):
        body = {
            "model": MODEL,
            "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": f"question {i}"}],
        }
        if user is not None:
            body["user"] = f"{user}-{i}"
        lines.append(
            json.dumps(
                {
                    "custom_id": f"req-{i}",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": body,
                }
            )
        )
    return ("\n".join(lines) + "\n").encode()


def answer_for(request: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{request['custom_id']}",
        "object": "chat.completion",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }


def finish(queue: FairQueue, job: Job, result: RunResult) -> None:
    """Ends a job that ran as the dispatch loop does: released with its answer and ledger
    row, then settled (for a batch line: its answer written to the line)."""
    request = json.loads(job.payload)
    words = last_words(job, request, result)
    used = (result.prompt_tokens, result.completion_tokens)
    queue.release(job.pool, job.job_id, *used, attempt=job.attempt, last_words=words)
    settle(job, request, result)


def run_picked_jobs(queue: FairQueue, *, limit: int = 10_000, engine_id: str = MODEL) -> list[str]:
    """A worker: picks and answers jobs through the real hook; returns their custom ids."""
    ran: list[str] = []
    while len(ran) < limit and (job := queue.pick(MODEL, engine_id)) is not None:
        request = json.loads(job.payload)
        result = RunResult(
            outcome="success",
            prompt_tokens=5,
            completion_tokens=1,
            response_body=answer_for(request),
            finished_at=job.enqueued_at,
        )
        finish(queue, job, result)
        ran.append(request["custom_id"])
    return ran


# --- helpers ---------------------------------------------------------------------------

pytestmark = pytest.mark.django_db


def start_batch(client, content: bytes, **fields: Any) -> dict[str, Any]:
    from django.core.files.uploadedfile import SimpleUploadedFile

    uploaded = client.post(
        "/v1/files",
        {"file": SimpleUploadedFile("in.jsonl", content), "purpose": "batch"},
        format="multipart",
    )
    assert uploaded.status_code == 200, uploaded.content
    body = {
        "input_file_id": uploaded.json()["id"],
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
        **fields,
    }
    response = client.post("/v1/batches", body, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def process(batch_id: str) -> Batch:
    batch = Batch.objects.get(public_id=batch_id)
    batch_process(batch_pk=batch.pk)
    return Batch.objects.get(pk=batch.pk)


def lines_by_state(batch_id: str) -> dict[str, int]:
    rows = BatchLine.objects.filter(batch__public_id=batch_id).values_list("state", flat=True)
    counts: dict[str, int] = {}
    for state in rows:
        counts[state] = counts.get(state, 0) + 1
    return counts


def waiting_jobs(queue: FairQueue) -> int:
    return queue.redis.zcard(queue.keys.waiting(MODEL))


def run_to_the_end(client, batch_id: str, queue: FairQueue, rounds: int = 50) -> dict[str, Any]:
    for _ in range(rounds):
        process(batch_id)
        run_picked_jobs(queue)
        body = client.get(f"/v1/batches/{batch_id}").json()
        if body["status"] in ("completed", "failed", "expired", "cancelled"):
            return body
    raise AssertionError(f"batch {batch_id} did not finish: {body}")


def file_lines(client, file_id: str) -> list[dict[str, Any]]:
    content = client.get(f"/v1/files/{file_id}/content").getvalue()
    return [json.loads(line) for line in content.splitlines()]


# --- the tests ------------------------------------------------------------------------------


def test_a_batch_runs_a_window_at_a_time_and_delivers_each_line_once(
    files_dir, queue, owner_key, settings
):
    settings.GPUSHARE_BATCH_WINDOW = 4
    client = bearer_client(owner_key)
    created = start_batch(client, chat_jsonl(10), metadata={"run": "nightly"})
    assert created["object"] == "batch"
    assert created["status"] == "validating"
    assert created["metadata"] == {"run": "nightly"}
    assert created["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
    assert created["expires_at"] - created["created_at"] == 24 * 3600

    batch = process(created["id"])
    assert batch.status == BatchStatus.IN_PROGRESS
    assert lines_by_state(created["id"]) == {"queued": 4, "pending": 6}
    assert waiting_jobs(queue) == 4  # the window, never the whole file

    assert len(run_picked_jobs(queue, limit=3)) == 3
    process(created["id"])
    assert waiting_jobs(queue) == 4
    progress = client.get(f"/v1/batches/{created['id']}").json()
    assert progress["status"] == "in_progress"
    assert progress["request_counts"] == {"total": 10, "completed": 3, "failed": 0}
    assert progress["in_progress_at"] is not None

    done = run_to_the_end(client, created["id"], queue)
    assert done["status"] == "completed"
    assert done["request_counts"] == {"total": 10, "completed": 10, "failed": 0}
    assert done["error_file_id"] is None
    assert done["completed_at"] >= done["finalizing_at"] >= done["in_progress_at"]
    output = file_lines(client, done["output_file_id"])
    assert [line["custom_id"] for line in output] == [f"req-{i}" for i in range(10)]
    first = output[0]
    assert first["error"] is None
    assert first["response"]["status_code"] == 200
    assert first["response"]["request_id"]
    assert first["response"]["body"]["id"] == "chatcmpl-req-0"
    described = client.get(f"/v1/files/{done['output_file_id']}").json()
    assert described["purpose"] == "batch_output"


def test_offline_jobs_carry_the_batch_and_line_and_are_offline_class(files_dir, queue, owner_key):
    created = start_batch(bearer_client(owner_key), chat_jsonl(2, max_tokens=5))
    process(created["id"])
    job = queue.pick(MODEL, MODEL)
    assert job is not None
    assert job.request_class == "offline"
    assert job.max_tokens == 5
    payload = json.loads(job.payload)
    assert payload["batch_id"] == created["id"]
    assert payload["custom_id"] == "req-0"
    assert payload["line"] == 1
    assert payload["stream"] is False


def test_each_line_s_ledger_row_names_the_end_user_its_body_named(files_dir, queue, owner_key):
    from tenants.usage_buffer import usage_flush

    created = start_batch(bearer_client(owner_key), chat_jsonl(2, user="u"))
    process(created["id"])
    run_picked_jobs(queue)
    assert usage_flush() == 2
    rows = UsageRecord.objects.filter(batch_id=created["id"])
    assert sorted(rows.values_list("end_user", flat=True)) == ["u-0", "u-1"]


def test_a_job_run_twice_keeps_the_first_result_only(files_dir, queue, owner_key):
    created = start_batch(bearer_client(owner_key), chat_jsonl(1))
    process(created["id"])
    job = queue.pick(MODEL, MODEL)
    request = json.loads(job.payload)
    first = RunResult(outcome="success", response_body={"id": "first"}, finished_at=1.0)
    second = RunResult(outcome="success", response_body={"id": "second"}, finished_at=2.0)
    finish(queue, job, first)
    finish(queue, job, second)
    assert not batch_line_finished(
        pool=MODEL,
        job_id="other",
        request=request,
        response_body={"id": "third"},
        error_body=None,
        status_code=200,
    )
    [line] = BatchLine.objects.filter(batch__public_id=created["id"])
    assert line.state == LineState.SUCCEEDED
    assert line.response == {"status_code": 200, "request_id": job.job_id, "body": {"id": "first"}}


def test_lines_that_redis_lost_are_fed_again_and_finish_once(files_dir, queue, owner_key, settings):
    settings.GPUSHARE_BATCH_WINDOW = 5
    client = bearer_client(owner_key)
    created = start_batch(client, chat_jsonl(8))
    process(created["id"])
    run_picked_jobs(queue, limit=2)
    lines = BatchLine.objects.filter(batch__public_id=created["id"])
    in_redis_only = set(lines.filter(state=LineState.QUEUED).values_list("custom_id", flat=True))
    assert in_redis_only
    queue.redis.flushdb()  # the queue, the engines' and tenants' policies: all gone

    process(created["id"])
    assert waiting_jobs(queue) == 5
    assert set(lines.filter(runs=2).values_list("custom_id", flat=True)) == in_redis_only

    done = run_to_the_end(client, created["id"], queue)
    assert done["request_counts"] == {"total": 8, "completed": 8, "failed": 0}
    ids = [line["custom_id"] for line in file_lines(client, done["output_file_id"])]
    assert sorted(ids) == sorted(f"req-{i}" for i in range(8))


def test_a_tenant_policy_lost_in_the_middle_of_a_feed_is_restored_not_failed(
    files_dir, queue, owner_key, monkeypatch
):
    """Redis lost everything after the feed synced the tenant (seen in CI): the lines still
    queue, none ends as an error."""
    client = bearer_client(owner_key)
    created = start_batch(client, chat_jsonl(6))
    enqueue = queue.enqueue
    jobs: list[str] = []

    def enqueue_after_a_loss(**fields: Any):
        if fields["job_id"] not in jobs:  # a job's first try, not the retry after a resync
            jobs.append(fields["job_id"])
            if len(jobs) == 3:
                queue.redis.flushdb()
        return enqueue(**fields)

    monkeypatch.setattr(queue, "enqueue", enqueue_after_a_loss)
    process(created["id"])
    assert lines_by_state(created["id"]) == {LineState.QUEUED: 6}
    assert waiting_jobs(queue) == 4  # the two queued before the loss went with it

    done = run_to_the_end(client, created["id"], queue)
    assert done["request_counts"] == {"total": 6, "completed": 6, "failed": 0}


def test_a_job_that_ended_without_its_result_is_fed_again_after_the_grace(
    files_dir, queue, owner_key, settings
):
    settings.GPUSHARE_BATCH_LOST_GRACE_S = 3600
    created = start_batch(bearer_client(owner_key), chat_jsonl(1))
    process(created["id"])
    job = queue.pick(MODEL, MODEL)
    queue.release(job.pool, job.job_id, 1, 1, attempt=job.attempt)  # the worker died before writing

    process(created["id"])
    line = BatchLine.objects.get(batch__public_id=created["id"])
    assert (line.state, line.runs, line.job_id) == (LineState.QUEUED, 1, job.job_id)
    assert line.lost_seen_at is not None

    settings.GPUSHARE_BATCH_LOST_GRACE_S = 0
    process(created["id"])
    line.refresh_from_db()
    assert line.state == LineState.QUEUED
    assert line.runs == 2
    assert line.job_id != job.job_id


def test_an_answer_the_database_missed_is_taken_from_the_job_s_events_not_run_again(
    files_dir, queue, owner_key, settings
):
    """The worker ran the line and told its events, then could not write the line (its
    database connection failed): the feeder writes the answer after the grace period."""
    settings.GPUSHARE_BATCH_LOST_GRACE_S = 0
    created = start_batch(bearer_client(owner_key), chat_jsonl(1))
    process(created["id"])
    job = queue.pick(MODEL, MODEL)
    answer = answer_for(json.loads(job.payload))
    queue.publish(job.pool, job.job_id, {"event": "done", "body": answer, "attempt": job.attempt})
    queue.release(job.pool, job.job_id, 5, 1, attempt=job.attempt)

    process(created["id"])  # sees the job ended and starts the grace period
    process(created["id"])
    line = BatchLine.objects.get(batch__public_id=created["id"])
    assert (line.state, line.runs) == (LineState.SUCCEEDED, 1)
    assert line.response == {"status_code": 200, "request_id": job.job_id, "body": answer}
    assert waiting_jobs(queue) == 0


def test_a_run_that_ends_before_the_feed_that_queued_it_commits_is_not_run_again(
    files_dir, queue, owner_key, settings
):
    """A fast run can end while the feed that queued its line has yet to commit (the line's
    row is not seen yet): its answer stays in the job's events, and the feeder writes it from
    there after the grace period instead of feeding the line again (and billing it twice)."""
    settings.GPUSHARE_BATCH_LOST_GRACE_S = 0
    created = start_batch(bearer_client(owner_key), chat_jsonl(1))
    process(created["id"])
    job = queue.pick(MODEL, MODEL)
    request = json.loads(job.payload)
    lines = BatchLine.objects.filter(batch__public_id=created["id"])
    lines.update(custom_id="not-committed-yet")  # the run's update finds no such line
    answer = answer_for(request)
    queue.publish(job.pool, job.job_id, {"event": "done", "body": answer, "attempt": job.attempt})
    finish(queue, job, RunResult(outcome="success", response_body=answer))
    lines.update(custom_id=request["custom_id"])  # the feed commits

    process(created["id"])  # sees the job ended and starts the grace period
    process(created["id"])
    line = BatchLine.objects.get(batch__public_id=created["id"])
    assert (line.state, line.runs) == (LineState.SUCCEEDED, 1)
    assert line.response["request_id"] == job.job_id
    assert waiting_jobs(queue) == 0


def test_an_answer_with_a_nul_character_is_stored_and_delivered_as_the_model_wrote_it(
    files_dir, queue, owner_key
):
    """PostgreSQL's jsonb refuses U+0000, which models do write (seen in CI: the line's
    answer was lost and the line ran again)."""
    client = bearer_client(owner_key)
    created = start_batch(client, chat_jsonl(1))
    process(created["id"])
    job = queue.pick(MODEL, MODEL)
    answer = answer_for(json.loads(job.payload))
    answer["choices"][0]["message"]["content"] = "before\x00after"
    finish(queue, job, RunResult(outcome="success", response_body=answer, finished_at=1.0))

    line = BatchLine.objects.get(batch__public_id=created["id"])
    assert (line.state, line.runs) == (LineState.SUCCEEDED, 1)
    done = run_to_the_end(client, created["id"], queue)
    [record] = file_lines(client, done["output_file_id"])
    assert record["response"]["body"]["choices"][0]["message"]["content"] == "before\x00after"


def test_a_feed_rolled_back_after_it_queued_lines_queues_them_once_on_the_next_feed(
    files_dir, queue, owner_key, monkeypatch
):
    """The database forgot a feed (its transaction failed half-way, e.g. a Redis timeout)
    while Redis kept the jobs it had queued: the next feed finds them, nothing runs twice."""
    client = bearer_client(owner_key)
    created = start_batch(client, chat_jsonl(6))
    process(created["id"])  # validated; its first window is fed: undo that feed's effects
    queue.redis.flushdb()
    BatchLine.objects.filter(batch__public_id=created["id"]).update(
        state=LineState.PENDING, job_id="", runs=0
    )
    enqueue = queue.enqueue
    fed: list[str] = []

    def enqueue_then_fail(**fields: Any):
        job = enqueue(**fields)
        fed.append(fields["job_id"])
        if len(fed) == 3:
            raise ConnectionError("Redis went away")
        return job

    monkeypatch.setattr(queue, "enqueue", enqueue_then_fail)
    with pytest.raises(ConnectionError):
        process(created["id"])
    assert lines_by_state(created["id"]) == {LineState.PENDING: 6}
    assert waiting_jobs(queue) == 3

    monkeypatch.setattr(queue, "enqueue", enqueue)
    process(created["id"])
    assert lines_by_state(created["id"]) == {LineState.QUEUED: 6}
    assert waiting_jobs(queue) == 6
    done = run_to_the_end(client, created["id"], queue)
    assert done["request_counts"] == {"total": 6, "completed": 6, "failed": 0}
    assert set(BatchLine.objects.values_list("runs", flat=True)) == {1}


def test_cancel_stops_admitting_lets_running_lines_finish_and_delivers_them(
    files_dir, queue, owner_key, settings
):
    settings.GPUSHARE_BATCH_WINDOW = 4
    client = bearer_client(owner_key)
    created = start_batch(client, chat_jsonl(10))
    process(created["id"])
    run_picked_jobs(queue, limit=1)
    running = queue.pick(MODEL, MODEL)

    cancelling = client.post(f"/v1/batches/{created['id']}/cancel").json()
    assert cancelling["status"] == "cancelling"
    assert cancelling["cancelling_at"] is not None
    assert waiting_jobs(queue) == 0  # the waiting ones were taken out of the queue
    assert process(created["id"]).status == BatchStatus.CANCELLING  # one still runs

    request = json.loads(running.payload)
    finish(
        queue,
        running,
        RunResult(outcome="success", response_body=answer_for(request), finished_at=1.0),
    )
    process(created["id"])
    done = client.get(f"/v1/batches/{created['id']}").json()
    assert done["status"] == "cancelled"
    assert done["cancelled_at"] is not None
    assert done["request_counts"] == {"total": 10, "completed": 2, "failed": 8}
    assert len(file_lines(client, done["output_file_id"])) == 2
    errors = file_lines(client, done["error_file_id"])
    assert len(errors) == 8
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    assert all(e["response"] is None for e in errors)
    assert client.post(f"/v1/batches/{created['id']}/cancel").status_code == 200
    assert run_picked_jobs(queue) == []


def test_after_its_window_a_batch_expires_and_still_delivers_finished_lines(
    files_dir, queue, owner_key, settings
):
    settings.GPUSHARE_BATCH_WINDOW = 3
    settings.GPUSHARE_BATCH_COMPLETION_WINDOW_S = 60
    client = bearer_client(owner_key)
    created = start_batch(client, chat_jsonl(6))
    assert created["expires_at"] - created["created_at"] == 60
    process(created["id"])
    run_picked_jobs(queue, limit=2)
    Batch.objects.filter(public_id=created["id"]).update(expires_at=timezone.now())

    done = run_to_the_end(client, created["id"], queue)
    assert done["status"] == "expired"
    assert done["expired_at"] is not None
    assert done["request_counts"] == {"total": 6, "completed": 2, "failed": 4}
    assert len(file_lines(client, done["output_file_id"])) == 2
    codes = {e["error"]["code"] for e in file_lines(client, done["error_file_id"])}
    assert codes == {"batch_expired"}


def test_a_bad_file_fails_the_batch_with_line_errors_and_nothing_runs(files_dir, queue, owner_key):
    content = chat_jsonl(2) + b'{"custom_id": "req-0"}\nnot json\n'
    created = start_batch(bearer_client(owner_key), content)
    batch = process(created["id"])
    assert batch.status == BatchStatus.FAILED
    body = batch_object(batch_get(tenant=batch.tenant, batch_id=batch.public_id))
    assert body["failed_at"] is not None
    assert body["errors"]["object"] == "list"
    assert [(e["line"], e["code"]) for e in body["errors"]["data"]] == [
        (3, "duplicate_custom_id"),
        (4, "invalid_json_line"),
    ]
    assert all(e["message"] for e in body["errors"]["data"])
    assert body["request_counts"]["total"] == 0
    assert waiting_jobs(queue) == 0


def test_an_embeddings_batch_runs_on_embed_engines_only(files_dir, queue, owner_key, engine):
    line = {"custom_id": "e-0", "method": "POST", "url": "/v1/embeddings",
            "body": {"model": MODEL, "input": ["one", "two"]}}  # fmt: skip
    content = (json.dumps(line) + "\n").encode()
    client = bearer_client(owner_key)
    refused = process(start_batch(client, content, endpoint="/v1/embeddings")["id"])
    assert refused.status == BatchStatus.FAILED
    assert refused.errors is not None
    assert [e["code"] for e in refused.errors["data"]] == ["model_not_supported"]
    Engine.objects.filter(pk=engine.pk).update(task="embed")
    accepted = start_batch(client, content, endpoint="/v1/embeddings")
    process(accepted["id"])
    (job_id,) = queue.redis.zrange(queue.keys.waiting(MODEL), 0, -1)
    job = queue.get_job(MODEL, job_id)
    assert job is not None
    assert (job.seqs, job.max_tokens) == (2, 0)
    payload = json.loads(job.payload)
    assert payload["endpoint"] == "embeddings"
    assert "max_tokens" not in payload["body"]


def test_a_tenant_over_its_token_budget_cannot_start_a_batch(files_dir, queue, owner, owner_key):
    owner.token_budget = 10
    owner.save()
    UsageRecord.objects.create(
        request_id="r1",
        tenant=owner,
        model=MODEL,
        outcome="success",
        request_class="standard",
        prompt_tokens=20,
        finished_at=timezone.now(),
    )
    with pytest.raises(AssertionError, match="429"):
        start_batch(bearer_client(owner_key), chat_jsonl(1))


def test_a_batch_that_runs_out_of_budget_fails_clearly_and_delivers_what_ran(
    files_dir, queue, owner, owner_key, settings
):
    # A line is admitted on its estimate (~98 tokens: prompt bound + margin + max_tokens)
    # and settled to what it used (6): a few lines run one by one, then the budget is used up.
    settings.GPUSHARE_BATCH_WINDOW = 1
    owner.token_budget = 110
    owner.save()
    client = bearer_client(owner_key)
    created = start_batch(client, chat_jsonl(5))
    process(created["id"])
    done = run_to_the_end(client, created["id"], queue)
    assert done["status"] == "failed"
    assert done["errors"]["data"][0]["code"] == "token_budget_exceeded"
    assert 1 <= done["request_counts"]["completed"] < 5
    codes = {e["error"]["code"] for e in file_lines(client, done["error_file_id"])}
    assert codes == {"token_budget_exceeded"}


def test_a_batch_of_a_tenant_stopped_by_its_money_budget_fails_before_a_line_runs(
    files_dir, queue, owner, owner_key
):
    from billing.alerts import budgets_check
    from billing.services import budget_set, price_set
    from billing.stops import clear_cache

    client = bearer_client(owner_key)
    created = start_batch(client, chat_jsonl(3))  # accepted while under its budget
    price_set(model=MODEL, input_per_million="1000")
    budget_set(tenant=owner, amount="0.01", hard_stop=True)
    UsageRecord.objects.create(
        request_id="r-money", tenant=owner, model=MODEL, outcome="success",
        request_class="standard", prompt_tokens=20, finished_at=timezone.now(),
    )  # fmt: skip
    budgets_check()  # 0.02 of 0.01
    clear_cache()
    process(created["id"])  # validated
    process(created["id"])  # fed: stopped at its first line, nothing queued
    assert queue.redis.zrange(queue.keys.waiting(MODEL), 0, -1) == []
    done = client.get(f"/v1/batches/{created['id']}").json()
    assert done["status"] == "failed"
    assert done["request_counts"]["completed"] == 0
    assert done["errors"]["data"][0]["code"] == "token_budget_exceeded"


def test_batches_are_shared_with_teammates_hidden_from_outsiders_and_paginated(
    files_dir, queue, owner_key, teammate_key, outsider_key
):
    owner, teammate, outsider = map(bearer_client, (owner_key, teammate_key, outsider_key))
    ids = [start_batch(owner, chat_jsonl(1))["id"] for _ in range(3)]

    assert teammate.get(f"/v1/batches/{ids[0]}").json()["id"] == ids[0]
    page = teammate.get("/v1/batches", {"limit": 2}).json()
    assert page["object"] == "list"
    assert [b["id"] for b in page["data"]] == [ids[2], ids[1]]
    assert (page["has_more"], page["first_id"], page["last_id"]) == (True, ids[2], ids[1])
    rest = teammate.get("/v1/batches", {"limit": 2, "after": page["last_id"]}).json()
    assert ([b["id"] for b in rest["data"]], rest["has_more"]) == ([ids[0]], False)

    assert outsider.get(f"/v1/batches/{ids[0]}").status_code == 404
    assert outsider.post(f"/v1/batches/{ids[0]}/cancel").status_code == 404
    assert outsider.get("/v1/batches").json()["data"] == []
    input_file = owner.get(f"/v1/batches/{ids[0]}").json()["input_file_id"]
    response = outsider.post(
        "/v1/batches",
        {
            "input_file_id": input_file,
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        },
        format="json",
    )
    assert response.status_code == 404


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"endpoint": "/v1/moderations"}, "endpoint"),
        ({"completion_window": "1h"}, "completion_window"),
        ({"metadata": {"n": 1}}, "metadata"),
        ({"input_file_id": None}, "input_file_id"),
    ],
)
def test_a_bad_batch_request_is_a_400_naming_the_field(files_dir, queue, owner_key, fields, param):
    client = bearer_client(owner_key)
    from django.core.files.uploadedfile import SimpleUploadedFile

    upload = SimpleUploadedFile("in.jsonl", chat_jsonl(1))
    file_id = client.post(
        "/v1/files", {"file": upload, "purpose": "batch"}, format="multipart"
    ).json()["id"]
    body = {
        "input_file_id": file_id,
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
        **fields,
    }
    response = client.post("/v1/batches", body, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param


def test_operators_see_each_batch_with_its_progress_in_the_admin(
    files_dir, queue, owner_key, staff_user, client, settings
):
    settings.GPUSHARE_BATCH_WINDOW = 2
    created = start_batch(bearer_client(owner_key), chat_jsonl(4))
    process(created["id"])
    run_picked_jobs(queue, limit=1)
    client.force_login(staff_user)
    staff_user.is_superuser = True
    staff_user.save()
    page = client.get("/admin/scheduler/batch/")
    assert page.status_code == 200
    text = page.content.decode()
    assert created["id"] in text
    assert "25%" in text
    assert "1/0/4" in text
    assert client.get("/admin/scheduler/storedfile/").status_code == 200


def test_the_feeder_looks_for_batches_only_after_one_was_saved(
    files_dir, queue, owner_key, django_capture_on_commit_callbacks
):
    assert batches_tick_if_changed() == 0  # never looked: it looks
    assert batches_tick_if_changed() is None  # none was active, none saved since

    with django_capture_on_commit_callbacks(execute=True):
        created = start_batch(bearer_client(owner_key), chat_jsonl(3))
    assert batches_tick_if_changed() == 1
    assert Batch.objects.get(public_id=created["id"]).status == BatchStatus.IN_PROGRESS
    assert batches_tick_if_changed() == 1  # active: fed at every tick, saved or not


def test_a_tenant_may_have_only_so_many_active_batches(files_dir, queue, owner_key, settings):
    settings.GPUSHARE_TENANT_MAX_ACTIVE_BATCHES = 2
    client = bearer_client(owner_key)
    first, _ = start_batch(client, chat_jsonl(1)), start_batch(client, chat_jsonl(1))
    with pytest.raises(AssertionError, match="too_many_active_batches"):
        start_batch(client, chat_jsonl(1))
    assert client.post(f"/v1/batches/{first['id']}/cancel").status_code == 200
    process(first["id"])  # cancelled: no longer active
    assert start_batch(client, chat_jsonl(1))["status"] == "validating"
