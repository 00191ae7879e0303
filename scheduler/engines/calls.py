"""One generation call as the engine gets it and as the client gets its answer: shared by
whoever makes the call (the worker's dispatcher, or the web for a stream it was granted)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from django.conf import settings
from django.utils.crypto import salted_hmac

from plumbing import wire
from protocol.classes import engine_priority
from protocol.inference import ENDPOINT_PATHS, GENERATION_ENDPOINTS


def engine_path(request: dict[str, Any]) -> str:
    path: str = ENDPOINT_PATHS[request["endpoint"]]
    return path


def engine_body(request: dict[str, Any], request_class: str, stamp: float) -> dict[str, Any]:
    """What the engine gets: the client's body, streamed or not as asked, at the priority of
    its class and stamp (its place in the fair queue's order, `engine_priority`) and with its
    tenant's cache salt (never what the client chose: the engine and its prefix cache are
    shared)."""
    body = {
        **request["body"],
        "priority": engine_priority(request_class, stamp),
        "cache_salt": cache_salt(int(request["tenant_id"]), request.get("cache_group") or ""),
    }
    if request["endpoint"] in GENERATION_ENDPOINTS:  # an embedding request has no `stream`
        body["stream"] = bool(request["stream"])
    if request["endpoint"] == "responses":
        # Nothing a tenant sends is kept in a shared engine: no response is stored for anyone
        # to fetch (GET /v1/responses/{id}) or to continue. The token bound is Responses'
        # own field; a Responses answer and stream always carry their usage.
        body["store"] = False
        body["max_output_tokens"] = body.pop("max_tokens", body.get("max_output_tokens"))
    elif request["stream"]:
        # Always ask for usage, to charge the real tokens; the client gets it only if asked.
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    return body


@lru_cache(maxsize=4096)
def cache_salt(tenant_id: int, cache_group: str = "") -> str:
    """The salt for the engine's prefix cache (vLLM's `cache_salt`) of a tenant's requests:
    cached prefixes are shared between one tenant's requests and never across tenants, so a
    tenant cannot learn from its time to first token what another one sent; tenants an
    operator put in one `cache_group` share theirs. Keyed by the platform's secret, so that
    no tenant can compute another's salt; a tenant's and a group's never meet."""
    scope = f"group:{cache_group}" if cache_group else f"tenant:{tenant_id}"
    return salted_hmac("gpushare.engines.cache_salt", scope).hexdigest()[:32]


def affinity_key(tenant_id: int, cache_group: str = "", adapter: str = "") -> str:
    """Whose prefixes a request shares in an engine's prefix cache: its cache group's where
    its tenant is in one, else its tenant's (the scope of its `cache_salt`), and through
    which LoRA adapter (an engine caches an adapter's prefixes apart from the base model's,
    and holds the adapter itself). The fair queue runs a job on the engine that ran the
    latest job of the same key where it can (`fairqueue/lua/lib.lua` affinity_engine), which
    for an adapter's job is one that has it loaded. '' while GPUSHARE_CACHE_AFFINITY is off:
    the job runs on the engine of its pool with the most free KV."""
    if not settings.GPUSHARE_CACHE_AFFINITY:
        return ""
    scope = f"group:{cache_group}" if cache_group else f"tenant:{tenant_id}"
    return f"{scope}/adapter:{adapter}" if adapter else scope


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
    """(prompt, completion) tokens of an answer's usage, None when it has none: chat's and
    completions' (prompt_tokens, completion_tokens) or Responses' (input_tokens,
    output_tokens)."""
    if not usage:
        return None
    prompt = usage.get("prompt_tokens")
    if prompt is None and "input_tokens" in usage:
        return int(usage["input_tokens"] or 0), int(usage.get("output_tokens") or 0)
    return int(prompt or 0), int(usage.get("completion_tokens") or 0)


def cached_tokens(usage: dict[str, Any] | None) -> int:
    """The prompt tokens of an answer's usage that the engine's prefix cache held (vLLM's
    `prompt_tokens_details.cached_tokens`, Responses' `input_tokens_details`; the engine
    reports them with --enable-prompt-tokens-details); 0 when it says none."""
    if not usage:
        return 0
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)


# The events that end a Responses stream; the usage is in the response they carry.
RESPONSE_END_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})


class ResponseEvents:
    """What a caller of the engine learns from a Responses stream's events, each passed on
    as the engine wrote it: when its first output came, its usage, and whether it ended (a
    stream cut before its end event is an engine lost, as a chat stream without a finish
    reason is)."""

    def __init__(self) -> None:
        self.first_output = False
        self.ended = False
        self.counts: tuple[int, int] = (0, 0)
        self.cached = 0  # of its prompt tokens, those the engine's prefix cache held

    def read(self, data: bytes) -> dict[str, Any]:
        """Reads one event (its JSON); returns it."""
        event: dict[str, Any] = wire.loads(data)
        kind = event.get("type") or ""
        if kind in RESPONSE_END_EVENTS:
            self.ended = True
            response = event.get("response") or {}
            self.counts = usage_counts(response.get("usage")) or self.counts
            self.cached = cached_tokens(response.get("usage")) or self.cached
        self.first_output = self.first_output or kind.endswith(".delta")
        return event

    @staticmethod
    def is_delta(event: dict[str, Any]) -> int:
        """1 for an event of generated output (a piece of text or of a call's arguments),
        else 0: the tokens it stands for, as the reservation's growth counts them."""
        return 1 if str(event.get("type") or "").endswith(".delta") else 0
