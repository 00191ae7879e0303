"""A whole answer that could pass GPUSHARE_MAX_ANSWER_BYTES is refused before it runs: the
engine, the worker, Redis and the web would each hold it whole. A stream is not bounded
whole (each chunk holds a token per sequence)."""

from __future__ import annotations

import pytest

from protocol.inference import answer_bytes_bound, parse_inference_request
from scheduler.online.admission import AnswerTooLarge, bounded_max_tokens

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_the_probe_s_answer_is_refused_naming_its_logprobs() -> None:
    """n=64, no max_tokens and top_logprobs 20 on a 2,048-token model: about 141 MB as the
    demo engine wrote it."""
    request = parse_inference_request(
        "chat", {**CHAT, "n": 64, "logprobs": True, "top_logprobs": 20}
    )
    with pytest.raises(AnswerTooLarge) as refused:
        bounded_max_tokens(request, 10, 2048)
    assert (refused.value.http_status, refused.value.code) == (400, "answer_too_large")
    assert refused.value.param == "top_logprobs"
    assert "stream" in refused.value.message
    assert answer_bytes_bound(request, 2038) > 141 * 10**6


@pytest.mark.parametrize(
    ("endpoint", "body", "param"),
    [
        ("chat", {**CHAT, "n": 64, "max_tokens": 32_000}, "n"),
        ("chat", {**CHAT, "max_tokens": 2_000_000}, "max_tokens"),
        ("completions", {"model": "m", "prompt": "p", "logprobs": 5, "max_tokens": 100_000},
         "logprobs"),
        ("responses", {"model": "m", "input": "hi", "max_output_tokens": 2_000_000},
         "max_output_tokens"),
    ],
)  # fmt: skip
def test_the_field_that_weighs_most_is_named(endpoint, body, param) -> None:
    request = parse_inference_request(endpoint, body)
    with pytest.raises(AnswerTooLarge) as refused:
        bounded_max_tokens(request, 10, 10_000_000)
    assert refused.value.param == param


def test_a_stream_or_a_modest_answer_is_admitted(settings) -> None:
    probe = {**CHAT, "n": 64, "logprobs": True, "top_logprobs": 20}
    streamed = parse_inference_request("chat", {**probe, "stream": True})
    assert bounded_max_tokens(streamed, 10, 2048) == 2038
    many = parse_inference_request("chat", {**CHAT, "n": 64})  # 64 answers, no logprobs
    assert bounded_max_tokens(many, 10, 2048) == 2038
    settings.GPUSHARE_MAX_ANSWER_BYTES = 1024 * 1024
    with pytest.raises(AnswerTooLarge):
        bounded_max_tokens(many, 10, 2048)
