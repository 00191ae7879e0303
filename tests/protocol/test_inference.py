"""Parsing and validation of OpenAI-compatible inference requests (pure: no services)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.inference import (
    BOUND_MARGIN_TOKENS,
    Endpoint,
    InvalidRequest,
    bounded_prompt_tokens,
    parse_inference_request,
    prompt_token_bound,
    request_tokens,
    split_prompts,
    tier_class,
    tokenize_request_body,
    upper_token_estimate,
)

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_a_chat_request_keeps_the_engines_fields_and_drops_the_platforms():
    request = parse_inference_request(
        "chat", {**CHAT, "temperature": 0.2, "seed": 7, "request_class": "interactive"}
    )
    assert request.body == {**CHAT, "temperature": 0.2, "seed": 7}
    assert request.request_class == "interactive"
    assert request.max_tokens is None
    assert request.path == "/v1/chat/completions"


def test_max_completion_tokens_and_max_tokens_take_the_smaller():
    request = parse_inference_request(
        "chat", {**CHAT, "max_tokens": 50, "max_completion_tokens": 20}
    )
    assert request.max_tokens == 20


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ([], None),
        ({"messages": CHAT["messages"]}, "model"),
        ({"model": "m", "messages": []}, "messages"),
        ({"model": "m", "messages": ["hi"]}, "messages.[0]"),
        ({"model": "m", "messages": [{"role": "robot", "content": "x"}]}, "messages.[0].role"),
        ({"model": "m", "messages": [{"role": "user", "content": 3}]}, "messages.[0].content"),
        ({**CHAT, "max_tokens": 0}, "max_tokens"),
        ({**CHAT, "max_tokens": -5}, "max_tokens"),
        ({**CHAT, "max_tokens": "10"}, "max_tokens"),
        ({**CHAT, "max_tokens": True}, "max_tokens"),
        ({**CHAT, "temperature": 3}, "temperature"),
        ({**CHAT, "temperature": float("nan")}, "temperature"),
        ({**CHAT, "top_p": "high"}, "top_p"),
        ({**CHAT, "n": 0}, "n"),
        ({**CHAT, "n": 1.5}, "n"),
        ({**CHAT, "n": 65}, "n"),
        ({**CHAT, "service_tier": "gold"}, "service_tier"),
        ({**CHAT, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({**CHAT, "seed": 1.5}, "seed"),
        ({**CHAT, "stream": "yes"}, "stream"),
        ({**CHAT, "stream_options": {"include_usage": True}}, "stream_options"),
        ({**CHAT, "stream": True, "stream_options": {"include_usage": 1}},
         "stream_options.include_usage"),
        ({**CHAT, "request_class": "urgent"}, "request_class"),
    ],
)  # fmt: skip
def test_bad_chat_fields_are_refused_naming_the_field(body, param):
    with pytest.raises(InvalidRequest) as caught:
        parse_inference_request("chat", body)
    assert caught.value.param == param


@pytest.mark.parametrize(
    ("prompt", "count"),
    [("text", 1), (["text"], 1), ([1, 2, 3], 1), (["a", "b"], 2), ([[1, 2], [3]], 2), ([[1]], 1)],
)
def test_completions_take_a_prompt_or_a_list_of_them(prompt, count):
    request = parse_inference_request("completions", {"model": "m", "prompt": prompt, "n": 3})
    assert request.body["prompt"] == prompt  # the engine gets the list whole
    assert (request.prompts, request.n, request.sequences) == (count, 3, 3 * count)
    parts = split_prompts(request)
    assert len(parts) == count
    assert all(isinstance(part.body["prompt"], str | list) for part in parts)
    assert all(prompt_token_bound(part) >= 1 for part in parts)


@pytest.mark.parametrize("prompt", [None, 5, [], [1, "a"], [-1], ["a", [1]], [[]], [[1], []]])
def test_completions_refuse_other_prompts(prompt):
    with pytest.raises(InvalidRequest) as caught:
        parse_inference_request("completions", {"model": "m", "prompt": prompt})
    assert caught.value.param == "prompt"


def test_stream_options_are_read_when_streaming():
    request = parse_inference_request(
        "chat", {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    )
    assert (request.stream, request.include_usage) == (True, True)


@given(st.text(max_size=200))
def test_the_byte_bound_is_never_below_the_text_length(text):
    request = parse_inference_request("completions", {"model": "m", "prompt": text})
    # Byte-level BPE: every token covers at least one byte, so bytes bound the tokens.
    assert prompt_token_bound(request) >= len(text.encode("utf-8"))


def test_the_chat_bound_counts_every_message_and_the_template():
    two = {"model": "m", "messages": [{"role": "user", "content": "ab"}] * 2}
    assert prompt_token_bound(parse_inference_request("chat", two)) == 2 * (8 + 2) + 8


def test_tokenize_asks_for_the_generation_prompt_of_a_chat():
    body = tokenize_request_body(parse_inference_request("chat", CHAT))
    assert body == {"model": "m", "messages": CHAT["messages"], "add_generation_prompt": True}
    single = parse_inference_request("completions", {"model": "m", "prompt": ["only"]})
    assert tokenize_request_body(single) == {"model": "m", "prompt": "only"}


def test_tokenize_counts_everything_that_enters_a_chats_prompt():
    tools = [{"type": "function", "function": {"name": "f", "description": "x" * 500}}]
    extra = {"tools": tools, "continue_final_message": True, "add_generation_prompt": False,
             "chat_template_kwargs": {"enable_thinking": False}, "temperature": 0.5}  # fmt: skip
    request = parse_inference_request("chat", {**CHAT, **extra}, ["chat_template_kwargs"])
    assert tokenize_request_body(request) == {
        "model": "m", "messages": CHAT["messages"], "add_generation_prompt": False,
        "continue_final_message": True, "chat_template_kwargs": {"enable_thinking": False},
        "tools": tools,
    }  # fmt: skip


def bounded(body: dict, endpoint: str = "chat", max_model_len: int = 2048, limit: int = 1024):
    request = parse_inference_request(endpoint, body)  # type: ignore[arg-type]
    return bounded_prompt_tokens(request, max_model_len, limit)


def test_a_short_prompt_with_max_tokens_is_counted_by_its_bound_plus_a_margin():
    body = {**CHAT, "max_tokens": 16, "temperature": 0.5}
    assert bounded(body) == 8 + 2 + 8 + BOUND_MARGIN_TOKENS
    assert bounded({"model": "m", "prompt": "hello", "max_tokens": 4}, "completions") == (
        5 + 1 + BOUND_MARGIN_TOKENS
    )


IMAGE = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}
LONG = {"role": "user", "content": "x" * 2000}


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (CHAT, "no max_tokens: the default fills the model's length, which needs the count"),
        ({**CHAT, "max_tokens": 16, "tools": [{"type": "function"}]}, "tools enter the prompt"),
        ({"model": "m", "max_tokens": 16, "messages": [IMAGE]}, "not text"),
        ({**CHAT, "max_tokens": 2000}, "too close to the model's length to guess"),
        ({"model": "m", "max_tokens": 1, "messages": [LONG]}, "long: worth counting exactly"),
        (
            {"model": "m", "max_tokens": 16, "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c", "type": "function",
                     "function": {"name": "f", "arguments": "x" * 5000}},
                ]},
            ]},
            "tool calls enter the prompt through the template",
        ),
        (
            {"model": "m", "max_tokens": 16,
             "messages": [{"role": "user", "content": "hi", "name": "x" * 3000}]},
            "a name enters the prompt",
        ),
    ],
)  # fmt: skip
def test_the_engine_counts_what_the_bound_cannot_vouch_for(body, why):
    assert bounded(body) is None, why


@given(st.text(max_size=300))
def test_the_stand_in_is_never_below_the_bytes_of_the_text(text):
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": text}]}
    assert bounded(body) >= len(text.encode("utf-8")) + BOUND_MARGIN_TOKENS


def test_zero_turns_the_stand_in_off():
    assert bounded({**CHAT, "max_tokens": 16}, limit=0) is None


def test_a_chat_request_is_counted_by_its_messages_and_carries_no_prompt():
    from types import SimpleNamespace

    from scheduler.online.admission import known_prompt_tokens

    message = {"role": "user", "content": "x" * 700}
    honest = parse_inference_request("chat", {"model": "m", "max_tokens": 8, "messages": [message]})
    engine = SimpleNamespace(max_model_len=4096)
    counted = known_prompt_tokens(honest, engine)  # type: ignore[arg-type]
    assert counted is not None
    assert counted > 700
    # A stray prompt once made the request look 1 token long (the engine runs the messages).
    with pytest.raises(InvalidRequest) as caught:
        parse_inference_request(
            "chat", {"model": "m", "max_tokens": 8, "messages": [message], "prompt": [0]}
        )
    assert caught.value.param == "prompt"
    ids = parse_inference_request("completions", {"model": "m", "max_tokens": 8, "prompt": [1, 2]})
    assert known_prompt_tokens(ids, engine) == 2  # type: ignore[arg-type]


def test_work_not_counted_by_the_engine_is_reserved_for_every_byte_that_can_enter_the_prompt():
    from protocol.inference import reserved_prompt_tokens

    plain = parse_inference_request("chat", {**CHAT, "max_tokens": 8})
    assert reserved_prompt_tokens(plain) == prompt_token_bound(plain) + BOUND_MARGIN_TOKENS
    calls = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "x" * 5000}},
    ]}  # fmt: skip
    with_calls = parse_inference_request(
        "chat", {"model": "m", "max_tokens": 8, "messages": [CHAT["messages"][0], calls]}
    )
    assert reserved_prompt_tokens(with_calls) > 5000  # the content bound alone: 18
    tools = [{"type": "function", "function": {"name": "g", "description": "y" * 3000}}]
    with_tools = parse_inference_request("chat", {**CHAT, "max_tokens": 8, "tools": tools})
    assert reserved_prompt_tokens(with_tools) > 3000


# --- the fields an endpoint allows (protocol/fields.py) -----------------------------


@pytest.mark.parametrize(
    "field",
    ["prompt_logprobs", "kv_transfer_params", "vllm_xargs", "request_id", "logits_processors",
     "mm_processor_kwargs", "media_io_kwargs", "chat_template", "chat_template_kwargs",
     "structured_outputs", "guided_json", "truncate_prompt_tokens", "documents", "suffix"],
)  # fmt: skip
def test_fields_the_shared_engine_must_not_take_from_a_tenant_are_refused_by_name(field):
    bodies: list[tuple[Endpoint, dict]] = [
        ("chat", CHAT),
        ("completions", {"model": "m", "prompt": "hi"}),
    ]
    for endpoint, body in bodies:
        with pytest.raises(InvalidRequest) as caught:
            parse_inference_request(endpoint, {**body, field: {"x": 1}})
        assert caught.value.param == field
        assert caught.value.message == f"Unrecognized request argument supplied: {field}"


@pytest.mark.parametrize(
    ("endpoint", "extra", "param"),
    [
        ("chat", {"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
        ("chat", {"logprobs": 5}, "logprobs"),
        ("completions", {"logprobs": 21}, "logprobs"),
        ("completions", {"echo": True, "logprobs": 1}, "echo"),  # the prompt's logprobs
        ("completions", {"echo": True, "logprobs": 0}, "echo"),
        ("chat", {"echo": True, "logprobs": True}, "echo"),
        ("chat", {"echo": True, "logprobs": True, "top_logprobs": 0}, "echo"),
        ("completions", {"best_of": 4}, "best_of"),
        ("chat", {"user": "a\x00b"}, "user"),  # no ledger on PostgreSQL could keep it
        ("completions", {"user": "tab\there"}, "user"),
        ("chat", {"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias"),
        ("chat", {"logit_bias": {"5": 101}}, "logit_bias"),
        ("chat", {"logit_bias": {"word": 1}}, "logit_bias"),
        ("chat", {"stop": "x" * 1001}, "stop"),
        ("chat", {"stop_token_ids": list(range(65))}, "stop_token_ids"),
        ("chat", {"tools": [{"type": "function"}] * 129}, "tools"),
        ("chat", {"tool_choice": "always"}, "tool_choice"),
        ("chat", {"response_format": {"type": "json_schema", "json_schema": {"d": "x" * 70_000}}},
         "response_format"),
        ("chat", {"response_format": {"type": "grammar", "grammar": "root ::= x"}},
         "response_format"),
        ("chat", {"repetition_penalty": 0}, "repetition_penalty"),
        ("chat", {"min_p": 1.5}, "min_p"),
        ("chat", {"top_k": 2.5}, "top_k"),
        ("chat", {"ignore_eos": "yes"}, "ignore_eos"),
        ("chat", {"user": "u" * 257}, "user"),
        ("completions", {"user": 42}, "user"),
        ("chat", {"user": ["u"]}, "user"),
        ("chat", {"stream": True, "stream_options": {"continuous_usage_stats": True}},
         "stream_options"),
    ],
)  # fmt: skip
def test_allowed_fields_are_bounded(endpoint, extra, param):
    body = CHAT if endpoint == "chat" else {"model": "m", "prompt": "hi"}
    with pytest.raises(InvalidRequest) as caught:
        parse_inference_request(endpoint, {**body, **extra})
    assert caught.value.param == param


def test_what_openai_clients_and_vllms_benchmark_send_is_allowed():
    chat = {
        **CHAT, "max_completion_tokens": 8, "stream": True, "stream_options": {"include_usage":
        True}, "temperature": 0, "top_p": 1, "logprobs": True, "top_logprobs": 20,
        "logit_bias": {"50256": -100}, "stop": ["\n"], "seed": 1, "user": "u",
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {}}},
        "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto",
        "parallel_tool_calls": False, "ignore_eos": True, "top_k": 5, "min_p": 0.1,
        "repetition_penalty": 1.0, "min_tokens": 2, "presence_penalty": None,
        "priority": 9, "cache_salt": "mine",  # replaced by the platform
    }  # fmt: skip
    assert parse_inference_request("chat", chat).body == chat
    completion = {"model": "m", "prompt": "hi", "max_tokens": 8, "logprobs": None,
                  "repetition_penalty": 1.0, "stream": True, "echo": False,
                  "stream_options": {"include_usage": True}}  # fmt: skip
    assert parse_inference_request("completions", completion).body == completion


@pytest.mark.parametrize(
    ("text", "normalised"),
    [
        ("\U0001d160" * 255, "NFC"),  # 1,020 bytes; a byte-level BPE after NFC sees 3,060
        ("\ufdfa" * 10, "NFKC"),  # 30 bytes; NFKC spells each out in 18 code points
        ("\uac00" * 100, "NFD"),  # Hangul syllables: 300 bytes, 900 as jamo
    ],
)
def test_the_byte_bound_covers_text_a_tokenizer_normalises_first(text, normalised):
    import unicodedata

    grown = len(unicodedata.normalize(normalised, text).encode("utf-8"))
    assert grown > len(text.encode("utf-8"))
    completion = parse_inference_request("completions", {"model": "m", "prompt": text})
    assert prompt_token_bound(completion) >= grown
    chat = parse_inference_request(
        "chat", {"model": "m", "messages": [{"role": "user", "content": text}]}
    )
    assert prompt_token_bound(chat) >= grown


@given(st.text(max_size=200))
def test_the_bound_is_never_below_any_normal_form_of_the_text(text):
    import unicodedata

    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": text}]}
    request = parse_inference_request("chat", body)
    for form in ("NFC", "NFD", "NFKC", "NFKD"):
        assert prompt_token_bound(request) >= len(unicodedata.normalize(form, text).encode())


def test_a_field_an_operator_enabled_for_the_tenant_is_taken_within_its_bounds():
    body = {**CHAT, "prompt_logprobs": 5, "structured_outputs": {"regex": "[a-z]+"}}
    with pytest.raises(InvalidRequest) as refused:
        parse_inference_request("chat", body)
    assert refused.value.param == "prompt_logprobs"
    enabled = ("prompt_logprobs", "structured_outputs")
    assert parse_inference_request("chat", body, enabled).body == body
    with pytest.raises(InvalidRequest) as bounded:
        parse_inference_request("chat", {**CHAT, "prompt_logprobs": 21}, enabled)
    assert bounded.value.param == "prompt_logprobs"
    echo = {"model": "m", "prompt": "hi", "echo": True, "logprobs": 1}
    assert parse_inference_request("completions", echo, ["prompt_logprobs"]).body == echo
    chat_echo = {**CHAT, "echo": True, "logprobs": True}
    assert parse_inference_request("chat", chat_echo, ["prompt_logprobs"]).body == chat_echo


def test_chat_echo_without_logprobs_is_served() -> None:
    for body in ({**CHAT, "echo": True}, {**CHAT, "echo": True, "logprobs": False}):
        assert parse_inference_request("chat", body).body == body


def test_a_request_of_more_sequences_than_allowed_is_refused_naming_what_to_lower() -> None:
    body = {"model": "m", "prompt": ["a"] * 5, "n": 4}
    with pytest.raises(InvalidRequest, match="20 sequences") as caught:
        parse_inference_request("completions", body, max_sequences=16)
    assert caught.value.param == "prompt"
    assert parse_inference_request("completions", body, max_sequences=20).sequences == 20
    with pytest.raises(InvalidRequest) as caught:
        parse_inference_request("chat", {**CHAT, "n": 17}, max_sequences=16)
    assert caught.value.param == "n"


def test_tokens_of_several_sequences_count_each_prompt_once_and_each_sample() -> None:
    request = parse_inference_request(
        "completions", {"model": "m", "prompt": ["ab", "cdef"], "n": 3, "max_tokens": 10}
    )
    assert request_tokens(request, [2, 4], 10) == 2 + 4 + 6 * 10
    # Before the engine counts: each prompt's byte bound (its bytes, one special token, the
    # margin) with one sample's tokens, then the other samples' tokens.
    bounds = (2 + 1 + BOUND_MARGIN_TOKENS) + (4 + 1 + BOUND_MARGIN_TOKENS)
    assert upper_token_estimate(request, 2048) == bounds + 2 * 10 + 2 * 2 * 10
    assert upper_token_estimate(request, 2048) >= request_tokens(request, [2, 4], 10)


@pytest.mark.parametrize(
    ("tier", "allowed", "expected"),
    [
        ("flex", ("standard", "offline"), "offline"),
        ("flex", ("standard",), "standard"),
        ("priority", ("interactive", "standard"), "interactive"),
        ("priority", ("standard", "offline"), None),  # the key's default, as OpenAI does
        ("default", ("interactive",), None),
        ("auto", ("interactive",), None),
        (None, ("interactive",), None),
    ],
)
def test_service_tiers_choose_a_class_the_tenant_may_send(tier, allowed, expected) -> None:
    assert tier_class(tier, allowed) == expected


def test_service_tier_is_the_platforms_and_never_reaches_the_engine() -> None:
    request = parse_inference_request("chat", {**CHAT, "service_tier": "flex"})
    assert request.service_tier == "flex"
    assert "service_tier" not in request.body


@pytest.mark.parametrize(
    ("text_input", "count"),
    [("a text", 1), (["a", "b c"], 2), ([1, 2, 3], 1), ([[1, 2], [3]], 2)],
)
def test_embeddings_take_an_input_or_a_list_of_them_and_generate_nothing(text_input, count):
    body = {"model": "m", "input": text_input, "encoding_format": "base64", "user": "u1"}
    request = parse_inference_request("embeddings", body)
    assert request.body == body  # the engine gets it whole
    assert (request.sequences, request.max_tokens, request.stream) == (count, 0, False)
    assert request.path == "/v1/embeddings"
    parts = split_prompts(request)
    # Each input is counted as a completion's prompt would be, with nothing to generate.
    assert [part.endpoint for part in parts] == ["completions"] * count
    assert all(set(part.body) == {"model", "prompt"} for part in parts)
    assert request_tokens(request, [5] * count, 0) == 5 * count


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"input": []}, "input"),
        ({"input": 5}, "input"),
        ({"input": ["a", [1]]}, "input"),
        ({"input": "x", "stream": True}, "stream"),
        ({"input": "x", "temperature": 0.5}, "temperature"),
        ({"input": "x", "max_tokens": 5}, "max_tokens"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "x", "dimensions": 0}, "dimensions"),
        ({"input": ["x"] * 65}, "input"),
    ],
)
def test_bad_embedding_requests_are_refused_naming_the_field(extra, param):
    with pytest.raises(InvalidRequest) as caught:
        parse_inference_request("embeddings", {"model": "m", **extra})
    assert caught.value.param == param


def test_an_embedding_input_may_fill_the_models_length_and_no_more() -> None:
    from scheduler.online.admission import ContextTooLong, bounded_max_tokens

    request = parse_inference_request("embeddings", {"model": "m", "input": "x"})
    assert bounded_max_tokens(request, 512, 512) == 0
    with pytest.raises(ContextTooLong) as refused:
        bounded_max_tokens(request, 513, 512)
    assert refused.value.param == "input"
    chat = parse_inference_request("chat", {**CHAT, "max_tokens": 1})
    with pytest.raises(ContextTooLong):
        bounded_max_tokens(chat, 512, 512)  # a generation needs room for one token


# --- the Responses API, stateless -------------------------------------------------------

RESPONSE = {"model": "m", "input": "hi", "max_output_tokens": 8}
WEATHER = {"type": "function", "name": "weather", "parameters": {"type": "object"}}


def test_a_response_request_is_bounded_by_max_output_tokens_and_always_reports_usage():
    request = parse_inference_request("responses", {**RESPONSE, "stream": True, "store": True})
    assert request.max_tokens == 8
    assert request.path == "/v1/responses"
    assert request.stream
    assert request.include_usage  # the usage is in response.completed
    assert request.sequences == 1


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"conversation": {"id": "conv_1"}}, "conversation"),
        ({"background": True}, "background"),
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"tools": [WEATHER, {"type": "file_search", "vector_store_ids": ["v"]}]}, "tools"),
        ({"tools": [{"type": "code_interpreter", "container": {"type": "auto"}}]}, "tools"),
        ({"tools": [{"type": "mcp", "server_label": "x", "server_url": "http://x"}]}, "tools"),
        ({"tool_choice": {"type": "web_search"}}, "tool_choice"),
        ({"include": ["file_search_call.results"]}, "include"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt"),  # a prompt kept at OpenAI
        ({"max_tokens": 5}, "max_tokens"),  # chat's name: not a Responses field
        ({"store": "yes"}, "store"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"instructions": ["be brief"]}, "instructions"),
        ({"input": []}, "input"),
        ({"input": 3}, "input"),
        ({"input": ["hi"]}, "input.[0]"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input.[0].role"),
        ({"input": [{"role": "user", "content": 3}]}, "input.[0].content"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
         "input.[0].content.[0].type"),
        ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]},
         "input.[0].content.[0].text"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input.[0].type"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input.[0].type"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]},
         "input.[0].arguments"),
        ({"input": [{"type": "function_call_output", "call_id": "c", "output": {}}]},
         "input.[0].output"),
    ],
)  # fmt: skip
def test_a_response_request_is_refused_with_the_field_named(fields, param):
    with pytest.raises(InvalidRequest) as caught:
        parse_inference_request("responses", {**RESPONSE, **fields})
    assert caught.value.param == param


def test_what_needs_a_kept_response_is_refused_saying_the_platform_is_stateless():
    for fields in ({"previous_response_id": "resp_1"}, {"background": True}):
        with pytest.raises(InvalidRequest, match="stateless"):
            parse_inference_request("responses", {**RESPONSE, **fields})


def test_a_response_of_messages_function_tools_and_their_calls_is_served():
    body = {
        **RESPONSE, "instructions": "Be brief.", "tools": [WEATHER], "tool_choice": "auto",
        "background": False, "previous_response_id": None, "store": False,
        "input": [
            {"role": "user", "content": "weather in Paris?"},
            {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"type": "message", "role": "assistant",
             "content": [{"type": "output_text", "text": "It is sunny."}]},
            {"role": "user", "content": [{"type": "input_text", "text": "thanks"}]},
        ],
    }  # fmt: skip
    request = parse_inference_request("responses", body)
    assert request.body == body


def test_a_response_is_counted_as_the_chat_messages_vllm_makes_of_it():
    body = {
        **RESPONSE, "instructions": "Be brief.", "tools": [WEATHER],
        "reasoning": {"effort": "low"},
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
            {"role": "assistant", "content": "Let me look."},
            {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        ],
    }  # fmt: skip
    tokenize = tokenize_request_body(parse_inference_request("responses", body))
    call = {"id": "c1", "type": "function",
            "function": {"name": "weather", "arguments": "{}"}}  # fmt: skip
    assert tokenize == {
        "model": "m",
        "add_generation_prompt": True,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
            {"role": "assistant", "content": "Let me look.", "tool_calls": [call]},
            {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
        ],
        "tools": [{"type": "function",
                   "function": {"name": "weather", "parameters": {"type": "object"}}}],
        "chat_template_kwargs": {"reasoning_effort": "low", "enable_thinking": True},
    }  # fmt: skip
    plain = tokenize_request_body(parse_inference_request("responses", RESPONSE))
    assert plain["messages"] == [{"role": "user", "content": "hi"}]
    assert "tools" not in plain


def test_a_responses_byte_bound_counts_everything_that_enters_its_prompt():
    short = parse_inference_request("responses", RESPONSE)
    bound = prompt_token_bound(short)
    assert bound >= len("hi")
    assert bounded_prompt_tokens(short, 4096, limit=1000) == bound + BOUND_MARGIN_TOKENS
    long_instructions = "x" * 5000
    tools = [{**WEATHER, "description": "d" * 3000}]
    big = parse_inference_request(
        "responses", {**RESPONSE, "instructions": long_instructions, "tools": tools}
    )
    assert prompt_token_bound(big) >= 5000 + 3000  # instructions and tools, every byte
    assert bounded_prompt_tokens(big, 100_000, limit=1000) is None  # the engine counts it
    assert bounded_prompt_tokens(big, 100_000, limit=20_000) == (
        prompt_token_bound(big) + BOUND_MARGIN_TOKENS
    )
    unbounded = parse_inference_request("responses", {"model": "m", "input": "hi"})
    assert bounded_prompt_tokens(unbounded, 4096, limit=1000) is None


@given(st.text(max_size=40), st.text(max_size=40))
def test_a_responses_byte_bound_covers_the_utf8_of_its_text(instructions, text):
    part = {"type": "input_text", "text": text}
    body = {**RESPONSE, "instructions": instructions,
            "input": [{"role": "user", "content": [part]}]}  # fmt: skip
    bound = prompt_token_bound(parse_inference_request("responses", body))
    assert bound >= len(instructions.encode()) + len(text.encode())


def test_lm_evaluation_harness_request_shapes_are_served() -> None:
    """`local-completions` with batch_size 4: generation, and loglikelihood (the prompts
    echoed with their logprobs: full-vocabulary prompt logprobs, so only for a tenant the
    operator enabled `prompt_logprobs` for)."""
    prompts = ["Question: 1+1?\nAnswer:", "Question: 2+2?\nAnswer:", "a", "b"]
    generate = {"model": "m", "prompt": prompts, "max_tokens": 32, "temperature": 0.0,
                "stop": ["\n\n", "Question:"], "seed": 1234}  # fmt: skip
    assert parse_inference_request("completions", generate).sequences == 4
    loglikelihood = {"model": "m", "prompt": prompts, "max_tokens": 1, "temperature": 0,
                     "logprobs": 1, "echo": True, "seed": 1234}  # fmt: skip
    with pytest.raises(InvalidRequest):
        parse_inference_request("completions", loglikelihood)
    enabled = parse_inference_request("completions", loglikelihood, ["prompt_logprobs"])
    assert enabled.sequences == 4
