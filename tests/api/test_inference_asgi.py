"""The inference endpoints as the web serves them (config.asgi): in front of Django, they
answer bad requests in OpenAI's error shape without reaching the queue, and every other
path still goes to Django."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from scheduler.online import admission as online
from tests.asgi import asgi_request

CHAT = "/v1/chat/completions"


def error_of(response) -> dict:
    assert response.headers["content-type"] == "application/json"
    error: dict = response.json()["error"]
    assert set(error) == {"message", "type", "code", "param"}
    return error


@pytest.fixture
def auth(transactional_db) -> dict[str, str]:
    """A live tenant key's header (the key is looked up in a thread: its row is committed)."""
    from tenants.services import api_key_create
    from tests.factories import TenantFactory

    key = api_key_create(tenant=TenantFactory.create(slug="acme"), name="k").raw_key
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize("path", [CHAT, "/v1/completions"])
def test_only_post_is_allowed(path, auth):
    response = asgi_request("GET", path, headers=auth)
    assert response.status_code == 405
    assert error_of(response)["code"] == "method_not_allowed"


def test_a_body_over_the_limit_is_refused_before_it_is_read_whole(settings, auth):
    settings.GPUSHARE_MAX_BODY_BYTES = 1000
    declared = asgi_request("POST", CHAT, content=b"x" * 1001, headers=auth)
    assert declared.status_code == 413
    assert error_of(declared)["code"] == "request_too_large"

    async def chunks():  # no Content-Length: counted as it arrives
        for _ in range(5):
            yield b"y" * 300

    streamed = asgi_request("POST", CHAT, content=chunks(), headers=auth)
    assert streamed.status_code == 413


@pytest.mark.parametrize("path", [CHAT, "/v1/completions", "/v1/files", "/v1/batches"])
@pytest.mark.parametrize("authorization", [None, "Bearer gs-nobody", "Basic eDp5"])
def test_no_body_is_read_before_the_key_is_known(transactional_db, path, authorization):
    pulled: list[int] = []

    async def chunks():  # 64 MiB an anonymous client would push before its 401
        for _ in range(64):
            pulled.append(1)
            yield b"z" * (1 << 20)

    headers = {"Authorization": authorization} if authorization else {}
    response = asgi_request("POST", path, content=chunks(), headers=headers)
    assert response.status_code == 401
    assert error_of(response)["type"] == "authentication_error"
    assert len(pulled) <= 1  # at most what the client library sent before any answer


