"""The batches pages: every tenant's batches, one batch's lines and files, and cancelling it."""

from __future__ import annotations

from django.contrib import messages
from django.db.models import Count
from django.http import FileResponse, Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from console.live import is_htmx
from plumbing.errors import DomainError, NotFound
from scheduler.batches import objects as batch_objects
from scheduler.batches import selectors as batch_selectors
from scheduler.batches import service as batches
from scheduler.batches.files import file_get, file_response
from scheduler.models import (
    ACTIVE_BATCH_STATUSES,
    Batch,
    BatchStatus,
    LineState,
)
from staff.access import console_permission
from staff.roles import Perm

# --- batches ----------------------------------------------------------------------------------

BATCH_PAGE = 100


def _batch_or_404(batch_id: str) -> Batch:
    """Staff see every tenant's batches; the batch is found through its tenant like any read."""
    found = batch_selectors.batch_list_for_staff().filter(public_id=batch_id).first()
    if found is None:
        raise Http404(f"No batch {batch_id}.")
    return batch_selectors.batch_get(tenant=found.tenant, batch_id=batch_id)


@console_permission(Perm.VIEW)
def batch_list_page(request: HttpRequest) -> HttpResponse:
    status = request.GET.get("status", "")
    tenant = request.GET.get("tenant", "")
    shown = batch_selectors.batch_list_for_staff().order_by("-pk")
    if status in BatchStatus.values:
        shown = shown.filter(status=status)
    if tenant:
        shown = shown.filter(tenant__slug=tenant)
    rows = [(b, batch_objects.batch_progress_percent(b)) for b in shown[:BATCH_PAGE]]
    context = {
        "section": "batches",
        "rows": rows,
        "statuses": BatchStatus.values,
        "status": status,
        "tenant": tenant,
        "limit": BATCH_PAGE,
        "moving": any(b.status in ACTIVE_BATCH_STATUSES for b, _ in rows),
    }
    template = "console/batches/_table.html" if is_htmx(request) else "console/batches/list.html"
    return render(request, template, context)


def _line_counts(batch: Batch) -> list[tuple[str, int]]:
    # order_by(): the model's default ordering would split the groups.
    grouped = batch.lines.order_by().values("state").annotate(n=Count("pk"))
    counts = {row["state"]: row["n"] for row in grouped}
    return [(state, counts.get(state, 0)) for state in LineState.values]


@console_permission(Perm.VIEW)
def batch_detail(request: HttpRequest, batch_id: str) -> HttpResponse:
    batch = _batch_or_404(batch_id)
    failed = batch.lines.filter(
        state__in=(LineState.FAILED, LineState.EXPIRED, LineState.CANCELLED)
    ).order_by("index")[:20]
    errors = (batch.errors or {}).get("data", []) if isinstance(batch.errors, dict) else []
    files = [
        (label, file_id)
        for label, file_id in (
            ("input", batch.input_file_id),
            ("output", batch.output_file_id),
            ("errors", batch.error_file_id),
        )
        if file_id
    ]
    context = {
        "section": "batches",
        "batch": batch,
        "object": batch_objects.batch_object(batch),
        "progress": batch_objects.batch_progress_percent(batch),
        "line_counts": _line_counts(batch),
        "failed_lines": failed,
        "errors": errors,
        "files": files,
        "moving": batch.status in ACTIVE_BATCH_STATUSES,
        "cancellable": batch.status in (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS),
    }
    return render(request, "console/batches/detail.html", context)


@console_permission(Perm.READ_TENANT_DATA)
def batch_file(request: HttpRequest, batch_id: str, file_id: str) -> FileResponse:
    """A batch's input, output or error file, for operators (tenants use /v1/files)."""
    batch = _batch_or_404(batch_id)
    if file_id not in (batch.input_file_id, batch.output_file_id, batch.error_file_id):
        raise Http404(f"{file_id} is not a file of batch {batch_id}.")
    try:
        stored = file_get(tenant=batch.tenant, file_id=file_id)
    except NotFound as exc:
        raise Http404(str(exc)) from None
    try:
        return file_response(stored, "application/jsonl")
    except OSError:
        raise Http404(f"The bytes of {file_id} are gone.") from None


@console_permission(Perm.CANCEL_BATCHES)
@require_POST
def batch_cancel(request: HttpRequest, batch_id: str) -> HttpResponseRedirect:
    batch = _batch_or_404(batch_id)
    try:
        batches.batch_cancel(batch=batch)
    except DomainError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"{batch.public_id}: cancelling; running lines finish first.")
    return redirect("console:batch", batch_id=batch.public_id)
