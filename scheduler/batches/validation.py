"""A batch's input file, checked line by line before anything runs: each line's shape, its
endpoint and body (as the online path checks a request), its model; and the batch's metadata."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from plumbing import wire
from plumbing.errors import DomainError
from protocol.inference import (
    ENDPOINT_PATHS,
    Endpoint,
    InvalidRequest,
    parse_inference_request,
)
from scheduler.adapters.selectors import adapter_base
from scheduler.models import (
    Engine,
    EngineTask,
)
from tenants.models import ApiKey, Tenant

# The Responses API is served online only.
ENDPOINTS_BY_PATH: dict[str, Endpoint] = {
    path: name for name, path in ENDPOINT_PATHS.items() if name != "responses"
}
# A failed batch reports at most this many line errors: enough to fix a file, bounded.
MAX_REPORTED_ERRORS = 1000
METADATA_MAX_PAIRS = 16


@dataclass(frozen=True)
class LineError:
    """One problem of the input file, as an entry of OpenAI's batch `errors.data`."""

    line: int | None
    code: str
    message: str
    param: str | None = None


@dataclass(frozen=True)
class ParsedLine:
    index: int
    custom_id: str
    model: str
    body: dict[str, Any]


@dataclass
class Validation:
    lines: list[ParsedLine] = field(default_factory=list)
    errors: list[LineError] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


# Answers why a model may not be used (code, message), or None when it may.
ModelCheck = Callable[[str], tuple[str, str] | None]


def validate_input(
    raw_lines: Iterable[bytes],
    *,
    endpoint_path: str,
    max_lines: int,
    model_check: ModelCheck,
    enabled: Collection[str] = (),
) -> Validation:
    """Checks every line of a batch input file; blank lines are skipped (but counted, so
    line numbers match an editor's). `enabled`: the tenant's optional request fields."""
    endpoint = ENDPOINTS_BY_PATH[endpoint_path]
    result = Validation()
    seen: set[str] = set()
    count = 0
    for number, raw in enumerate(raw_lines, start=1):
        if not raw.strip():
            continue
        count += 1
        if count > max_lines:
            result.errors.append(
                LineError(
                    number,
                    "too_many_lines",
                    f"The file has more than {max_lines} requests; split it into several batches.",
                )
            )
            break
        parsed = _validate_line(raw, number, endpoint_path, endpoint, seen, model_check, enabled)
        if isinstance(parsed, LineError):
            result.errors.append(parsed)
        else:
            result.lines.append(parsed)
    if count == 0:
        result.errors.append(LineError(None, "empty_file", "The input file has no requests."))
    return result


def _validate_line(
    raw: bytes,
    number: int,
    endpoint_path: str,
    endpoint: Endpoint,
    seen: set[str],
    model_check: ModelCheck,
    enabled: Collection[str],
) -> ParsedLine | LineError:
    # PostgreSQL text and jsonb cannot hold NUL: refuse it here, as a line error, rather than
    # fail the whole batch when the lines are stored.
    if b"\x00" in raw or b"\\u0000" in raw:
        return LineError(number, "invalid_json_line", f"Line {number} contains a NUL character.")
    try:
        item = wire.loads_request(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        return LineError(number, "invalid_json_line", f"Line {number} is not valid JSON: {exc}")
    except RecursionError:
        return LineError(number, "invalid_json_line", f"Line {number} is nested too deeply.")
    if not isinstance(item, dict):
        return LineError(number, "invalid_json_line", f"Line {number} is not a JSON object.")
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > 512:
        return LineError(
            number,
            "invalid_custom_id",
            "'custom_id' must be a non-empty string of at most 512 characters.",
            "custom_id",
        )
    if custom_id in seen:
        return LineError(
            number,
            "duplicate_custom_id",
            f"The custom_id {custom_id!r} is used by an earlier line.",
            "custom_id",
        )
    seen.add(custom_id)
    if item.get("method") != "POST":
        return LineError(number, "invalid_method", "'method' must be POST.", "method")
    if item.get("url") != endpoint_path:
        return LineError(
            number, "invalid_url", f"'url' must be {endpoint_path}, the batch's endpoint.", "url"
        )
    return _validate_body(item.get("body"), number, custom_id, endpoint, model_check, enabled)


def _validate_body(
    body: Any,
    number: int,
    custom_id: str,
    endpoint: Endpoint,
    model_check: ModelCheck,
    enabled: Collection[str],
) -> ParsedLine | LineError:
    try:
        request = parse_inference_request(
            endpoint, body, enabled, settings.GPUSHARE_MAX_SEQUENCES_PER_REQUEST
        )
    except InvalidRequest as exc:
        param = f"body.{exc.param}" if exc.param else "body"
        return LineError(number, "invalid_request", exc.message, param)
    if request.stream:
        return LineError(number, "invalid_request", "Batch requests cannot stream.", "body.stream")
    refusal = model_check(request.model)
    if refusal is not None:
        return LineError(number, refusal[0], refusal[1], "body.model")
    return ParsedLine(index=number, custom_id=custom_id, model=request.model, body=request.body)


def check_metadata(metadata: Any) -> dict[str, str] | None:
    if metadata is None:
        return None
    if (
        not isinstance(metadata, dict)
        or len(metadata) > METADATA_MAX_PAIRS
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
    ):
        raise DomainError(
            f"'metadata' must be an object of at most {METADATA_MAX_PAIRS} string pairs.",
            param="metadata",
        )
    return metadata


def model_check(tenant: Tenant, endpoint_path: str, api_key: ApiKey | None = None) -> ModelCheck:
    """The refusal of a line's model: one the tenant (or the key that made the batch) may
    not use, one no engine serves, or one whose engines do not serve the batch's endpoint
    (embeddings or text generation)."""
    known: dict[str, tuple[str, str] | None] = {}
    task = (
        EngineTask.EMBED if endpoint_path == ENDPOINT_PATHS["embeddings"] else EngineTask.GENERATE
    )

    def check(name: str) -> tuple[str, str] | None:
        if name not in known:
            # The tenant's own adapter runs on its base model; another's is an unknown name.
            model = adapter_base(tenant=tenant, name=name) or name
            engines = Engine.objects.filter(served_model_name=model)
            if not tenant.allows_model(model):
                known[name] = (
                    "model_not_allowed",
                    f"Tenant '{tenant.slug}' may not use model '{name}'.",
                )
            elif api_key is not None and not api_key.allows_model(model):
                known[name] = ("model_not_allowed", f"This key may not use model '{name}'.")
            elif not engines.exists():
                known[name] = ("model_not_found", f"The model '{name}' does not exist.")
            elif not engines.filter(task=task).exists():
                known[name] = (
                    "model_not_supported",
                    f"The model '{name}' does not support {endpoint_path}.",
                )
            else:
                known[name] = None
        return known[name]

    return check