@pytest.mark.parametrize(
    ("body", "param"),
    [(b"{not json", None), (b'{"model": "m"}', "messages"), (b"\xff\xfe", None),
     (b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "user": 7}', "user")],
)  # fmt: skip
def test_malformed_requests_are_400_with_the_field_named(body, param, auth):
    response = asgi_request("POST", CHAT, content=body, headers=auth)
    assert response.status_code == 400
    assert error_of(response)["param"] == param


def test_a_request_without_a_key_is_401():
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    response = asgi_request("POST", CHAT, json=body)
    assert response.status_code == 401
    assert error_of(response)["type"] == "authentication_error"
    assert response.headers["x-content-type-options"] == "nosniff"


def test_other_paths_are_served_by_django(auth):
    assert asgi_request("GET", "/healthz").status_code == 200
    assert asgi_request("GET", "/v1/models", headers=auth).status_code == 200
    assert asgi_request("GET", "/v1/chat/completions/", headers=auth).status_code == 404


def test_the_web_s_redis_connections_are_as_many_as_the_setting_says(settings):
    settings.GPUSHARE_WEB_REDIS_CONNECTIONS = 1234

    async def pool_size() -> int:
        return online._loop_state().redis.max_connections

    assert asyncio.run(pool_size()) == 1234


def test_a_client_that_leaves_while_sending_its_body_gets_nothing_and_queues_nothing(auth):
    from config.asgi import application

    messages: list[dict] = [
        {"type": "http.request", "body": b'{"model": "m", "mess', "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent: list[dict] = []

    async def receive() -> dict:
        return messages.pop(0)

    async def send(message: dict) -> None:
        sent.append(message)

    key = auth["Authorization"].encode()
    scope = {"type": "http", "method": "POST", "path": CHAT, "headers": [(b"authorization", key)]}
    asyncio.run(application(scope, receive, send))
    assert sent == []


TEST_INBOX = "tests"


@pytest.fixture(autouse=True)
def fixed_inbox(monkeypatch):
    """The web's inbox has a name the tests know, so they can publish to it before the loop
    that reads it runs."""
    monkeypatch.setattr(online, "inbox_name", lambda: TEST_INBOX)


def waiting_request(job_id: str) -> online.Admitted:
    """An admitted chat request whose job has the id `job_id` (the tests publish its events,
    which go to the web's inbox as the job's record says)."""
    from fairqueue.domain import Job
    from protocol.inference import parse_inference_request
    from scheduler.pools.policies import fair_queue

    queue = fair_queue()
    queue.redis.hset(queue.keys.job("p", job_id), "inbox", queue.keys.inbox("p", TEST_INBOX))

    job = Job(job_id=job_id, tenant="t", pool="p", request_class="standard", prompt_tokens=1,
              max_tokens=1, kv_bytes=1, deadline=9e9)  # fmt: skip
    request = parse_inference_request(
        "chat", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "user": "u1"}
    )
    return online.Admitted(job, request, tenant_id=1, api_key_id=1, received_at=0.0)


def test_a_waiter_whose_client_left_stops_at_its_next_event_even_if_not_cancelled(redis_db):
    """The relay must not depend on task cancellation alone: redis-py's asyncio client can
    swallow a cancellation that lands in a blocking read, and the relay then streamed to the
    end for nobody (the job was never cancelled)."""
    from scheduler.pools.policies import fair_queue

    admitted = waiting_request("j1")
    queue = fair_queue()
    for _ in range(3):
        queue.publish("p", "j1", {"event": "chunk", "attempt": 1, "data": {}})

    seen: list[str] = []

    async def relay() -> None:
        client_gone = asyncio.Event()
        async for event in online.follow(admitted, client_gone):
            seen.append(event["event"])
            client_gone.set()  # the client leaves after the first event

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(relay())
    assert seen == ["chunk"]  # the rest is not relayed for nobody


def test_a_client_read_timeout_while_waiting_for_events_is_no_news_not_an_error(redis_db, settings):
    """redis-py 8's read timeout (5 s by default) fired on a machine stalled by a starting CPU
    engine, and the request ended with 503. Here the web's client times out after 0.1 s, well
    inside its 1 s wait, and the answer comes after several such timeouts."""
    import threading

    from scheduler.pools.policies import fair_queue

    settings.REDIS_URL = f"{settings.REDIS_URL}?socket_timeout=0.1"
    admitted = waiting_request("j2")
    queue = fair_queue()
    queue.publish("p", "j2", {"event": "chunk", "attempt": 1, "data": {}})
    later = threading.Timer(0.5, queue.publish, ("p", "j2", {"event": "done", "attempt": 1}))

    async def relay() -> list[str]:
        later.start()
        return [event["event"] async for event in online.follow(admitted)]

    try:
        assert asyncio.run(relay()) == ["chunk", "done"]
    finally:
        later.cancel()


def test_an_event_that_arrives_while_the_web_is_stalled_past_5_s_is_not_lost(redis_db):
    """redis-py 8 times a read out after 5 s by default; a BLPOP reply that arrives while the
    process is stalled that long was lost (Redis had popped it, the client dropped the
    connection), and the request then waited for an answer already gone. The stall here
    blocks the web's event loop for 5.5 s while its wait for `done` is under way."""
    import threading
    import time

    from scheduler.pools.policies import fair_queue

    admitted = waiting_request("j3")
    queue = fair_queue()
    queue.publish("p", "j3", {"event": "chunk", "attempt": 1, "data": {}})
    answer = threading.Timer(0.3, queue.publish, ("p", "j3", {"event": "done", "attempt": 1}))

    async def relay() -> list[str]:
        seen = []
        async for event in online.follow(admitted):
            seen.append(event["event"])
            if event["event"] == "chunk":  # the next wait starts: stall the loop under it
                answer.start()
                asyncio.get_running_loop().call_later(0.1, time.sleep, 5.5)
        return seen

    try:
        assert asyncio.run(asyncio.wait_for(relay(), timeout=12)) == ["chunk", "done"]
    finally:
        answer.cancel()


@pytest.mark.parametrize(
    ("running", "deadline_in_s", "wait_s"),
    [
        (True, -10.0, online.EVENTS_WAIT_S),  # running: only the answer ends the wait
        (False, 60.0, online.EVENTS_WAIT_S),  # queued, its deadline far off
        (False, 2.3, 4),  # queued: the wait ends just past its deadline (3.3 s, whole seconds)
        (False, -30.0, 1),  # past it: the shortest wait BLPOP has
    ],
)
def test_a_wait_for_events_lasts_a_few_seconds_or_until_just_past_the_queue_deadline(
    running, deadline_in_s, wait_s
):
    now = 1000.0
    assert online._wait_s(now + deadline_in_s, running, now) == wait_s


def test_a_queued_waiter_is_timed_out_at_its_deadline_not_at_the_end_of_a_long_wait(redis_db):
    """Nothing comes (no housekeeping here to expire the job): the waiter itself times the job
    out once its deadline has passed, within a wait or so, not after EVENTS_WAIT_S."""
    import time

    from fairqueue.domain import EnginePolicy, TenantPolicy
    from scheduler.pools.policies import fair_queue

    queue = fair_queue()
    queue.set_tenant_policy("t", TenantPolicy(weight=1, quota_bytes=1 << 30))
    queue.set_engine_policy(EnginePolicy("e", "p", kv_budget_bytes=1 << 30, max_num_seqs=1))
    job = queue.enqueue(tenant="t", pool="p", request_class="interactive", prompt_tokens=1,
                        max_tokens=1, kv_bytes=1, job_id="j5")  # fmt: skip
    # Its queue deadline half a second away, in the queue as in the waiter's copy (no
    # housekeeping runs here to expire it).
    deadline = time.time() + 0.5
    redis_db.hset(queue.keys.job("p", "j5"), "deadline", repr(deadline))
    admitted = replace(waiting_request("j5"), job=replace(job, deadline=deadline))

    async def relay() -> list[str]:
        return [event["event"] async for event in online.follow(admitted)]

    with pytest.raises(online.QueueTimeout):
        asyncio.run(relay())
    assert time.time() - deadline < 3.0
    cancelled = queue.get_job("p", "j5")
    assert cancelled is not None
    assert cancelled.state == "cancelled"


def test_a_requeued_job_is_held_to_its_fresh_deadline_not_to_the_first_one(redis_db):
    """A job requeued after its engine failed gets a fresh queue deadline in the queue; its
    waiter, whose copy of the job has the first one (long past), must not time it out."""
    import threading
    import time

    from fairqueue.domain import EnginePolicy, TenantPolicy
    from scheduler.pools.policies import fair_queue

    queue = fair_queue()
    queue.set_tenant_policy("t", TenantPolicy(weight=1, quota_bytes=1 << 30))
    queue.set_engine_policy(EnginePolicy("e", "p", kv_budget_bytes=1 << 30, max_num_seqs=1))
    job = queue.enqueue(tenant="t", pool="p", request_class="interactive", prompt_tokens=1,
                        max_tokens=1, kv_bytes=1, job_id="j6")  # fmt: skip
    assert job.deadline > time.time() + 10  # the queue's deadline: far off
    admitted = replace(waiting_request("j6"), job=replace(job, deadline=time.time() - 60))

    def answer() -> None:
        queue.publish("p", "j6", {"event": "done", "attempt": 1})

    later = threading.Timer(2.5, answer)

    async def relay() -> list[str]:
        later.start()
        return [event["event"] async for event in online.follow(admitted)]

    try:
        assert asyncio.run(asyncio.wait_for(relay(), timeout=10)) == ["done"]
    finally:
        later.cancel()
    still = queue.get_job("p", "j6")
    assert still is not None
    assert still.state == "queued"  # not cancelled by the waiter


def test_a_requeued_runs_leftovers_are_skipped_by_their_attempt(redis_db):
    """No event comes at a pick: after one `requeued`, words of attempt 1 are a dead run's,
    those of attempt 2 the current run's."""
    from scheduler.pools.policies import fair_queue

    admitted = waiting_request("j7")
    queue = fair_queue()
    events: list[dict[str, object]] = [
        {"event": "chunk", "attempt": 1, "data": {"n": 1}},
        {"event": "requeued", "reason": "engine_unavailable"},
        {"event": "chunk", "attempt": 1, "data": {"n": 2}},  # the dead run, still talking
        {"event": "done", "attempt": 1},
        {"event": "chunk", "attempt": 2, "data": {"n": 3}},
        {"event": "done", "attempt": 2},
    ]
    for event in events:
        queue.publish("p", "j7", event)

    async def relay() -> list[tuple[str, int | None]]:
        return [(e["event"], e.get("attempt")) async for e in online.follow(admitted)]

    assert asyncio.run(relay()) == [("chunk", 1), ("requeued", None), ("chunk", 2), ("done", 2)]


def test_a_job_past_its_queue_deadline_that_runs_is_followed_as_running(redis_db):
    """A whole answer says nothing until its end: a waiter that finds its job's queue deadline
    past asks the queue, and a running job is waited for as such (long waits), not asked
    about again and again nor timed out."""
    import time

    from fairqueue.domain import EnginePolicy, TenantPolicy
    from scheduler.pools.policies import fair_queue

    queue = fair_queue()
    queue.set_tenant_policy("t", TenantPolicy(weight=1, quota_bytes=1 << 30))
    queue.set_engine_policy(EnginePolicy("e", "p", kv_budget_bytes=1 << 30, max_num_seqs=1))
    job = queue.enqueue(tenant="t", pool="p", request_class="interactive", prompt_tokens=1,
                        max_tokens=1, kv_bytes=1, job_id="j8")  # fmt: skip
    past = time.time() - 60
    admitted = replace(waiting_request("j8"), job=replace(job, deadline=past))

    def still_coming() -> tuple[float, bool]:
        return asyncio.run(online._check_still_coming(admitted, False, past, 0.0))

    assert still_coming() == (job.deadline, False)
    assert queue.pick("p") is not None
    assert still_coming() == (past, True)
    assert online._wait_s(past, True, time.time()) == online.EVENTS_WAIT_S


def test_a_waiter_whose_job_redis_lost_ends_with_a_503_not_a_hang(redis_db):
    """A failover can lose a job's record (a write the promoted replica lacked): nothing will
    come for it, so a waiter that hears nothing for a wait finds it gone and answers 503."""
    import time

    admitted = waiting_request("j11")
    gone = replace(waiting_request("j12"), job=replace(admitted.job, job_id="j12"))
    redis_db.delete("gs:fq:{p:p}:job:j12")

    def still_coming(which: online.Admitted, running: bool, deadline: float, silent_s: float):
        return asyncio.run(online._check_still_coming(which, running, deadline, silent_s))

    assert still_coming(admitted, True, 9e9, online.EVENTS_WAIT_S) == (9e9, True)
    assert still_coming(gone, False, 9e9, 1.0) == (9e9, False)  # not asked every second
    for running, silent_s in [(True, online.EVENTS_WAIT_S), (False, online.EVENTS_WAIT_S)]:
        with pytest.raises(online.Unavailable, match="lost when Redis failed over"):
            still_coming(gone, running, 9e9, silent_s)
    with pytest.raises(online.Unavailable, match="lost"):  # past its deadline: at once
        still_coming(gone, False, time.time() - 60, 0.0)


@pytest.mark.parametrize("number", ["NaN", "Infinity", "1e999", str(2**64), str(-(2**63) - 1)])
def test_a_number_no_engine_takes_is_400(number, auth):
    # Python's json reads these; passed on, NaN would have reached the engine as null
    # (orjson writes it so) and 2**64 as a float (plumbing/wire.py).
    content = f'{{"model": "m", "messages": [], "temperature": {number}}}'.encode()
    response = asgi_request("POST", CHAT, content=content, headers=auth)
    assert response.status_code == 400
    assert "not valid JSON" in error_of(response)["message"]


def queued_job(job_id: str) -> online.Admitted:
    """A chat request whose job `job_id` waits in the real queue."""
    from fairqueue.domain import EnginePolicy, TenantPolicy
    from scheduler.pools.policies import fair_queue

    queue = fair_queue()
    queue.set_tenant_policy("t", TenantPolicy(weight=1, quota_bytes=1 << 30))
    queue.set_engine_policy(EnginePolicy("e", "p", kv_budget_bytes=1 << 30, max_num_seqs=1))
    job = queue.enqueue(tenant="t", pool="p", request_class="interactive", prompt_tokens=1,
                        max_tokens=1, kv_bytes=1, job_id=job_id)  # fmt: skip
    return replace(waiting_request(job_id), job=job)


def test_a_waiter_cancelled_while_it_waits_cancels_its_job_in_a_task_of_its_own(redis_db):
    """The `finally:` of a cancelled waiter does not wait for Redis: the job's cancel is
    handed to a task, which the loop runs once the waiter is gone."""
    from api import inference as openai_api
    from scheduler.pools.policies import fair_queue

    admitted = queued_job("j9")

    async def leave() -> None:
        waiter = asyncio.ensure_future(openai_api._whole(admitted, asyncio.Event()))
        await asyncio.sleep(0.2)  # waiting for events
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert online._background  # the cancel, under way
        await online.background_done()

    asyncio.run(leave())
    job = fair_queue().get_job("p", "j9")
    assert job is not None
    assert job.state == "cancelled"
    assert job.reason == "client_gone"


def test_a_stream_broken_after_chunks_ends_with_an_error_its_row_written_in_a_thread(redis_db):
    from api import inference as openai_api
    from scheduler.pools.policies import fair_queue
    from tenants.usage_buffer import PENDING_KEY

    admitted = queued_job("j10")
    queue = fair_queue()
    queue.publish("p", "j10", {"event": "chunk", "attempt": 1, "data": {"choices": [{"index": 0}]}})
    queue.publish("p", "j10", {"event": "requeued", "reason": "engine_unavailable"})

    async def relay() -> list[bytes]:
        chunks = [chunk async for chunk in openai_api._sse(admitted, asyncio.Event())]
        await online.background_done()
        return chunks

    chunks = asyncio.run(relay())
    assert len(chunks) == 3  # the chunk, the error, [DONE]
    assert b"engine was lost" in chunks[1]
    job = queue.get_job("p", "j10")
    assert job is not None
    assert job.state == "cancelled"
    rows = redis_db.lrange(PENDING_KEY, 0, -1)
    assert [json.loads(row)["error_code"] for row in rows] == ["stream_broken"]
    assert json.loads(rows[0])["end_user"] == "u1"


@pytest.mark.parametrize("path", [CHAT, "/v1/files"])
def test_a_body_that_trickles_past_the_deadline_is_answered_408(settings, auth, path):
    from config.asgi import application

    settings.GPUSHARE_BODY_TIMEOUT_S = 0.3
    first = [{"type": "http.request", "body": b'{"model": "m", "mess', "more_body": True}]
    sent: list[dict] = []

    async def receive() -> dict:
        if first:
            return first.pop()
        await asyncio.Event().wait()  # the rest never comes
        raise AssertionError("unreachable")

    async def send(message: dict) -> None:
        sent.append(message)

    headers = [(b"authorization", auth["Authorization"].encode()),
               (b"content-type", b"application/json")]  # fmt: skip
    scope = {"type": "http", "method": "POST", "path": path, "query_string": b"",
             "headers": headers}  # fmt: skip
    started = time.monotonic()
    asyncio.run(asyncio.wait_for(application(scope, receive, send), timeout=10))
    assert time.monotonic() - started < 5
    assert sent[0]["status"] == 408
    assert json.loads(sent[1]["body"])["error"]["code"] == "request_timeout"
    assert len([m for m in sent if m["type"] == "http.response.start"]) == 1  # nothing more


def test_a_tenant_sends_the_optional_fields_its_operator_enabled_and_no_others(auth):
    from tenants.models import Tenant
    from tenants.services import tenant_update

    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "prompt_logprobs": 2}
    refused = asgi_request("POST", CHAT, json=body, headers=auth)
    assert refused.status_code == 400
    assert error_of(refused)["param"] == "prompt_logprobs"
    tenant_update(tenant=Tenant.objects.get(slug="acme"), enabled_fields=["prompt_logprobs"])
    taken = asgi_request("POST", CHAT, json=body, headers=auth)
    assert taken.status_code == 404  # past the fields, to the model (none is served here)
    assert error_of(taken)["code"] == "model_not_found"


def test_an_unknown_path_of_the_tenant_api_is_an_openai_404_and_others_djangos(auth):
    for method, path in (("GET", "/v1/embeddingz"), ("GET", "/v1/chat/completions/"),
                         ("DELETE", "/v1/nothing/here")):  # fmt: skip
        assert asgi_request(method, path).status_code == 401  # the key first, as everywhere
        response = asgi_request(method, path, headers=auth)
        assert response.status_code == 404
        assert error_of(response) == {
            "message": f"Invalid URL ({method} {path})", "type": "invalid_request_error",
            "code": "unknown_url", "param": None,
        }  # fmt: skip
    page = asgi_request("GET", "/nowhere")
    assert page.status_code == 404
    assert "application/json" not in page.headers["content-type"]


def test_every_answer_of_the_tenant_api_carries_a_request_id_errors_included(auth):
    answers = [
        asgi_request("GET", "/v1/models", headers=auth),  # Django, 200
        asgi_request("POST", CHAT, json={"model": "m"}),  # the key gate, 401
        asgi_request("GET", "/v1/no-such-thing", headers=auth),  # Django, 404
        asgi_request("GET", CHAT, headers=auth),  # the inference app, 405
        asgi_request("POST", CHAT, content=b"x" * (5 << 20), headers=auth),  # too large, 413
    ]
    ids = [answer.headers.get("x-request-id") for answer in answers]
    assert all(ids), ids
    assert len(set(ids)) == len(ids)  # each its own
    assert "x-request-id" not in asgi_request("GET", "/healthz").headers  # the API's only


def test_the_key_the_gate_checked_is_the_one_admission_uses(auth, monkeypatch):
    looked_up: list[str] = []
    lookup = online.authenticate_bearer

    def counted(authorization: str):
        looked_up.append(authorization)
        return lookup(authorization)

    monkeypatch.setattr(online, "authenticate_bearer", counted)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    asgi_request("POST", CHAT, json=body, headers=auth)  # the key cached (a first try on the
    looked_up.clear()  # loop, and one in a thread, read it from the database)
    response = asgi_request("POST", CHAT, json=body, headers=auth)
    assert error_of(response)["code"] == "model_not_found"  # admitted as far as the route
    assert looked_up == [auth["Authorization"]]  # once, by the gate


def answer_the_first_queued_job(answer: dict) -> threading.Thread:
    """A worker's stand-in: the first job queued for the ready engine's tenant is answered
    `done` with `answer` as its body (nothing runs it here)."""
    from scheduler.pools.policies import fair_queue
    from tests.scheduler.online.test_admission import MODEL, queued_ids

    def answering() -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            ids = queued_ids()
            if ids:
                fair_queue().publish(MODEL, ids[0], {"event": "done", "attempt": 1, "body": answer})
                return
            time.sleep(0.02)

    thread = threading.Thread(target=answering, daemon=True)
    thread.start()
    return thread


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("stream", [False, True])
def test_answers_and_the_429_carry_the_tenant_s_rate_limits_as_openai_sends_them(
    redis_db, tmp_path, stream
):
    from scheduler.pools.policies import fair_queue
    from tenants.models import Tenant
    from tenants.services import tenant_update
    from tests.scheduler.online.test_admission import MODEL, key_to_a_ready_engine

    headers = {"Authorization": key_to_a_ready_engine(tmp_path)}
    tenant_update(tenant=Tenant.objects.get(slug="acme"), rpm_limit=1, tpm_limit=100_000)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
            "stream": stream}  # fmt: skip
    answering = answer_the_first_queued_job({"object": "chat.completion", "choices": []})
    answered = asgi_request("POST", CHAT, json=body, headers=headers)
    answering.join()
    assert answered.status_code == 200
    job = fair_queue().get_job(MODEL, answered.headers["x-request-id"])
    assert job is not None
    assert {k: v for k, v in answered.headers.items() if k.startswith("x-ratelimit-")} == {
        "x-ratelimit-limit-requests": "1", "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": answered.headers["x-ratelimit-reset-requests"],
        "x-ratelimit-limit-tokens": "100000",
        "x-ratelimit-remaining-tokens": str(100_000 - job.prompt_tokens - job.max_tokens),
        "x-ratelimit-reset-tokens": answered.headers["x-ratelimit-reset-tokens"],
    }  # fmt: skip
    # This minute's request weighs on the window until the next minute ends: 60-120 s.
    assert answered.headers["x-ratelimit-reset-requests"].startswith("1m")
    refused = asgi_request("POST", CHAT, json=body, headers=headers)
    assert refused.status_code == 429
    assert error_of(refused)["code"] == "rate_limit_exceeded"
    assert refused.headers["retry-after"]
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert refused.headers["x-ratelimit-limit-tokens"] == "100000"


