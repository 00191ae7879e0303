"""The inference endpoints (`/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`,
`/v1/responses`) in the OpenAPI schema (`/api/schema/`).

These paths are served by the lean ASGI app (`api.inference.inference_app`), not by a
DRF view, so drf-spectacular does not see them: this postprocessing hook (SPECTACULAR_SETTINGS)
adds them. Their request bodies list exactly the fields the platform allows, read from
`protocol.fields` when the schema is made; `_FIELD_SCHEMAS` only gives those fields
a type and a line of description (a field without an entry is described as free-form).
"""

from __future__ import annotations

from typing import Any

from api.auth_schema import TenantKeyScheme, bearer_scheme
from protocol.classes import REQUEST_CLASSES
from protocol.fields import (
    FIELDS,
    MAX_TOP_LOGPROBS,
    OPTIONAL_FIELD_ENDPOINTS,
    OPTIONAL_FIELDS,
)
from protocol.inference import ENDPOINT_PATHS, Endpoint

Schema = dict[str, Any]

_STRING: Schema = {"type": "string"}
_INTEGER: Schema = {"type": "integer"}
_NUMBER: Schema = {"type": "number"}
_BOOLEAN: Schema = {"type": "boolean"}
_OBJECT: Schema = {"type": "object", "additionalProperties": True}
_STRINGS: Schema = {"oneOf": [_STRING, {"type": "array", "items": _STRING}]}
_TOKEN_IDS: Schema = {"type": "array", "items": _INTEGER}
# A text or token ids, or a non-empty array of either: a completion's prompt, an embedding's input.
_TEXTS_OR_TOKEN_IDS: list[Schema] = [
    _STRING,
    _TOKEN_IDS,
    {"type": "array", "items": _STRING, "minItems": 1},
    {"type": "array", "items": _TOKEN_IDS, "minItems": 1},
]

_CLASS_TEXT = (
    "The request's class (its share of the engines and its queue timeout). The "
    "`X-Request-Class` header, where sent, takes precedence; without either, the key's "
    "default class. The tenant must be allowed the class (403 otherwise)."
)

