"""OpenAI-compatible inference requests: parsing and validation. Plain Python, no Django.

The platform checks what it must decide on (model, class, token bounds, stream options) and
what would otherwise reach the engine as nonsense; the other fields an endpoint allows
(protocol/fields.py) pass through to vLLM unchanged (temperature, top_p, stop, seed,
logit_bias, ...), and any field it does not allow is refused. Errors name the field, as
OpenAI's do (`param`), so a client sees what to fix.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from plumbing import wire
from protocol.classes import REQUEST_CLASSES
from protocol.fields import field_problem

Endpoint = Literal["chat", "completions", "embeddings", "responses"]
ENDPOINT_PATHS: dict[Endpoint, str] = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "embeddings": "/v1/embeddings",
    "responses": "/v1/responses",
}
# The endpoints that generate tokens (served by `generate` engines); embeddings are served
# by `embed` engines, hold KV for their inputs only, and never stream.
GENERATION_ENDPOINTS: frozenset[Endpoint] = frozenset({"chat", "completions", "responses"})
CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
# Fields that are the platform's, not the engine's: they are removed before forwarding.
PLATFORM_FIELDS = ("request_class", "service_tier")
# OpenAI's service tiers. `flex` and `priority` choose a request class (TIER_CLASSES); the
# others leave the choice to the key's default.
SERVICE_TIERS = ("auto", "default", "flex", "scale", "priority")
# The sequences one request may run (n samples of each of its prompts) unless the caller
# says otherwise (GPUSHARE_MAX_SEQUENCES_PER_REQUEST).
DEFAULT_MAX_SEQUENCES = 64
# Per-message overhead of chat templates (role markers, separators), for the fallback bound.
CHAT_TEMPLATE_OVERHEAD_TOKENS = 8


class InvalidRequest(ValueError):
    """A request the platform refuses as written (HTTP 400)."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


@dataclass(frozen=True)
class InferenceRequest:
    endpoint: Endpoint
    model: str
    body: dict[str, Any]  # what goes to the engine (platform fields removed)
    stream: bool
    include_usage: bool
    max_tokens: int | None  # as asked; None = up to the model's length; 0 = embeddings
    request_class: str | None  # asked in the body; the header or the key decide otherwise
    n: int = 1  # samples of each prompt
    prompts: int = 1  # a completion's prompts (a list of them); a chat has one
    service_tier: str | None = None  # OpenAI's; see TIER_CLASSES

    @property
    def path(self) -> str:
        return ENDPOINT_PATHS[self.endpoint]

    @property
    def sequences(self) -> int:
        """What the engine runs for it: n samples of each prompt, one sequence each."""
        return self.n * self.prompts


def parse_inference_request(
    endpoint: Endpoint,
    body: Any,
    enabled: Collection[str] = (),
    max_sequences: int = DEFAULT_MAX_SEQUENCES,
) -> InferenceRequest:
    """The request as the platform runs it, or InvalidRequest naming the field at fault.
    `enabled`: the optional fields its tenant may send (protocol/fields.py);
    `max_sequences`: the most sequences (n x prompts) it may run."""
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    _check_unicode(body)
    model = body.get("model")
    if not isinstance(model, str) or not model.strip() or "\x00" in model:
        raise InvalidRequest("You must provide a model parameter.", param="model")
    problem = field_problem(endpoint, body, enabled)
    if problem is not None:
        field, message = problem
        raise InvalidRequest(message, param=field)
    if endpoint == "chat":
        _check_messages(body.get("messages"))
        prompts = 1
    elif endpoint == "responses":
        _check_response_input(body)
        prompts = 1
    elif endpoint == "completions":
        prompts = len(_prompt_list(body.get("prompt")))
    else:
        prompts = len(_prompt_list(body.get("input"), "input"))
    n = _samples(body)
    if n * prompts > max_sequences:
        raise InvalidRequest(
            f"This request runs {n * prompts} sequences (n={n} for each of {prompts} "
            f"prompts); the most one request may run is {max_sequences}. Split it, or use "
            "the Batch API.",
            param="n" if prompts == 1 else ("input" if endpoint == "embeddings" else "prompt"),
        )
    max_tokens = _max_tokens(body) if endpoint in GENERATION_ENDPOINTS else 0
    _check_sampling(body)
    stream = _optional_bool(body, "stream") or False
    # A Responses stream always ends with its usage (in `response.completed`), as OpenAI's.
    include_usage = endpoint == "responses" or _include_usage(body, stream)
    request_class = body.get("request_class")
    if request_class is not None and request_class not in REQUEST_CLASSES:
        raise InvalidRequest(
            f"Unknown request_class {request_class!r}; use one of {', '.join(REQUEST_CLASSES)}.",
            param="request_class",
        )
    service_tier = body.get("service_tier")
    if service_tier is not None and service_tier not in SERVICE_TIERS:
        raise InvalidRequest(
            f"Unknown service_tier {service_tier!r}; use one of {', '.join(SERVICE_TIERS)}.",
            param="service_tier",
        )
    forwarded = {k: v for k, v in body.items() if k not in PLATFORM_FIELDS}
    return InferenceRequest(
        endpoint=endpoint,
        model=model,
        body=forwarded,
        stream=stream,
        include_usage=include_usage,
        max_tokens=max_tokens,
        request_class=request_class,
        n=n,
        prompts=prompts,
        service_tier=service_tier,
    )