@pytest.mark.django_db(transaction=True)
def test_a_tenant_without_minute_limits_gets_no_rate_limit_headers(redis_db, tmp_path):
    from tests.scheduler.online.test_admission import MODEL, key_to_a_ready_engine

    headers = {"Authorization": key_to_a_ready_engine(tmp_path)}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    answering = answer_the_first_queued_job({"object": "chat.completion", "choices": []})
    answered = asgi_request("POST", CHAT, json=body, headers=headers)
    answering.join()
    assert answered.status_code == 200
    assert answered.headers["x-request-id"]
    assert not [k for k in answered.headers if k.startswith("x-ratelimit-")]


# --- bodies are bounded before anything reads them (config.asgi, plumbing.body_limit) -----

HUGE = 50 * 1024**3  # what a client may declare; nothing of it is read
CHUNK = 64 * 1024


class EndlessClient:
    """The server's side of a request whose body never ends: `receive` gives 64 KiB chunks
    for as long as it is asked, and counts them."""

    def __init__(self) -> None:
        self.pulled = 0
        self.sent: list[dict] = []

    async def receive(self) -> dict:
        self.pulled += CHUNK
        await asyncio.sleep(0)
        return {"type": "http.request", "body": b"x" * CHUNK, "more_body": True}

    async def send(self, message: dict) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int:
        return int(self.sent[0]["status"])

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent[1:])


