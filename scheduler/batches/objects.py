"""What a tenant sees of a batch: the API's batch object, its progress, and the lines of its
output and error files, in OpenAI's formats."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from scheduler.models import (
    Batch,
    BatchLine,
    BatchStop,
)

# --- line formats (pure) ----------------------------------------------------------------


def output_record(line: BatchLine) -> dict[str, Any]:
    """One line of the output or error file, in OpenAI's format."""
    return {
        "id": f"batch_req_{line.batch_id}_{line.index}",
        "custom_id": line.custom_id,
        "response": line.response,
        "error": line.error,
    }


def stop_error(reason: str) -> dict[str, str]:
    """The `error` of a line that never ran because the batch stopped admitting lines."""
    if reason == BatchStop.EXPIRED:
        return {
            "code": "batch_expired",
            "message": "This request could not be executed before the completion window expired.",
        }
    if reason == BatchStop.BUDGET:
        return {
            "code": "token_budget_exceeded",
            "message": "This request was not executed: the tenant's token budget is used up.",
        }
    return {
        "code": "batch_cancelled",
        "message": "This request was not executed because the batch was cancelled.",
    }


def _stamp(moment: datetime | None) -> int | None:
    return int(moment.timestamp()) if moment else None


def batch_object(batch: Batch) -> dict[str, Any]:
    """The batch as OpenAI's `Batch` object; `batch` comes from batch_list/batch_get."""
    total = getattr(batch, "lines_total", 0)
    completed = getattr(batch, "lines_completed", 0)
    failed = getattr(batch, "lines_failed", 0)
    return {
        "id": batch.public_id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "errors": batch.errors,
        "input_file_id": batch.input_file_id,
        "completion_window": batch.completion_window,
        "status": batch.status,
        "output_file_id": batch.output_file_id or None,
        "error_file_id": batch.error_file_id or None,
        "created_at": _stamp(batch.created_at),
        "in_progress_at": _stamp(batch.in_progress_at),
        "expires_at": _stamp(batch.expires_at),
        "finalizing_at": _stamp(batch.finalizing_at),
        "completed_at": _stamp(batch.completed_at),
        "failed_at": _stamp(batch.failed_at),
        "expired_at": _stamp(batch.expired_at),
        "cancelling_at": _stamp(batch.cancelling_at),
        "cancelled_at": _stamp(batch.cancelled_at),
        "request_counts": {"total": total, "completed": completed, "failed": failed},
        "metadata": batch.metadata,
    }


def batch_progress_percent(batch: Batch) -> float:
    total = getattr(batch, "lines_total", 0)
    done = getattr(batch, "lines_completed", 0) + getattr(batch, "lines_failed", 0)
    return round(100.0 * done / total, 1) if total else 0.0