# The request class a service tier asks for, in order of preference: the first the tenant
# may send wins; none (or a tier not listed) leaves the class to the key's default. `flex`
# is OpenAI's "cheaper, slower, when there is room": offline work, picked while the engines
# have room for it; `priority` is interactive, where allowed (else the default, as OpenAI
# serves a priority request of an account without it).
TIER_CLASSES: dict[str, tuple[str, ...]] = {
    "flex": ("offline", "standard"),
    "priority": ("interactive",),
}


def tier_class(service_tier: str | None, allowed: Collection[str]) -> str | None:
    """The request class a service tier chooses among the classes a tenant may send."""
    for request_class in TIER_CLASSES.get(service_tier or "", ()):
        if request_class in allowed:
            return request_class
    return None


def _check_unicode(body: dict[str, Any]) -> None:
    """JSON may spell a lone UTF-16 surrogate ("\\ud800"), which no UTF-8 text can hold: the
    engine could never be sent it."""
    if wire.holds_lone_surrogate(body):
        raise InvalidRequest("The request holds a lone surrogate; send valid Unicode.")


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty array.", param="messages")
    for i, message in enumerate(messages):
        where = f"messages.[{i}]"
        if not isinstance(message, dict):
            raise InvalidRequest(f"{where} must be an object.", param=where)
        if message.get("role") not in CHAT_ROLES:
            raise InvalidRequest(
                f"{where}.role must be one of {', '.join(sorted(CHAT_ROLES))}.",
                param=f"{where}.role",
            )
        content = message.get("content")
        if content is None and message.get("role") == "assistant":
            continue  # an assistant turn that only called tools
        if not isinstance(content, str | list):
            raise InvalidRequest(
                f"{where}.content must be a string or an array of parts.", param=f"{where}.content"
            )


# A Responses request's input items the platform serves: messages of text, and a function
# tool's call and its output (an agent's loop, sent whole each turn). The other items are
# images and files (the engines serve text), reasoning, or a reference to a kept item.
RESPONSE_ROLES = ("user", "system", "developer", "assistant")
RESPONSE_TEXT_PARTS = frozenset({"input_text", "output_text"})


def _check_response_input(body: dict[str, Any]) -> None:
    """A Responses request's `instructions` and `input`: a string, or an array of items."""
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise InvalidRequest("'instructions' must be a string.", param="instructions")
    items = body.get("input")
    if isinstance(items, str):
        return
    if not isinstance(items, list) or not items:
        raise InvalidRequest(
            "'input' must be a string or a non-empty array of items.", param="input"
        )
    for i, item in enumerate(items):
        where = f"input.[{i}]"
        if not isinstance(item, dict):
            raise InvalidRequest(f"{where} must be an object.", param=where)
        kind = item.get("type", "message")
        if kind == "message":
            _check_response_message(item, where)
        elif kind in ("function_call", "function_call_output"):
            fields = ("call_id", "name", "arguments") if kind == "function_call" else (
                "call_id", "output"
            )  # fmt: skip
            for name in fields:
                if not isinstance(item.get(name), str):
                    raise InvalidRequest(
                        f"{where}.{name} must be a string.", param=f"{where}.{name}"
                    )
        else:
            raise InvalidRequest(
                f"{where}.type {kind!r} is not served here: use messages of text, "
                "function_call and function_call_output items.",
                param=f"{where}.type",
            )