@pytest.fixture
def app_reads(monkeypatch) -> list[int]:
    """The body's bytes that reached the application behind the layers (Django or the
    inference endpoints), as its `receive` returned them."""
    import config.asgi

    reads: list[int] = []

    def counted(app):
        async def app_counting(scope, receive, send):
            async def receive_counting():
                message = await receive()
                reads.append(len(message.get("body", b"")))
                return message

            await app(scope, receive_counting, send)

        return app_counting

    monkeypatch.setattr(config.asgi, "django_application", counted(config.asgi.django_application))
    monkeypatch.setattr(config.asgi, "inference_app", counted(config.asgi.inference_app))
    return reads


def serve_endless(method: str, path: str, headers: dict[str, str]) -> EndlessClient:
    """Sends `application` a request whose body never ends; it must be answered in 5 s."""
    from config.asgi import application

    client = EndlessClient()
    encoded = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    scope = {"type": "http", "method": method, "path": path, "query_string": b"",
             "headers": [(b"host", b"testserver"), *encoded]}  # fmt: skip
    started = time.monotonic()
    asyncio.run(asyncio.wait_for(application(scope, client.receive, client.send), timeout=5))
    assert time.monotonic() - started < 5
    assert len([m for m in client.sent if m["type"] == "http.response.start"]) == 1
    return client


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/admin/login/"), ("POST", "/api/v1/tenants/"), ("POST", "/console/tenants/"),
     ("GET", "/v1/files"), ("DELETE", "/v1/files/file-1"), ("POST", "/v1/files"),
     ("POST", CHAT), ("POST", "/v1/batches")],
)  # fmt: skip
def test_a_declared_huge_body_is_refused_before_a_byte_is_read(auth, app_reads, method, path):
    client = serve_endless(method, path, {**auth, "Content-Length": str(HUGE)})
    assert client.status == 413
    assert client.pulled == 0
    assert app_reads == []  # the application was never called
    if path.startswith("/v1/"):
        assert json.loads(client.body)["error"]["code"] == "request_too_large"
    else:
        assert b"larger than the limit" in client.body


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/v1/files"), ("DELETE", "/v1/files/file-1"), ("GET", "/v1/models"),
     ("POST", "/v1/files"), ("GET", CHAT)],
)  # fmt: skip
@pytest.mark.parametrize("length", [str(HUGE), None])
def test_no_key_no_body_whatever_the_method(transactional_db, app_reads, method, path, length):
    client = serve_endless(method, path, {"Content-Length": length} if length else {})
    assert client.status == 401
    assert json.loads(client.body)["error"]["type"] == "authentication_error"
    assert client.pulled == 0
    assert app_reads == []