# Types of the allowed fields, by endpoint where they differ (None: both endpoints).
_FIELD_SCHEMAS: dict[tuple[Endpoint | None, str], Schema] = {
    (None, "model"): {**_STRING, "description": "A model of `GET /v1/models`."},
    (None, "max_tokens"): {**_INTEGER, "minimum": 1, "nullable": True},
    (None, "n"): {
        **_INTEGER,
        "minimum": 1,
        "nullable": True,
        "description": "Samples of each prompt; n x prompts is at most the platform's "
        "GPUSHARE_MAX_SEQUENCES_PER_REQUEST.",
    },
    (None, "service_tier"): {
        **_STRING,
        "enum": ["auto", "default", "flex", "scale", "priority"],
        "description": "flex: the offline class (standard where not allowed); priority: "
        "interactive where allowed; otherwise the key's default. Never sent to the engine.",
    },
    (None, "stream"): {
        **_BOOLEAN,
        "description": "true: the answer is `text/event-stream`, ending `data: [DONE]`.",
    },
    (None, "stream_options"): {
        "type": "object",
        "properties": {"include_usage": _BOOLEAN},
        "additionalProperties": False,
    },
    (None, "temperature"): {**_NUMBER, "minimum": 0, "maximum": 2},
    (None, "top_p"): {**_NUMBER, "minimum": 0, "maximum": 1},
    (None, "presence_penalty"): {**_NUMBER, "minimum": -2, "maximum": 2},
    (None, "frequency_penalty"): {**_NUMBER, "minimum": -2, "maximum": 2},
    (None, "seed"): _INTEGER,
    (None, "stop"): _STRINGS,
    (None, "user"): _STRING,
    (None, "logit_bias"): {"type": "object", "additionalProperties": _NUMBER},
    (None, "request_class"): {**_STRING, "enum": list(REQUEST_CLASSES), "description": _CLASS_TEXT},
    (None, "top_k"): _INTEGER,
    (None, "min_p"): {**_NUMBER, "minimum": 0, "maximum": 1},
    (None, "repetition_penalty"): _NUMBER,
    (None, "ignore_eos"): _BOOLEAN,
    (None, "min_tokens"): {**_INTEGER, "minimum": 0},
    (None, "stop_token_ids"): _TOKEN_IDS,
    (None, "skip_special_tokens"): _BOOLEAN,
    (None, "spaces_between_special_tokens"): _BOOLEAN,
    (None, "include_stop_str_in_output"): _BOOLEAN,
    (None, "priority"): {**_INTEGER, "description": "Replaced by the platform (the class's)."},
    (None, "cache_salt"): {**_STRING, "description": "Replaced by the platform (the tenant's)."},
    (None, "response_format"): {
        "type": "object",
        "properties": {"type": {**_STRING, "enum": ["text", "json_object", "json_schema"]}},
        "required": ["type"],
        "additionalProperties": True,
    },
    (None, "echo"): _BOOLEAN,
    (None, "prompt_logprobs"): {**_INTEGER, "minimum": 0, "maximum": MAX_TOP_LOGPROBS},
    (None, "structured_outputs"): _OBJECT,
    (None, "chat_template_kwargs"): _OBJECT,
    ("chat", "messages"): {
        "type": "array",
        "minItems": 1,
        "items": {
            "type": "object",
            "properties": {
                "role": {
                    **_STRING,
                    "enum": ["system", "developer", "user", "assistant", "tool", "function"],
                },
                "content": {"oneOf": [_STRING, {"type": "array", "items": _OBJECT}]},
            },
            "required": ["role"],
            "additionalProperties": True,
        },
    },
    ("chat", "max_completion_tokens"): {**_INTEGER, "minimum": 1, "nullable": True},
    ("chat", "logprobs"): _BOOLEAN,
    ("chat", "top_logprobs"): {**_INTEGER, "minimum": 0, "maximum": MAX_TOP_LOGPROBS},
    ("chat", "tools"): {"type": "array", "items": _OBJECT},
    ("chat", "tool_choice"): {
        "oneOf": [{**_STRING, "enum": ["none", "auto", "required"]}, _OBJECT]
    },
    ("chat", "parallel_tool_calls"): _BOOLEAN,
    ("chat", "add_generation_prompt"): _BOOLEAN,
    ("chat", "continue_final_message"): _BOOLEAN,
    ("completions", "prompt"): {
        "oneOf": _TEXTS_OR_TOKEN_IDS,
        "description": "A prompt (a string or an array of token ids), or an array of them.",
    },
    ("embeddings", "input"): {
        "oneOf": _TEXTS_OR_TOKEN_IDS,
        "description": "A text (a string or an array of token ids), or an array of them.",
    },
    ("embeddings", "encoding_format"): {**_STRING, "enum": ["float", "base64"]},
    ("embeddings", "dimensions"): {**_INTEGER, "minimum": 1},
    ("responses", "input"): {
        "oneOf": [_STRING, {"type": "array", "items": _OBJECT, "minItems": 1}],
        "description": "A string, or messages of text, function calls and their outputs: the "
        "whole conversation (the platform keeps no response).",
    },
    ("responses", "instructions"): _STRING,
    ("responses", "max_output_tokens"): {**_INTEGER, "minimum": 1, "nullable": True},
    ("responses", "store"): {**_BOOLEAN, "description": "Always sent to the engine as false."},
    ("completions", "logprobs"): {**_INTEGER, "minimum": 0, "maximum": MAX_TOP_LOGPROBS},
    ("completions", "best_of"): {**_INTEGER, "minimum": 1, "maximum": 1},
}

_FREE_FORM: Schema = {"description": "Passed to the engine as sent."}
_OPTIONAL_TEXT = "Refused (400) unless the operator enabled it for the tenant."
_REQUIRED: dict[Endpoint, list[str]] = {
    "chat": ["model", "messages"],
    "completions": ["model", "prompt"],
    "embeddings": ["model", "input"],
    "responses": ["model", "input"],
}
_TITLES: dict[Endpoint, str] = {
    "chat": "ChatCompletion", "completions": "Completion", "embeddings": "Embeddings",
    "responses": "Response",
}  # fmt: skip
_SUMMARIES: dict[Endpoint, str] = {
    "chat": "Create a chat completion", "completions": "Create a completion",
    "embeddings": "Create embeddings", "responses": "Create a response (stateless)",
}  # fmt: skip