def _check_response_message(item: dict[str, Any], where: str) -> None:
    if item.get("role") not in RESPONSE_ROLES:
        raise InvalidRequest(
            f"{where}.role must be one of {', '.join(RESPONSE_ROLES)}.", param=f"{where}.role"
        )
    content = item.get("content")
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise InvalidRequest(
            f"{where}.content must be a string or an array of text parts.",
            param=f"{where}.content",
        )
    for j, part in enumerate(content):
        at = f"{where}.content.[{j}]"
        if not isinstance(part, dict) or part.get("type") not in RESPONSE_TEXT_PARTS:
            raise InvalidRequest(
                f"{at} must be an input_text or output_text part: the engines here serve text.",
                param=f"{at}.type",
            )
        if not isinstance(part.get("text"), str):
            raise InvalidRequest(f"{at}.text must be a string.", param=f"{at}.text")


def response_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """A Responses request's instructions and input as the chat messages vLLM builds its
    prompt from (vllm/entrypoints/openai/responses/utils.py): the instructions as a system
    message, a string input as a user message, a function call as an assistant's tool call
    (merged into the assistant message before it), its output as a tool message. Where vLLM
    keeps less (an assistant message's first part only), these keep all: counted from them,
    the prompt is never under-counted."""
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": body["instructions"]})
    items = body["input"]
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}]
    for item in items:
        kind = item.get("type", "message")
        last = messages[-1] if messages and messages[-1]["role"] == "assistant" else None
        if kind == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}  # fmt: skip
            if last is not None:
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append(
                {"role": "tool", "content": item["output"], "tool_call_id": item["call_id"]}
            )
        else:
            content = item["content"]
            if not isinstance(content, str):
                content = [{"type": "text", "text": part["text"]} for part in content]
            if item["role"] == "assistant" and last is not None and last["content"] is None:
                last["content"] = content
            else:
                messages.append({"role": item["role"], "content": content})
    return messages


def response_chat_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Responses' flat function tools as chat's, which the chat template renders."""
    return [
        {"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}
        for tool in tools
    ]


def _prompt_list(prompt: Any, param: str = "prompt") -> list[str | list[int]]:
    """A completion's prompts (or an embedding request's inputs), one item each: OpenAI
    takes a string, an array of token ids, or an array of either (lm-evaluation-harness sends
    its batches so)."""
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt:
        if all(_is_token_id(t) for t in prompt):
            return [prompt]
        if all(isinstance(p, str) for p in prompt):
            return list(prompt)
        if all(isinstance(p, list) and p and all(_is_token_id(t) for t in p) for p in prompt):
            return list(prompt)
    raise InvalidRequest(
        f"'{param}' must be a string, an array of token ids, or a non-empty array of strings "
        "or of token id arrays.",
        param=param,
    )


def split_prompts(request: InferenceRequest) -> list[InferenceRequest]:
    """The request as one request per prompt, each counted and bounded alone (a chat, or a
    completion of one prompt as a string or token ids, is itself). Only for counting: the
    engine gets the request whole. An embedding input is counted as a completion's prompt
    (the same tokenizer, special tokens included), with nothing to generate."""
    if request.endpoint == "embeddings":
        return [
            replace(request, endpoint="completions", body={"model": request.model, "prompt": p})
            for p in _prompt_list(request.body["input"], "input")
        ]
    if request.endpoint != "completions":
        return [request]
    prompt = request.body["prompt"]
    prompts = _prompt_list(prompt)
    if len(prompts) == 1 and prompts[0] is prompt:
        return [request]
    return [replace(request, body={**request.body, "prompt": p}, prompts=1) for p in prompts]


def _samples(body: dict[str, Any]) -> int:
    n = body.get("n")
    if n is None:
        return 1
    if not _is_token_id(n) or n < 1:
        raise InvalidRequest("'n' must be a positive integer.", param="n")
    return int(n)


def _is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _max_tokens(body: dict[str, Any]) -> int | None:
    asked: int | None = None
    for field in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
        value = body.get(field)
        if value is None:
            continue
        if not _is_token_id(value) or value < 1:
            raise InvalidRequest(f"'{field}' must be a positive integer.", param=field)
        asked = value if asked is None else min(asked, value)
    return asked


# What an answer's JSON takes per token generated, at most in practice: its text (escaped) and,
# with logprobs, each candidate's entry (its token, its UTF-8 bytes as a list, its logprob);
# and per sequence, the choice around them (docs/SECURITY.md, the answer's size).
ANSWER_TEXT_BYTES_PER_TOKEN = 32
ANSWER_LOGPROB_BYTES = 160
ANSWER_SEQUENCE_BYTES = 1024


def logprob_candidates(request: InferenceRequest) -> int:
    """The logprob entries the answer has per token generated: 0 without logprobs, else the
    sampled token's and its `top_logprobs` (completions: `logprobs` is the count)."""
    body = request.body
    if request.endpoint == "completions":
        asked = body.get("logprobs")
        return 0 if asked is None else 1 + int(asked)
    if request.endpoint == "chat" and body.get("logprobs") is not True:
        return 0
    if request.endpoint == "responses" and body.get("top_logprobs") is None:
        return 0
    return 1 + int(body.get("top_logprobs") or 0)


