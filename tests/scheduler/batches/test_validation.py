"""Batch input validation and result line formats: pure, no database or Redis."""

import json

import pytest

from scheduler.batches.objects import output_record, stop_error
from scheduler.batches.validation import LineError, validate_input
from scheduler.models import BatchLine


def allow_all(model: str) -> tuple[str, str] | None:
    return None if model == "tiny-llama" else ("model_not_found", f"no {model}")


def chat_line(custom_id: str, **changes) -> bytes:
    item = {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}]},
    }
    item.update(changes)
    return (json.dumps(item) + "\n").encode()


def validate(lines: list[bytes], *, endpoint="/v1/chat/completions", max_lines=50_000):
    return validate_input(lines, endpoint_path=endpoint, max_lines=max_lines, model_check=allow_all)


def test_a_good_file_gives_one_parsed_line_per_request_and_skips_blank_lines():
    result = validate([chat_line("a"), b"\n", chat_line("b")])
    assert result.ok
    assert [(line.index, line.custom_id, line.model) for line in result.lines] == [
        (1, "a", "tiny-llama"),
        (3, "b", "tiny-llama"),
    ]


@pytest.mark.parametrize(
    ("line", "code", "param"),
    [
        (b"{not json\n", "invalid_json_line", None),
        (b"[1, 2]\n", "invalid_json_line", None),
        (
            chat_line(
                "",
            ),
            "invalid_custom_id",
            "custom_id",
        ),
        (chat_line("x", method="GET"), "invalid_method", "method"),
        (chat_line("x", url="/v1/completions"), "invalid_url", "url"),
        (chat_line("x", body={"model": "tiny-llama"}), "invalid_request", "body.messages"),
        (
            chat_line(
                "x",
                body={
                    "model": "tiny-llama",
                    "messages": [{"role": "user", "content": "hi"}],
                    "temperature": 9,
                },
            ),
            "invalid_request",
            "body.temperature",
        ),
        (
            chat_line(
                "x",
                body={
                    "model": "tiny-llama",
                    "stream": True,
                    "messages": [{"role": "user", "content": "hi"}],
                },
            ),
            "invalid_request",
            "body.stream",
        ),
        (
            chat_line(
                "x", body={"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}
            ),
            "model_not_found",
            "body.model",
        ),
    ],
)
def test_each_kind_of_bad_line_is_reported_with_its_line_number(line, code, param):
    result = validate([chat_line("ok"), line])
    assert not result.ok
    [error] = result.errors
    assert (error.line, error.code, error.param) == (2, code, param)
    assert error.message


def test_a_repeated_custom_id_is_an_error_on_the_later_line():
    result = validate([chat_line("same"), chat_line("other"), chat_line("same")])
    assert result.errors == [
        LineError(3, "duplicate_custom_id", result.errors[0].message, "custom_id")
    ]


def test_every_bad_line_is_reported_not_just_the_first():
    result = validate([b"nope\n", chat_line("a"), chat_line("a"), chat_line("b", method="PUT")])
    assert [(e.line, e.code) for e in result.errors] == [
        (1, "invalid_json_line"),
        (3, "duplicate_custom_id"),
        (4, "invalid_method"),
    ]


def test_a_file_over_the_line_limit_fails_at_the_first_line_too_many():
    result = validate([chat_line(str(i)) for i in range(4)], max_lines=3)
    assert [(e.line, e.code) for e in result.errors] == [(4, "too_many_lines")]


def test_an_empty_file_is_an_error():
    assert [e.code for e in validate([b"\n", b"  \n"]).errors] == ["empty_file"]


def test_completions_lines_are_checked_against_the_completions_endpoint():
    line = json.dumps(
        {
            "custom_id": "c",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": "tiny-llama", "prompt": "once"},
        }
    ).encode()
    assert validate([line], endpoint="/v1/completions").ok
    assert validate([line]).errors[0].code == "invalid_url"


def test_output_and_error_lines_have_openai_shape():
    done = BatchLine(
        batch_id=7,
        index=3,
        custom_id="req-3",
        model="m",
        body={},
        response={"status_code": 200, "request_id": "j1", "body": {"id": "x"}},
    )
    assert output_record(done) == {
        "id": "batch_req_7_3",
        "custom_id": "req-3",
        "response": {"status_code": 200, "request_id": "j1", "body": {"id": "x"}},
        "error": None,
    }
    expired = BatchLine(
        batch_id=7, index=4, custom_id="req-4", model="m", body={}, error=stop_error("expired")
    )
    record = output_record(expired)
    assert record["response"] is None
    assert record["error"]["code"] == "batch_expired"
    assert stop_error("cancelled")["code"] == "batch_cancelled"
    assert stop_error("budget")["code"] == "token_budget_exceeded"
