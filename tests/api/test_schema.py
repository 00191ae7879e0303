"""The OpenAPI schema (`/api/schema/`) describes the inference endpoints that the lean ASGI
app serves outside DRF: their request bodies as protocol/fields.py allows them, the
class header, both kinds of answer, the error shape, the tenant key and `X-Request-Id`."""

from __future__ import annotations

from typing import Any

import pytest

from protocol import fields as request_fields

PATHS = {
    "chat": "/v1/chat/completions", "completions": "/v1/completions",
    "embeddings": "/v1/embeddings", "responses": "/v1/responses",
}  # fmt: skip


def schema(client: Any) -> dict[str, Any]:
    response = client.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    body: dict[str, Any] = response.json()
    return body


def resolve(document: dict[str, Any], ref: dict[str, Any]) -> dict[str, Any]:
    node: Any = document
    for part in ref["$ref"].removeprefix("#/").split("/"):
        node = node[part]
    resolved: dict[str, Any] = node
    return resolved


def request_body(document: dict[str, Any], path: str) -> dict[str, Any]:
    content = document["paths"][path]["post"]["requestBody"]["content"]
    return resolve(document, content["application/json"]["schema"])


@pytest.mark.parametrize("endpoint", ["chat", "completions", "embeddings", "responses"])
def test_the_schema_lists_the_fields_each_endpoint_allows(client, endpoint):
    document = schema(client)
    body = request_body(document, PATHS[endpoint])
    optional = set(request_fields.OPTIONAL_FIELDS)
    if endpoint not in request_fields.OPTIONAL_FIELD_ENDPOINTS:
        optional = set()
    assert set(body["properties"]) == set(request_fields.FIELDS[endpoint]) | optional
    assert body["additionalProperties"] is False
    assert body["properties"]["request_class"]["enum"] == ["interactive", "standard", "offline"]
    if optional:
        assert "enabled it" in body["properties"]["prompt_logprobs"]["description"]
    required = {"model", "messages" if endpoint == "chat" else "input"}
    if endpoint == "completions":
        required = {"model", "prompt"}
    assert set(body["required"]) == required
    answers = document["paths"][PATHS[endpoint]]["post"]["responses"]["200"]["content"]
    assert ("text/event-stream" in answers) == (endpoint != "embeddings")


def test_a_field_added_to_the_allowlist_appears_in_the_schema(client, monkeypatch):
    chat = {**request_fields.CHAT_FIELDS, "brand_new_knob": lambda value: None}
    monkeypatch.setitem(request_fields.FIELDS, "chat", chat)
    document = schema(client)
    assert "brand_new_knob" in request_body(document, PATHS["chat"])["properties"]
    assert "brand_new_knob" not in request_body(document, PATHS["completions"])["properties"]


def test_the_operations_say_how_to_authenticate_answer_and_refuse(client):
    document = schema(client)
    scheme = document["components"]["securitySchemes"]["tenantKey"]
    assert scheme == {"type": "http", "scheme": "bearer"}
    for endpoint, path in PATHS.items():
        operation = document["paths"][path]["post"]
        assert operation["security"] == [{"tenantKey": []}]
        (header,) = operation["parameters"]
        assert (header["in"], header["name"]) == ("header", "X-Request-Class")
        answer = operation["responses"]["200"]
        assert "application/json" in answer["content"]
        whole = resolve(document, answer["content"]["application/json"]["schema"])
        assert whole["properties"]["object"]["enum"] == [
            {"chat": "chat.completion", "completions": "text_completion", "embeddings": "list",
             "responses": "response"}[endpoint]
        ]  # fmt: skip
        for status in ("200", "400", "401", "429", "503"):
            response = operation["responses"][status]
            request_id = resolve(document, response["headers"]["X-Request-Id"])
            assert request_id["schema"] == {"type": "string"}
        refusal = operation["responses"]["429"]["content"]["application/json"]["schema"]
        error = resolve(document, refusal)["properties"]["error"]
        assert set(error["properties"]) == {"message", "type", "code", "param"}


def test_the_schema_is_valid_openapi(client):
    from drf_spectacular.validation import validate_schema

    validate_schema(schema(client))
