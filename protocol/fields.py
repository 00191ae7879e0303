"""Which fields an inference request may carry, and their bounds: the engine sees nothing else.

Engines are shared, so a field that changes what one request costs the engine outside its KV
reservation, or that reaches a part of vLLM with a history of engine-killing bugs, is not a
tenant's to send: full-vocabulary prompt logprobs (`prompt_logprobs`, and `echo` with
`logprobs`, on chat and completions), a chat template of the client's (`chat_template`,
`chat_template_kwargs`), vLLM's request plumbing (`kv_transfer_params`, `vllm_xargs`,
`request_id`, `logits_processors`, `mm_processor_kwargs`, `media_io_kwargs`), grammars other
than OpenAI's `response_format` (`structured_outputs`, `guided_*`). Each endpoint has its list
(OpenAI's fields and vLLM's sampling extras); any other field is a 400 that names it, as
OpenAI answers an unknown argument. Sizes are bounded where a field's size is work for the
engine (logit_bias, stop strings, tools, a JSON schema).

The Responses API (`responses`) is served stateless: what would keep a tenant's input or
answer in a shared engine is refused by name (RESPONSES_FIELDS).

`priority` and `cache_salt` are accepted and always replaced: the platform sets them from the
request's class and its tenant (scheduler/engines/calls.py). `model`, `messages`, `prompt`,
the token bounds, the stream's options, `n` and the OpenAI sampling numbers are checked by
`protocol.inference`, which calls `field_problem` first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from typing import Any

from plumbing import wire

# A field's check: None when its value is fine, else what it must be (the error's message).
Check = Callable[[Any], str | None]

MAX_LOGIT_BIAS = 300  # OpenAI's limit
MAX_STOP_CHARS = 1_000
MAX_STOP_TOKEN_IDS = 64
MAX_TOOLS = 128  # OpenAI's limit
MAX_SCHEMA_BYTES = 64 * 1024
MAX_TOP_LOGPROBS = 20  # OpenAI's limit, and vLLM's default max_logprobs
MAX_USER_CHARS = 256


def _any(value: Any) -> str | None:
    return None  # checked by protocol.inference, or replaced by the platform


def _bool(value: Any) -> str | None:
    return None if isinstance(value, bool) else "true or false"


def _int_in(low: int, high: int) -> Check:
    def check(value: Any) -> str | None:
        fine = isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
        return None if fine else f"an integer from {low} to {high}"

    return check


def _number_in(low: float, high: float, *, low_open: bool = False) -> Check:
    def check(value: Any) -> str | None:
        fine = (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and math.isfinite(value)
            and (low < value if low_open else low <= value)
            and value <= high
        )
        opening = "above" if low_open else "from"
        return None if fine else f"a number {opening} {low:g} to {high:g}"

    return check


def _one_of(*choices: str) -> Check:
    def check(value: Any) -> str | None:
        return None if value in choices else f"one of {', '.join(choices)}"

    return check


def _text(max_chars: int) -> Check:
    def check(value: Any) -> str | None:
        fine = isinstance(value, str) and len(value) <= max_chars
        return None if fine else f"a string of at most {max_chars} characters"

    return check


def _label(max_chars: int) -> Check:
    """A name the ledger keeps (OpenAI's `user`): text without control characters. A NUL is
    text no PostgreSQL column holds, and would stop the ledger's batched writes."""

    def check(value: Any) -> str | None:
        fine = isinstance(value, str) and len(value) <= max_chars
        fine = fine and not any(ord(c) < 32 or c == "\x7f" for c in value)
        return None if fine else f"a string of at most {max_chars} characters, none a control"

    return check


def _stop(value: Any) -> str | None:
    texts = [value] if isinstance(value, str) else value
    fine = (
        isinstance(texts, list)
        and len(texts) <= 4
        and all(isinstance(t, str) and len(t) <= MAX_STOP_CHARS for t in texts)
    )
    return None if fine else f"a string or up to 4 strings of at most {MAX_STOP_CHARS} characters"


def _logit_bias(value: Any) -> str | None:
    fine = (
        isinstance(value, dict)
        and len(value) <= MAX_LOGIT_BIAS
        and all(str(k).isdigit() and _number_in(-100, 100)(v) is None for k, v in value.items())
    )
    return None if fine else f"an object of at most {MAX_LOGIT_BIAS} token ids, each -100 to 100"


def _token_ids(value: Any) -> str | None:
    fine = (
        isinstance(value, list)
        and len(value) <= MAX_STOP_TOKEN_IDS
        and all(_int_in(0, 2**31 - 1)(v) is None for v in value)
    )
    return None if fine else f"an array of at most {MAX_STOP_TOKEN_IDS} token ids"


def _tools(value: Any) -> str | None:
    fine = isinstance(value, list) and len(value) <= MAX_TOOLS
    fine = fine and all(isinstance(t, dict) and t.get("type") == "function" for t in value)
    return None if fine else f"an array of at most {MAX_TOOLS} function tools"


def _tool_choice(value: Any) -> str | None:
    fine = value in ("none", "auto", "required") or (
        isinstance(value, dict) and value.get("type") == "function"
    )
    return None if fine else "none, auto, required or a function"


def _response_format(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind in ("text", "json_object"):
        return None
    if kind == "json_schema" and len(wire.dumps_bytes(value)) <= MAX_SCHEMA_BYTES:
        return None
    return f"text, json_object or a json_schema of at most {MAX_SCHEMA_BYTES // 1024} KiB"


def _stream_options(value: Any) -> str | None:
    # Its type and include_usage's are protocol.inference's to check; only the keys here.
    extra = isinstance(value, dict) and not set(value) <= {"include_usage"}
    return "an object with include_usage only" if extra else None


# Both endpoints: OpenAI's fields, vLLM's sampling extras, and the platform's own.
COMMON_FIELDS: dict[str, Check] = {
    "model": _any, "max_tokens": _any, "n": _any, "stream": _any, "stream_options":
    _stream_options, "temperature": _any, "top_p": _any, "presence_penalty": _any,
    "frequency_penalty": _any, "seed": _any, "stop": _stop, "user": _label(MAX_USER_CHARS),
    "logit_bias": _logit_bias, "request_class": _any, "service_tier": _any,
    # vLLM's sampling extras that cost nothing outside the request's own KV.
    "top_k": _int_in(-1, 1_000_000), "min_p": _number_in(0, 1),
    "repetition_penalty": _number_in(0, 2, low_open=True), "ignore_eos": _bool,
    "min_tokens": _int_in(0, 2**31 - 1), "stop_token_ids": _token_ids,
    "skip_special_tokens": _bool, "spaces_between_special_tokens": _bool,
    "include_stop_str_in_output": _bool,
    # Replaced by the platform whatever the client sends.
    "priority": _any, "cache_salt": _any,
}  # fmt: skip

CHAT_FIELDS: dict[str, Check] = COMMON_FIELDS | {
    "messages": _any, "max_completion_tokens": _any, "logprobs": _bool,
    "top_logprobs": _int_in(0, MAX_TOP_LOGPROBS), "response_format": _response_format,
    "tools": _tools, "tool_choice": _tool_choice, "parallel_tool_calls": _bool,
    "add_generation_prompt": _bool, "continue_final_message": _bool, "echo": _bool,
}  # fmt: skip

COMPLETIONS_FIELDS: dict[str, Check] = COMMON_FIELDS | {
    "prompt": _any, "logprobs": _int_in(0, MAX_TOP_LOGPROBS), "echo": _bool,
    "best_of": _int_in(1, 1), "response_format": _response_format,
}  # fmt: skip

MAX_METADATA_PAIRS = 16  # OpenAI's limit
# What a Responses request may ask to have included: nothing the engine keeps or a server-side
# tool makes (file_search results, code_interpreter outputs).
RESPONSE_INCLUDES = frozenset({"message.output_text.logprobs", "reasoning.encrypted_content"})
STATELESS = "this platform is stateless: it keeps no response, send the whole conversation as "
STATELESS += "'input'"


def _refused(why: str) -> Check:
    def check(value: Any) -> str | None:
        return why

    return check


def _false(value: Any) -> str | None:
    return None if value is False else f"false ({STATELESS})"


def _response_tools(value: Any) -> str | None:
    # Responses' function tools are flat: {"type": "function", "name": ..., "parameters": ...}.
    fine = isinstance(value, list) and len(value) <= MAX_TOOLS
    fine = fine and all(isinstance(t, dict) and t.get("type") == "function" for t in value)
    fine = fine and len(wire.dumps_bytes(value)) <= MAX_SCHEMA_BYTES * 4
    if fine:
        return None
    return (
        f"an array of at most {MAX_TOOLS} function tools (web_search, file_search, "
        "code_interpreter, mcp and the other tools a server runs are not served here)"
    )


def _text_config(value: Any) -> str | None:
    fine = isinstance(value, dict) and set(value) <= {"format", "verbosity"}
    fine = fine and (value.get("format") is None or _response_format(value["format"]) is None)
    return None if fine else "an object with a text, json_object or json_schema format"


def _truncation(value: Any) -> str | None:
    return None if value in ("auto", "disabled") else "auto or disabled"


def _include(value: Any) -> str | None:
    fine = isinstance(value, list) and all(v in RESPONSE_INCLUDES for v in value)
    return None if fine else f"an array of {' or '.join(sorted(RESPONSE_INCLUDES))}"


def _reasoning(value: Any) -> str | None:
    fine = isinstance(value, dict) and set(value) <= {"effort", "summary", "generate_summary"}
    fine = fine and all(v is None or (isinstance(v, str) and len(v) <= 32) for v in value.values())
    return None if fine else "an object with effort and summary"


def _metadata(value: Any) -> str | None:
    fine = isinstance(value, dict) and len(value) <= MAX_METADATA_PAIRS
    fine = fine and all(
        len(k) <= 64 and isinstance(v, str) and len(v) <= 512 for k, v in value.items()
    )
    return None if fine else f"an object of at most {MAX_METADATA_PAIRS} short strings"


# The Responses API, served stateless: the engines are shared, so nothing a tenant sends is
# kept in one for anybody to fetch. `store` is accepted and always sent as false
# (scheduler/engines/calls.py); what needs a kept response (previous_response_id, a
# conversation, background mode) and the tools a server runs are refused.
RESPONSES_FIELDS: dict[str, Check] = {
    "model": _any, "input": _any, "instructions": _any, "max_output_tokens": _any,
    "stream": _any, "temperature": _any, "top_p": _any, "presence_penalty": _any,
    "frequency_penalty": _any, "seed": _any, "user": _label(MAX_USER_CHARS),
    "logit_bias": _logit_bias, "request_class": _any, "service_tier": _any,
    "top_logprobs": _int_in(0, MAX_TOP_LOGPROBS), "tools": _response_tools,
    "tool_choice": _tool_choice, "parallel_tool_calls": _bool, "text": _text_config,
    "truncation": _truncation, "include": _include, "reasoning": _reasoning,
    "metadata": _metadata, "prompt_cache_key": _text(MAX_USER_CHARS), "store": _bool,
    "background": _false, "previous_response_id": _refused(f"null: {STATELESS}"),
    "conversation": _refused(f"null: {STATELESS}"),
    # vLLM's sampling extras that cost nothing outside the request's own KV.
    "top_k": _int_in(-1, 1_000_000), "min_p": _number_in(0, 1),
    "repetition_penalty": _number_in(0, 2, low_open=True), "ignore_eos": _bool,
    "stop": _stop, "stop_token_ids": _token_ids, "skip_special_tokens": _bool,
    "include_stop_str_in_output": _bool,
    # Replaced by the platform whatever the client sends.
    "priority": _any, "cache_salt": _any,
}  # fmt: skip

# Embeddings: OpenAI's fields (no sampling: nothing is generated) and the platform's own.
EMBEDDINGS_FIELDS: dict[str, Check] = {
    "model": _any, "input": _any, "user": _label(MAX_USER_CHARS), "encoding_format": _one_of(
    "float", "base64"), "dimensions": _int_in(1, 1_000_000), "request_class": _any,
    "service_tier": _any, "priority": _any, "cache_salt": _any,
}  # fmt: skip

FIELDS: Mapping[str, Mapping[str, Check]] = {
    "chat": CHAT_FIELDS, "completions": COMPLETIONS_FIELDS, "embeddings": EMBEDDINGS_FIELDS,
    "responses": RESPONSES_FIELDS,
}  # fmt: skip


def _object_of(max_bytes: int) -> Check:
    def check(value: Any) -> str | None:
        fine = isinstance(value, dict) and len(wire.dumps_bytes(value)) <= max_bytes
        return None if fine else f"an object of at most {max_bytes // 1024} KiB"

    return check


# What an operator may enable for one tenant (Tenant.enabled_fields), knowing what it costs
# the engine everyone shares: the prompt's logprobs (full-vocabulary logits for every prompt
# token, outside the KV reservation), vLLM's own grammars, arguments to the chat template.
OPTIONAL_FIELDS: dict[str, Check] = {
    "prompt_logprobs": _int_in(0, MAX_TOP_LOGPROBS),
    "structured_outputs": _object_of(MAX_SCHEMA_BYTES),
    "chat_template_kwargs": _object_of(4 * 1024),
}


# The endpoints whose requests may carry a tenant's enabled OPTIONAL_FIELDS (the others'
# engines ignore them, or would build a prompt the reservation did not count).
OPTIONAL_FIELD_ENDPOINTS = frozenset({"chat", "completions"})


def field_problem(
    endpoint: str, body: Mapping[str, Any], enabled: Collection[str] = ()
) -> tuple[str, str] | None:
    """The first field the request may not carry as it is: (field, message); None if none.
    `enabled`: the OPTIONAL_FIELDS its tenant may send."""
    allowed = FIELDS[endpoint]
    for name, value in body.items():
        check = allowed.get(name)
        if check is None and name in enabled and endpoint in OPTIONAL_FIELD_ENDPOINTS:
            check = OPTIONAL_FIELDS.get(name)
        if check is None:
            return name, f"Unrecognized request argument supplied: {name}"
        if value is None:
            continue  # as if absent, as OpenAI takes a null
        must = check(value)
        if must is not None:
            return name, f"'{name}' must be {must}."
    if "prompt_logprobs" not in enabled and body.get("echo") and _asks_logprobs(endpoint, body):
        # The prompt's logprobs: the engine computes them over the whole vocabulary for every
        # prompt token, outside any KV reservation.
        return "echo", "'echo' cannot be combined with 'logprobs' on this platform."
    return None


def _asks_logprobs(endpoint: str, body: Mapping[str, Any]) -> bool:
    """Whether the request asks for logprobs: on completions a number (0 included), on chat
    `true`; with `echo`, either makes the engine compute the prompt's logprobs too."""
    if endpoint == "completions":
        return body.get("logprobs") is not None
    return endpoint == "chat" and body.get("logprobs") is True