@pytest.mark.parametrize(
    ("method", "path", "limit_setting"),
    [("POST", "/admin/login/", "GPUSHARE_MAX_OTHER_BODY_BYTES"),
     ("POST", "/api/v1/tenants/", "GPUSHARE_MAX_OTHER_BODY_BYTES"),
     ("GET", "/v1/files", "GPUSHARE_MAX_OTHER_BODY_BYTES"),
     ("POST", "/v1/batches", "GPUSHARE_MAX_OTHER_BODY_BYTES"),
     ("POST", CHAT, "GPUSHARE_MAX_BODY_BYTES"),
     ("POST", "/v1/files", "GPUSHARE_BATCH_MAX_FILE_BYTES")],
)  # fmt: skip
def test_a_chunked_body_that_never_ends_is_cut_off_at_the_routes_limit(
    settings, auth, app_reads, method, path, limit_setting
):
    from config.asgi import MULTIPART_OVERHEAD_BYTES

    setattr(settings, limit_setting, 300_000)
    limit = 300_000 + (MULTIPART_OVERHEAD_BYTES if path == "/v1/files" else 0)
    client = serve_endless(method, path, auth)  # no Content-Length: chunked
    assert client.status == 413
    assert sum(app_reads) <= limit  # what the application was handed
    assert client.pulled <= limit + CHUNK  # and all that was read: up to the chunk past it
    if path.startswith("/v1/"):
        assert json.loads(client.body)["error"]["code"] == "request_too_large"