def answer_bytes_bound(request: InferenceRequest, max_tokens: int) -> int:
    """About the most an answer of `max_tokens` per sequence takes as JSON: a request whose
    bound passes what the platform holds of one answer is refused before it runs, unless it
    is streamed (each chunk then holds a token per sequence)."""
    per_token = ANSWER_TEXT_BYTES_PER_TOKEN + logprob_candidates(request) * ANSWER_LOGPROB_BYTES
    return request.sequences * (ANSWER_SEQUENCE_BYTES + max_tokens * per_token)


def _check_sampling(body: dict[str, Any]) -> None:
    bounds = {"temperature": (0.0, 2.0), "top_p": (0.0, 1.0), "presence_penalty": (-2.0, 2.0),
              "frequency_penalty": (-2.0, 2.0)}  # fmt: skip
    for field, (low, high) in bounds.items():
        value = body.get(field)
        if value is None:
            continue
        if not _is_number(value) or not low <= value <= high:
            raise InvalidRequest(
                f"'{field}' must be a number from {low:g} to {high:g}.", param=field
            )
    seed = body.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise InvalidRequest("'seed' must be an integer.", param="seed")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _optional_bool(body: dict[str, Any], field: str) -> bool | None:
    value = body.get(field)
    if value is not None and not isinstance(value, bool):
        raise InvalidRequest(f"'{field}' must be true or false.", param=field)
    return value


def _include_usage(body: dict[str, Any], stream: bool) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise InvalidRequest(
            "'stream_options' is only allowed when 'stream' is true.", param="stream_options"
        )
    if not isinstance(options, dict):
        raise InvalidRequest("'stream_options' must be an object.", param="stream_options")
    include = options.get("include_usage", False)
    if not isinstance(include, bool):
        raise InvalidRequest(
            "'stream_options.include_usage' must be true or false.",
            param="stream_options.include_usage",
        )
    return include


def prompt_token_bound(request: InferenceRequest) -> int:
    """An upper bound on the prompt's tokens without a tokenizer, used when the engine cannot
    count them: byte-level BPE tokens cover at least one byte each, so the UTF-8 bytes of the
    text as its tokenizer may normalise it (`text_bytes`) bound the text, plus the chat
    template's markers per message."""
    body = request.body
    if request.endpoint == "responses":
        return _response_prompt_bound(body)
    if request.endpoint == "completions":
        prompt = body["prompt"]
        if isinstance(prompt, list) and prompt and _is_token_id(prompt[0]):
            return len(prompt)
        text = prompt if isinstance(prompt, str) else prompt[0]
        return text_bytes(text) + 1
    total = 0
    for message in body["messages"]:
        total += CHAT_TEMPLATE_OVERHEAD_TOKENS + _content_bytes(message.get("content"))
    return total + CHAT_TEMPLATE_OVERHEAD_TOKENS


