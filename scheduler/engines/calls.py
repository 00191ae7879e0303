"""One generation call as the engine gets it and as the client gets its answer: shared by
whoever makes the call (the worker's dispatcher, or the web for a stream it was granted)."""

from __future__ import annotations

from typing import Any

from config import wire
from scheduler.inference import ENDPOINT_PATHS
from scheduler.request_classes import ENGINE_PRIORITY


def engine_path(request: dict[str, Any]) -> str:
    path: str = ENDPOINT_PATHS[request["endpoint"]]
    return path


def engine_body(request: dict[str, Any], request_class: str) -> dict[str, Any]:
    """What the engine gets: the client's body, streamed or not as asked, at its class's
    priority (never one the client chose: the engine's queue is shared)."""
    body = {
        **request["body"],
        "stream": bool(request["stream"]),
        "priority": ENGINE_PRIORITY[request_class],
    }
    if request["stream"]:
        # Always ask for usage, to charge the real tokens; the client gets it only if asked.
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    return body


def client_data(data: bytes, chunk: dict[str, Any], include_usage: bool) -> bytes | None:
    """What the client gets of a chunk: the platform always asks the engine for usage (to
    charge the real tokens); a client that did not ask for it gets chunks without it, as
    from OpenAI (the engine's last chunk, usage alone, not at all)."""
    if include_usage or "usage" not in chunk:
        return data  # as the engine sent it: nothing to encode again
    if not chunk.get("choices"):
        return None
    return wire.dumps_bytes({k: v for k, v in chunk.items() if k != "usage"})


def usage_counts(usage: dict[str, Any] | None) -> tuple[int, int] | None:
    """(prompt, completion) tokens of an answer's usage, None when it has none."""
    if not usage:
        return None
    return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
