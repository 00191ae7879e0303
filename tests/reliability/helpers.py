"""What the reliability tests share: tenants, requests that record how they ended, the
ledger and the scheduler's own check."""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.reliability.conftest import MODEL
from tests.support.harness import Platform, start_process

# No request of the suite may take longer than this: a hang fails the test.
CLIENT_TIMEOUT_S = 120.0


def make_tenant(platform: Platform, **options: str) -> tuple[str, str]:
    """A new tenant (slug, raw key) with the given `tenant create` options."""
    slug = f"r-{uuid.uuid4().hex[:8]}"
    args = ["tenant", "create", slug]
    for name, value in {"quota_units": "4", **options}.items():
        args += [f"--{name.replace('_', '-')}", *value.split()]
    data = platform.manage_json(*args)
    return slug, data["api_key"]["key"]


def chat_body(max_tokens: int = 64, *, stream: bool = False, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "tell me a long story"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": stream,
        **extra,
    }


@dataclass
class Answer:
    """How one request ended, as its client saw it."""

    status: int
    request_id: str | None
    body: Any = None
    events: list[Any] = field(default_factory=list)  # SSE data payloads, parsed
    done: bool = False  # the stream ended with `data: [DONE]`
    exception: str | None = None  # the client gave up (timeout) or the connection broke

    @property
    def stream_error(self) -> dict[str, Any] | None:
        for event in self.events:
            if isinstance(event, dict) and "error" in event:
                return event
        return None

    @property
    def chunks(self) -> int:
        return sum(1 for e in self.events if isinstance(e, dict) and "choices" in e)


def post(
    http: httpx.Client,
    key: str,
    body: dict[str, Any],
    path: str = "/v1/chat/completions",
    events: list[Any] | None = None,
) -> Answer:
    """Sends one request and reads its whole answer. A stream's events are appended to
    `events` as they come, when given, so a test can watch a stream's progress."""
    headers = {"Authorization": f"Bearer {key}"}
    try:
        if not body.get("stream"):
            response = http.post(path, json=body, headers=headers, timeout=CLIENT_TIMEOUT_S)
            request_id = response.headers.get("X-Request-Id")
            return Answer(response.status_code, request_id, _parsed(response))
        with http.stream(
            "POST", path, json=body, headers=headers, timeout=CLIENT_TIMEOUT_S
        ) as response:
            answer = Answer(response.status_code, response.headers.get("X-Request-Id"))
            if events is not None:
                answer.events = events
            if response.status_code != 200:
                response.read()
                answer.body = _parsed(response)
                return answer
            for line in response.iter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: ") :]
                if data == "[DONE]":
                    answer.done = True
                    break
                answer.events.append(json.loads(data))
            return answer
    except httpx.HTTPError as exc:
        return Answer(0, None, exception=f"{type(exc).__name__}: {exc}")


def _parsed(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:  # not JSON: an HTML error page, say
        return response.text[:2000]


def assert_openai_error(answer: Answer) -> None:
    body = answer.body
    assert isinstance(body, dict), (answer.status, body)
    assert isinstance(body.get("error"), dict), (answer.status, body)
    assert {"message", "type", "code"} <= set(body["error"]), body


def usage_rows(platform: Platform, slug: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = platform.shell(
        "import json; from tenants.models import UsageRecord as U; print(json.dumps(list("
        f"U.objects.filter(tenant__slug='{slug}').values('request_id', 'outcome', "
        "'status_code', 'error_code', 'completion_tokens'))))"
    )
    return rows


def wait_until(predicate: Any, timeout: float, what: str, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    value = None
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"{what}: not within {timeout:.0f} s (last: {value!r})")


def scheduler_check(platform: Platform) -> str:
    """`manage.py scheduler check`; fails (exit 1) on drift."""
    return platform.manage("scheduler", "check")


def reserved_totals(fair_queue: Any) -> tuple[int, int]:
    snap = fair_queue.snapshot()
    return sum(snap.tenant_reserved_bytes.values()), sum(snap.engine_reserved_bytes.values())


class Supervisor:
    """Restarts the named platform processes when they exit, as their supervisor does in a
    deployment (compose `restart: unless-stopped`, Kubernetes). Counts the restarts, so a
    test can say whether it needed one."""

    def __init__(self, platform: Platform, names: list[str]) -> None:
        self.platform, self.names = platform, names
        self.restarts: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> Supervisor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _watch(self) -> None:
        while not self._stop.wait(1.0):
            for name in self.names:
                process = self.platform.processes.get(name)
                if process is not None and process.poll() is not None:
                    self.restarts.append(f"{name} (exit {process.returncode})")
                    start_process(self.platform, name)