def _field_schema(endpoint: Endpoint, name: str) -> Schema:
    schema = _FIELD_SCHEMAS.get((endpoint, name)) or _FIELD_SCHEMAS.get((None, name))
    return dict(schema or _FREE_FORM)


def request_schema(endpoint: Endpoint) -> Schema:
    """The endpoint's request body: the fields `protocol.fields` allows it, and
    nothing else (another field is a 400 that names it)."""
    properties = {name: _field_schema(endpoint, name) for name in FIELDS[endpoint]}
    for name in OPTIONAL_FIELDS if endpoint in OPTIONAL_FIELD_ENDPOINTS else ():
        schema = properties.setdefault(name, _field_schema(endpoint, name))
        schema["description"] = " ".join(filter(None, (schema.get("description"), _OPTIONAL_TEXT)))
    return {
        "type": "object",
        "properties": properties,
        "required": _REQUIRED[endpoint],
        "additionalProperties": False,
    }


_USAGE: Schema = {
    "type": "object",
    "properties": {
        "prompt_tokens": _INTEGER,
        "completion_tokens": _INTEGER,
        "total_tokens": _INTEGER,
    },
}
_CHOICE: dict[Endpoint, Schema] = {
    "chat": {
        "type": "object",
        "properties": {
            "index": _INTEGER,
            "message": {
                "type": "object",
                "properties": {"role": _STRING, "content": {**_STRING, "nullable": True}},
                "additionalProperties": True,
            },
            "finish_reason": {**_STRING, "nullable": True},
            "logprobs": {**_OBJECT, "nullable": True},
        },
        "additionalProperties": True,
    },
    "completions": {
        "type": "object",
        "properties": {
            "index": _INTEGER,
            "text": _STRING,
            "finish_reason": {**_STRING, "nullable": True},
            "logprobs": {**_OBJECT, "nullable": True},
        },
        "additionalProperties": True,
    },
}
_OBJECT_NAMES: dict[Endpoint, str] = {"chat": "chat.completion", "completions": "text_completion"}
_EMBEDDINGS: Schema = {
    "type": "object",
    "properties": {
        "object": {**_STRING, "enum": ["list"]},
        "model": _STRING,
        "data": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "index": _INTEGER,
                    "object": {**_STRING, "enum": ["embedding"]},
                    "embedding": {"oneOf": [{"type": "array", "items": _NUMBER}, _STRING]},
                },
            },
        },
        "usage": {"$ref": "#/components/schemas/OpenAIUsage"},
    },
    "required": ["object", "model", "data"],
    "additionalProperties": True,
}
_RESPONSE: Schema = {
    "type": "object",
    "properties": {
        "id": _STRING,
        "object": {**_STRING, "enum": ["response"]},
        "created_at": _NUMBER,
        "model": _STRING,
        "status": _STRING,
        "output": {"type": "array", "items": _OBJECT},
        "usage": {
            "type": "object",
            "properties": {
                "input_tokens": _INTEGER,
                "output_tokens": _INTEGER,
                "total_tokens": _INTEGER,
            },
            "additionalProperties": True,
        },
    },
    "required": ["id", "object", "model", "output"],
    "additionalProperties": True,
}


def _answer_schema(endpoint: Endpoint) -> Schema:
    if endpoint == "embeddings":
        return _EMBEDDINGS
    if endpoint == "responses":
        return _RESPONSE
    return {
        "type": "object",
        "properties": {
            "id": _STRING,
            "object": {**_STRING, "enum": [_OBJECT_NAMES[endpoint]]},
            "created": _INTEGER,
            "model": _STRING,
            "choices": {"type": "array", "items": _CHOICE[endpoint]},
            "usage": {"$ref": "#/components/schemas/OpenAIUsage"},
        },
        "required": ["id", "object", "created", "model", "choices"],
        "additionalProperties": True,
    }


ERROR_SCHEMA: Schema = {
    "type": "object",
    "description": "OpenAI's error shape.",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": _STRING,
                "type": _STRING,
                "code": {**_STRING, "nullable": True},
                "param": {**_STRING, "nullable": True},
            },
            "required": ["message", "type", "code", "param"],
        }
    },
    "required": ["error"],
}