# Added to the byte bound when it stands in for the engine's count: special tokens (BOS, a
# tokenizer's leading space) and what a chat template adds besides its per-message markers
# (Llama 3's dated system header is ~25 tokens).
BOUND_MARGIN_TOKENS = 64
# Body fields that do not change the prompt the engine builds. Anything else (tools,
# documents, a chat template of the request's own, ...) can add tokens the bound does not
# see, so such a request is counted by the engine.
PROMPT_NEUTRAL_FIELDS = frozenset({
    "model", "messages", "prompt", "max_tokens", "max_completion_tokens", "stream",
    "stream_options", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "ignore_eos",
    "min_tokens", "presence_penalty", "frequency_penalty", "repetition_penalty", "user",
    "logprobs", "top_logprobs", "logit_bias", "response_format", "n",
})  # fmt: skip


# A chat message the byte bound sees whole: its role and its text. Tool calls, a name,
# reasoning and the like go through the chat template too, so a message with them is counted
# by the engine.
PLAIN_MESSAGE_FIELDS = frozenset({"role", "content"})


def bounded_prompt_tokens(request: InferenceRequest, max_model_len: int, limit: int) -> int | None:
    """A safe stand-in for the engine's count of the prompt, or None when only the engine
    can say: the byte bound plus a margin, for short text prompts (bound <= `limit`) of a
    request that asks for `max_tokens` and fits the model's length even counted so. The KV
    reserved is then a little more than needed; the real tokens are charged at the end."""
    if request.max_tokens is None:
        return None
    if request.endpoint != "responses" and not set(request.body) <= PROMPT_NEUTRAL_FIELDS:
        return None  # (a Responses request's bound counts all that enters its prompt)
    if request.endpoint == "chat" and not all(
        set(m) <= PLAIN_MESSAGE_FIELDS and _text_only(m.get("content"))
        for m in request.body["messages"]
    ):
        return None
    bound = prompt_token_bound(request)
    if bound > limit or bound + BOUND_MARGIN_TOKENS + request.max_tokens > max_model_len:
        return None
    return bound + BOUND_MARGIN_TOKENS


def upper_token_estimate(request: InferenceRequest, max_model_len: int) -> int:
    """At least the tokens (prompt and completion) the request can be admitted for, before
    the engine has counted its prompt: for each prompt, its upper bound
    (`reserved_prompt_tokens`) and what each of its n samples asks for, no sample above the
    model's length, which no admitted request passes."""
    asked = request.max_tokens if request.max_tokens is not None else max_model_len
    first = sum(
        min(reserved_prompt_tokens(p) + asked, max_model_len) for p in split_prompts(request)
    )
    return first + (request.n - 1) * request.prompts * min(asked, max_model_len)


def request_tokens(request: InferenceRequest, prompt_tokens: Sequence[int], max_tokens: int) -> int:
    """The most tokens the request can use, its prompts counted: each prompt once (as the
    engine's usage counts it) and `max_tokens` for each of its sequences."""
    return sum(prompt_tokens) + request.sequences * max_tokens


def reserved_prompt_tokens(request: InferenceRequest) -> int:
    """An upper bound on the prompt's tokens for work that is not counted by the engine (batch
    lines): the byte bound plus its margin for a plain request (see `bounded_prompt_tokens`);
    otherwise every byte of whatever can enter the prompt (the messages whole, tool calls,
    names and parts included, and the body's fields that are not prompt-neutral, such as
    tools), as JSON, plus the template's markers per message and the margin."""
    if request.endpoint == "responses":
        return _response_prompt_bound(request.body) + BOUND_MARGIN_TOKENS
    plain = set(request.body) <= PROMPT_NEUTRAL_FIELDS and (
        request.endpoint == "completions"
        or all(
            set(m) <= PLAIN_MESSAGE_FIELDS and _text_only(m.get("content"))
            for m in request.body["messages"]
        )
    )
    if plain:
        return prompt_token_bound(request) + BOUND_MARGIN_TOKENS
    extra = {k: v for k, v in request.body.items() if k not in PROMPT_NEUTRAL_FIELDS}
    if request.endpoint == "completions":
        prompt_bytes = text_bytes(wire.dumps(request.body["prompt"]))
        markers = 0
    else:
        prompt_bytes = text_bytes(wire.dumps(request.body["messages"]))
        markers = CHAT_TEMPLATE_OVERHEAD_TOKENS * (len(request.body["messages"]) + 1)
    return prompt_bytes + text_bytes(wire.dumps(extra)) + markers + BOUND_MARGIN_TOKENS


