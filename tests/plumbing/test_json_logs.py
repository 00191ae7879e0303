"""GPUSHARE_LOG_FORMAT=json: each line a process logs is one JSON object, with the time in
UTC, the level, the logger, the message, the exception where one is logged, and what is
known of the request it was written about (its id, tenant, engine, and the current span's
ids); a message's quotes, newlines and non-ASCII text stay in one line. A real process
(manage.py, the web) writes nothing else on stderr."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from django.conf import settings

from plumbing import request_ids
from plumbing.json_logs import JsonFormatter, log_format
from plumbing.request_ids import RequestIdFilter, request_id_scope

REPO = Path(__file__).resolve().parents[2]
LOGGING: dict[str, Any] = settings.LOGGING


def json_handler(lines: io.StringIO) -> logging.Handler:
    """A handler that writes to `lines` as the console handler does with the json format."""
    handler = logging.StreamHandler(lines)
    config = LOGGING["formatters"]["json"]
    assert config["()"] == "plumbing.json_logs.JsonFormatter"
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RequestIdFilter())
    return handler


def logged(*records: logging.LogRecord) -> list[dict[str, Any]]:
    lines = io.StringIO()
    handler = json_handler(lines)
    for record in records:
        handler.handle(record)
    return [json.loads(line) for line in lines.getvalue().splitlines()]


def record(message: str, *args: Any, exc_info: Any = None) -> logging.LogRecord:
    return logging.LogRecord("workers.dispatch", logging.WARNING, "", 0, message, args, exc_info)


def test_a_line_has_the_time_in_utc_the_level_the_logger_and_the_message():
    entry = record("job %s: %d tokens", "j1", 5)
    entry.created, entry.msecs = 1767225600.25, 250.0  # 2026-01-01 00:00:00.25 UTC

    (line,) = logged(entry)

    assert line == {
        "time": "2026-01-01T00:00:00.250Z",
        "level": "WARNING",
        "logger": "workers.dispatch",
        "message": "job j1: 5 tokens",
    }


def test_quotes_newlines_and_non_ascii_text_stay_in_one_line():
    message = 'she said "héllo"\nand left\t— 東京 \\ 🚀'
    lines = io.StringIO()
    json_handler(lines).handle(record("%s", message))

    assert lines.getvalue().count("\n") == 1
    assert json.loads(lines.getvalue())["message"] == message


def test_a_lone_surrogate_in_a_message_is_still_a_json_line():
    (line,) = logged(record("bytes: %s", b"\xff".decode(errors="surrogateescape")))

    assert line["message"] == "bytes: \udcff"


def test_a_logged_exception_comes_as_its_traceback():
    try:
        raise ValueError("the engine said no")
    except ValueError:
        (line,) = logged(record("job failed", exc_info=sys.exc_info()))

    assert line["message"] == "job failed"
    assert line["exception"].startswith("Traceback (most recent call last):")
    assert line["exception"].endswith("ValueError: the engine said no")


def test_a_line_names_the_request_its_tenant_and_engine_only_where_known():
    lines = io.StringIO()
    handler = json_handler(lines)
    handler.handle(record("before"))
    with request_id_scope() as request_id:
        handler.handle(record("admitting"))
        request_ids.bind(tenant="acme")
        handler.handle(record("admitted"))
        request_ids.bind(engine="e1")
        handler.handle(record("granted"))
    handler.handle(record("after"))

    known = [
        {name: line[name] for name in ("request_id", "tenant", "engine") if name in line}
        for line in map(json.loads, lines.getvalue().splitlines())
    ]
    assert known == [
        {},
        {"request_id": request_id},
        {"request_id": request_id, "tenant": "acme"},
        {"request_id": request_id, "tenant": "acme", "engine": "e1"},
        {},  # what the request bound ended with it
    ]


def test_the_plain_format_ends_a_line_with_what_is_known():
    lines = io.StringIO()
    handler = logging.StreamHandler(lines)
    handler.setFormatter(logging.Formatter(LOGGING["formatters"]["plain"]["format"]))
    handler.addFilter(RequestIdFilter())

    with request_id_scope() as request_id:
        request_ids.bind(tenant="acme", engine="e1")
        handler.handle(record("it broke"))
    handler.handle(record("it broke"))

    inside, outside = lines.getvalue().splitlines()
    assert inside.endswith(f": it broke request_id={request_id} tenant=acme engine=e1")
    assert outside.endswith(": it broke")


class _Span:
    def __init__(self, valid: bool) -> None:
        self.valid = valid

    def get_span_context(self) -> Any:
        return SimpleNamespace(is_valid=self.valid, trace_id=0xABC, span_id=0x12)


def test_a_line_written_in_a_span_carries_its_trace_and_span_ids(monkeypatch):
    # The OpenTelemetry API as the filter asks it: the current span's context.
    spans = iter([_Span(valid=True), _Span(valid=False)])
    monkeypatch.setattr(
        request_ids, "_trace", SimpleNamespace(get_current_span=lambda: next(spans))
    )

    in_span, no_span = logged(record("in a span"), record("outside one"))

    assert (in_span["trace_id"], in_span["span_id"]) == (f"{0xABC:032x}", f"{0x12:016x}")
    assert "trace_id" not in no_span
    assert "span_id" not in no_span


def test_without_opentelemetry_no_span_is_asked_for(monkeypatch):
    monkeypatch.setattr(request_ids, "_trace", None)

    (line,) = logged(record("no tracing here"))

    assert "trace_id" not in line


def test_the_format_is_plain_or_json_and_nothing_else(monkeypatch):
    monkeypatch.delenv("GPUSHARE_LOG_FORMAT", raising=False)
    assert log_format() == "plain"
    monkeypatch.setenv("GPUSHARE_LOG_FORMAT", " JSON ")
    assert log_format() == "json"
    monkeypatch.setenv("GPUSHARE_LOG_FORMAT", "logfmt")
    with pytest.raises(ValueError, match="GPUSHARE_LOG_FORMAT must be plain or json"):
        log_format()


def test_the_console_handler_writes_the_configured_format():
    assert LOGGING["handlers"]["console"]["formatter"] == settings.GPUSHARE_LOG_FORMAT


def json_env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "GPUSHARE_LOG_FORMAT": "json",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "GPUSHARE_VAR_DIR": str(tmp_path / "var"),
    }


def json_lines(stderr: str) -> list[dict[str, Any]]:
    """Each line of `stderr`, read as JSON (a line that is not fails the test)."""
    return [json.loads(line) for line in stderr.splitlines()]


def test_a_management_command_writes_only_json_lines(tmp_path):
    script = (
        "import logging, warnings\n"
        "log = logging.getLogger('scheduler.engines')\n"
        "log.info('engine %s started', 'demo')\n"
        "warnings.warn('a warning too')\n"
        "try:\n"
        "    1 / 0\n"
        "except ZeroDivisionError:\n"
        "    log.exception('it broke:\\n\"badly\"')\n"
    )
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "--no-imports", "-c", script],
        cwd=REPO, env=json_env(tmp_path), capture_output=True, text=True, timeout=120,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    lines = json_lines(done.stderr)
    assert [(line["level"], line["logger"]) for line in lines] == [
        ("INFO", "scheduler.engines"),
        ("WARNING", "py.warnings"),
        ("ERROR", "scheduler.engines"),
    ]
    assert lines[0]["message"] == "engine demo started"
    assert "a warning too" in lines[1]["message"]
    assert lines[2]["message"] == 'it broke:\n"badly"'
    assert lines[2]["exception"].endswith("ZeroDivisionError: division by zero")
    assert all(line["time"].endswith("Z") for line in lines)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def json_web(tmp_path) -> Iterator[tuple[str, Path]]:
    """The web (as `make run` starts it) logging JSON: its address and its log file."""
    env = json_env(tmp_path)
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"], cwd=REPO, env=env, check=True,
        capture_output=True, timeout=300,
    )  # fmt: skip
    port, log = free_port(), tmp_path / "web.log"
    with log.open("wb") as out:
        web = subprocess.Popen(
            [sys.executable, "-m", "plumbing.serve", "config.asgi:application",
             "--host", "127.0.0.1", "--port", str(port), "--log-level", "info"],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        yield f"http://127.0.0.1:{port}", log
    finally:
        web.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            web.wait(timeout=15)
        web.kill()
        web.wait()


def test_the_web_writes_only_json_lines_its_access_lines_with_the_request_id(json_web):
    base, log = json_web
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(f"{base}/healthz", timeout=2)
            break
        except httpx.HTTPError:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.3)

    answer = httpx.get(f"{base}/v1/models", headers={"Authorization": "Bearer gs-nobody"})
    time.sleep(0.5)

    assert answer.status_code == 401
    lines = json_lines(log.read_text())
    loggers = {line["logger"] for line in lines}
    assert {"uvicorn.error", "uvicorn.access"} <= loggers
    (access,) = [line for line in lines if "/v1/models" in line["message"]]
    assert access["request_id"] == answer.headers["x-request-id"]