_REQUEST_ID_HEADER: Schema = {
    "description": (
        "The request's id: for a request that was queued, its job id, which its ledger row "
        "(the console's 'Find a request') and the platform's log lines carry too."
    ),
    "schema": _STRING,
}
_RETRY_AFTER: Schema = {"description": "Seconds to wait before retrying.", "schema": _INTEGER}

# The refusals either endpoint answers, each in OpenAI's error shape.
_ERRORS: dict[str, str] = {
    "400": "Malformed JSON, a field not allowed or out of bounds, `context_length_exceeded`.",
    "401": "A missing, unknown or revoked key.",
    "403": "The tenant may not use this model or request class.",
    "404": "No such model.",
    "405": "A method other than POST.",
    "413": "The body is larger than the platform accepts.",
    "429": "Rate limit, token budget, or a request larger than the tenant's quota and burst.",
    "503": "Queue timeout, no ready engine, or the queue or database not answering.",
}
_ERRORS_WITH_RETRY_AFTER = frozenset({"429", "503"})

_STREAM_TEXT = (
    "With `stream: true`: server-sent events, each `data: {chunk}` (OpenAI's chunk objects), "
    "ending `data: [DONE]`. An error after the stream started is a last `data:` event in "
    "OpenAI's error shape before `data: [DONE]`."
)
_RESPONSE_STREAM_TEXT = (
    "With `stream: true`: server-sent events, each `event: <type>` with its `data: {event}`, "
    "as OpenAI's Responses stream, ending with `response.completed` (its usage inside)."
)


def _headers(status: str) -> Schema:
    headers: Schema = {"X-Request-Id": {"$ref": "#/components/headers/XRequestId"}}
    if status in _ERRORS_WITH_RETRY_AFTER:
        headers["Retry-After"] = _RETRY_AFTER
    return headers


def _answer_content(endpoint: Endpoint, title: str) -> Schema:
    content: Schema = {"application/json": {"schema": {"$ref": f"#/components/schemas/{title}"}}}
    if endpoint != "embeddings":  # embeddings never stream
        text = _RESPONSE_STREAM_TEXT if endpoint == "responses" else _STREAM_TEXT
        content["text/event-stream"] = {"schema": {**_STRING, "description": text}}
    return content


def _operation(endpoint: Endpoint) -> Schema:
    title = _TITLES[endpoint]
    errors = {
        status: {
            "description": text,
            "headers": _headers(status),
            "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/OpenAIError"}}
            },
        }
        for status, text in _ERRORS.items()
    }
    return {
        "operationId": f"v1_{endpoint}_create",
        "summary": _SUMMARIES[endpoint],
        "description": (
            "OpenAI-compatible. The request waits in the fair queue for its tenant's share, "
            "then runs on an engine of the model."
        ),
        "tags": ["v1"],
        "security": [{TenantKeyScheme.name: []}],
        "parameters": [
            {
                "in": "header",
                "name": "X-Request-Class",
                "required": False,
                "schema": {**_STRING, "enum": list(REQUEST_CLASSES)},
                "description": _CLASS_TEXT,
            }
        ],
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": f"#/components/schemas/{title}Request"}}
            },
        },
        "responses": {
            "200": {
                "description": "The answer: whole, or streamed.",
                "headers": _headers("200"),
                "content": _answer_content(endpoint, title),
            },
            **errors,
        },
    }


def add_inference_paths(result: Schema, **kwargs: Any) -> Schema:
    """drf-spectacular postprocessing hook: the inference paths, their components, and
    the tenant key's security scheme (also present when no DRF view named it)."""
    components = result.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    schemas["OpenAIError"] = ERROR_SCHEMA
    schemas["OpenAIUsage"] = _USAGE
    for endpoint, title in _TITLES.items():
        schemas[f"{title}Request"] = request_schema(endpoint)
        schemas[title] = _answer_schema(endpoint)
    components.setdefault("headers", {})["XRequestId"] = _REQUEST_ID_HEADER
    components.setdefault("securitySchemes", {}).setdefault(TenantKeyScheme.name, bearer_scheme())
    paths = result.setdefault("paths", {})
    for endpoint, path in ENDPOINT_PATHS.items():
        paths[path] = {"post": _operation(endpoint)}
    result["paths"] = dict(sorted(paths.items()))
    result["components"]["schemas"] = dict(sorted(schemas.items()))
    return result