def test_a_body_within_the_routes_limit_is_read_whole(settings, auth):
    from config.asgi import body_limit_of

    settings.GPUSHARE_MAX_OTHER_BODY_BYTES = 1000
    auth = {**auth, "Content-Type": "application/json"}
    within = asgi_request("POST", "/v1/batches", content=b"{" + b" " * 998 + b"}", headers=auth)
    assert within.status_code == 400  # past the limit, to the view: the fields are missing
    assert error_of(within)["param"] == "input_file_id"
    over = asgi_request("POST", "/v1/batches", content=b"{" + b" " * 999 + b"}", headers=auth)
    assert over.status_code == 413
    scope = {"method": "POST", "path": "/v1/files"}
    assert body_limit_of(scope) == settings.GPUSHARE_BATCH_MAX_FILE_BYTES + 64 * 1024


def socket_buffers_max() -> int:
    """The most a TCP connection's receive and send buffers hold together (the kernel's
    tcp_rmem and tcp_wmem maxima)."""
    return sum(
        int(Path(f"/proc/sys/net/ipv4/{name}").read_text().split()[2])
        for name in ("tcp_rmem", "tcp_wmem")
    )


def test_a_real_server_answers_a_declared_huge_body_at_once_and_reads_none_of_it(db):
    """uvicorn serving the web: 50 GiB declared to the Django admin's login, or to the admin
    API chunked without end, is answered 413 at once and the connection closed. (A server
    that closes a connection with unread bytes makes its kernel reset it, which may discard
    the 413 before the client reads it: a reset counts as the answer too.)"""
    import socket

    import uvicorn

    from config.asgi import application
    from tests.support.harness import free_port

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(application, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        for head in (
            f"POST /admin/login/ HTTP/1.1\r\nHost: t\r\nContent-Length: {HUGE}\r\n\r\n",
            "POST /api/v1/tenants/ HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n",
        ):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(head.encode())
                started = time.monotonic()
                answer, sent, closed = b"", 0, False
                sock.setblocking(False)
                while not closed and time.monotonic() - started < 5:
                    try:  # the client keeps sending as long as the server reads
                        sent += sock.send(b"10000\r\n" + b"x" * 0x10000 + b"\r\n")
                    except BlockingIOError:
                        time.sleep(0.01)
                    except (BrokenPipeError, ConnectionResetError):
                        closed = True
                    try:
                        received = sock.recv(65536)
                        answer += received
                        closed = closed or not received
                    except BlockingIOError:
                        pass
                    except ConnectionResetError:
                        closed = True
                assert closed, (head, answer)
                assert time.monotonic() - started < 3, (head, sent)
                if answer:
                    assert answer.startswith(b"HTTP/1.1 413 "), answer
                    assert b"connection: close" in answer.lower()
                # The 1 MiB the web read, and what the kernel's buffers took on both ends
                # (loopback autotunes them up to these maxima): never the rest.
                assert sent < 1024 * 1024 + socket_buffers_max(), (head, sent)
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_the_ingress_takes_no_body_larger_than_the_web_s_largest_limit(settings):
    import re
    from pathlib import Path

    import yaml

    from config.asgi import body_limit_of

    ingress = Path(__file__).resolve().parents[2] / "platform/k8s/production/ingress.yaml"
    annotations = yaml.safe_load(ingress.read_text())["metadata"]["annotations"]
    size = annotations["nginx.ingress.kubernetes.io/proxy-body-size"]
    spelled = re.fullmatch(r"(\d+)([km]?)", size)  # nginx's sizes; 0 is no limit
    assert spelled is not None, size
    number, unit = spelled.groups()
    allowed = int(number) * {"": 1, "k": 1024, "m": 1024**2}[unit]
    largest = max(
        body_limit_of({"method": method, "path": path})
        for method, path in (("POST", "/v1/files"), ("POST", CHAT), ("POST", "/admin/login/"))
    )
    assert largest <= allowed < largest + 1024**2


def relayed(job_id: str, entries: list[tuple[int | None, dict | None]]) -> list[bytes]:
    """Streams job `job_id` to its client from inbox entries: (seq, None) a numbered chunk,
    (None, event) an event; returns what the client got."""
    from api import inference as openai_api
    from fairqueue.inbox import chunk_entry, event_entry
    from scheduler.pools.policies import fair_queue

    admitted = queued_job(job_id)
    queue = fair_queue()
    inbox = queue.keys.inbox("p", TEST_INBOX)  # the web's, which its loop reads
    for seq, event in entries:
        if event is None:
            assert seq is not None
            entry = chunk_entry(job_id, 1, b'{"seq": %d}' % seq, seq)
        else:
            entry = event_entry(job_id, json.dumps({**event, "attempt": 1}))
        queue.redis.rpush(inbox, entry)

    async def follow() -> list[bytes]:
        chunks = [chunk async for chunk in openai_api._sse(admitted, asyncio.Event())]
        await online.background_done()
        return chunks

    return asyncio.run(follow())


def test_a_relayed_chunk_handed_over_twice_reaches_the_client_once(redis_db):
    done = {"event": "done", "usage": {}, "chunks": 3}
    got = relayed("j11", [(1, None), (2, None), (2, None), (3, None), (None, done)])
    assert got[:3] == [b'data: {"seq": %d}\n\n' % seq for seq in (1, 2, 3)]
    assert got[3:] == [b"data: [DONE]\n\n"]


def test_a_stream_that_lost_a_relayed_chunk_ends_with_an_error_and_stops_its_run(redis_db):
    from scheduler.pools.policies import fair_queue

    got = relayed("j12", [(1, None), (3, None)])
    assert got[0] == b'data: {"seq": 1}\n\n'
    assert b"Part of the stream was lost" in got[1]
    assert got[2:] == [b"data: [DONE]\n\n"]
    job = fair_queue().get_job("p", "j12")
    assert job is not None
    assert job.state == "cancelled"


def test_a_stream_whose_last_relayed_chunks_were_lost_ends_with_an_error(redis_db):
    done = {"event": "done", "usage": {}, "chunks": 3}
    got = relayed("j13", [(1, None), (2, None), (None, done)])
    assert len(got) == 4  # two chunks, the error, [DONE]
    assert b"Part of the stream was lost" in got[2]


def test_a_key_limited_to_some_models_is_refused_others_and_an_expired_key_is_401(transactional_db):
    from datetime import timedelta

    from django.utils import timezone

    from tenants.models import ApiKey
    from tenants.services import api_key_create
    from tests.factories import TenantFactory

    tenant = TenantFactory.create(slug="acme")
    narrow = api_key_create(tenant=tenant, name="narrow", allowed_models=["llama"]).raw_key
    body = {"model": "qwen", "messages": [{"role": "user", "content": "hi"}]}
    refused = asgi_request("POST", CHAT, json=body, headers={"Authorization": f"Bearer {narrow}"})
    assert refused.status_code == 403
    assert error_of(refused)["code"] == "model_not_allowed"
    assert "This key may not use model 'qwen'" in error_of(refused)["message"]

    issued = api_key_create(tenant=tenant, name="old", expires_at=timezone.now() + timedelta(1))
    ApiKey.objects.filter(pk=issued.api_key.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    expired = asgi_request(
        "POST", CHAT, json=body, headers={"Authorization": f"Bearer {issued.raw_key}"}
    )
    assert expired.status_code == 401
    assert error_of(expired)["code"] == "expired_api_key"
