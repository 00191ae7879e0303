"""`GPUSHARE_LOG_FORMAT=json`: each log line is one JSON object, for a log pipeline (Loki,
Elasticsearch, CloudWatch) to read without a parser of its own.

A line has `time` (ISO 8601, UTC, to the millisecond), `level`, `logger` and `message`;
`exception` (the traceback as text) where one is logged, `stack` where the stack is; and
what is known of the request it was written for (`request_id`, `tenant`, `engine`,
`trace_id`, `span_id`: `plumbing.request_ids.RequestIdFilter` reads them, and a field not
known is left out). Newlines and quotes in a message are escaped, so a line is one line.

A formatter of its own rather than python-json-logger: the fields are these few, named as
above, and `plumbing.wire` already writes JSON (orjson, with the standard library where
orjson will not, as for a lone surrogate in a message), so the library would add a
dependency and a subclass to rename its fields for about thirty lines.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from plumbing import wire
from plumbing.env import env_str

FORMATS = ("plain", "json")


def log_format() -> str:
    """`GPUSHARE_LOG_FORMAT`: plain (the default) or json. Read from the environment, so that
    the Celery app sees it before Django's settings are loaded (config/celery.py)."""
    value = env_str("GPUSHARE_LOG_FORMAT", "plain").strip().lower() or "plain"
    if value not in FORMATS:
        raise ValueError(f"GPUSHARE_LOG_FORMAT must be plain or json, got {value!r}")
    return value


def utc_time(seconds: float) -> str:
    """`seconds` since the epoch as ISO 8601 in UTC, to the millisecond."""
    whole = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    return f"{whole}.{int(seconds % 1 * 1000):03d}Z"


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": utc_time(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)  # cached, as logging does
        if record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        line.update(getattr(record, "log_context", None) or {})
        return wire.dumps(line)