# A Responses request's fields that do not enter its prompt; the others (input, instructions,
# tools, tool_choice, reasoning, ...) go through the chat template, or may.
RESPONSE_PROMPT_NEUTRAL_FIELDS = frozenset({
    "model", "input", "instructions", "max_output_tokens", "max_tokens", "stream",
    "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "ignore_eos",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "user", "logit_bias",
    "top_logprobs", "store", "background", "metadata", "include", "prompt_cache_key",
    "truncation", "parallel_tool_calls", "text", "skip_special_tokens",
    "include_stop_str_in_output", "priority", "cache_salt",
})  # fmt: skip


def _response_prompt_bound(body: dict[str, Any]) -> int:
    """Every byte of what can enter a Responses request's prompt (its input, as JSON when it
    is a list of items, its instructions, and its fields that are not prompt-neutral, tools
    included, as JSON), plus the template's markers for each message and the answer's."""
    items = body["input"]
    if isinstance(items, str):
        total, messages = text_bytes(items), 1
    else:
        total, messages = text_bytes(wire.dumps(items)), len(items)
    if body.get("instructions"):
        total, messages = total + text_bytes(body["instructions"]), messages + 1
    extra = {k: v for k, v in body.items() if k not in RESPONSE_PROMPT_NEUTRAL_FIELDS}
    if extra:
        total += text_bytes(wire.dumps(extra))
    return total + CHAT_TEMPLATE_OVERHEAD_TOKENS * (messages + 1)


def _text_only(content: Any) -> bool:
    if content is None or isinstance(content, str):
        return True
    return isinstance(content, list) and all(
        isinstance(part, dict) and part.get("type") == "text" for part in content
    )


def _content_bytes(content: Any) -> int:
    if isinstance(content, str):
        return text_bytes(content)
    if isinstance(content, list):
        return sum(
            text_bytes(str(part.get("text", ""))) for part in content if isinstance(part, dict)
        )
    return 0


NORMAL_FORMS: tuple[Literal["NFC", "NFD", "NFKC", "NFKD"], ...] = ("NFC", "NFD", "NFKC", "NFKD")


def text_bytes(text: str) -> int:
    """The most UTF-8 bytes `text` can become before a byte-level tokenizer sees it: its own,
    or those of any Unicode normal form its tokenizer may apply first. Normalising can
    lengthen text: NFC turns U+1D160 (4 bytes) into three code points (12 bytes), NFKC turns
    U+FDFA into 18. ASCII stays as it is."""
    if text.isascii():
        return len(text)
    forms = (unicodedata.normalize(form, text) for form in NORMAL_FORMS)
    return max(len(text.encode("utf-8")), *(len(form.encode("utf-8")) for form in forms))


# The fields of a chat request that change its prompt, which vLLM's /tokenize takes too.
TOKENIZE_CHAT_FIELDS = ("continue_final_message", "chat_template_kwargs", "tools")


def tokenize_request_body(request: InferenceRequest) -> dict[str, Any]:
    """The body of vLLM's `/tokenize` that counts this request's prompt as the engine will:
    for a chat, its messages through the template with everything that enters it (the tool
    definitions, the template's arguments); for a Responses request, the chat messages and
    tools vLLM makes of it (`response_messages`), with the template's arguments its
    reasoning sets."""
    if request.endpoint == "responses":
        body = {"model": request.model, "messages": response_messages(request.body),
                "add_generation_prompt": True}  # fmt: skip
        if request.body.get("tools"):
            body["tools"] = response_chat_tools(request.body["tools"])
        effort = (request.body.get("reasoning") or {}).get("effort")
        if effort is not None:
            body["chat_template_kwargs"] = {
                "reasoning_effort": effort, "enable_thinking": effort != "none"
            }  # fmt: skip
        return body
    if request.endpoint == "chat":
        generation_prompt = request.body.get("add_generation_prompt", True)
        body = {"model": request.model, "messages": request.body["messages"],
                "add_generation_prompt": generation_prompt}  # fmt: skip
        body.update(
            (name, request.body[name])
            for name in TOKENIZE_CHAT_FIELDS
            if request.body.get(name) is not None
        )
        return body
    prompt = request.body["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    return {"model": request.model, "prompt": prompt}
