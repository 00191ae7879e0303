"""The batches page: upload a file and start a batch, watch its progress, download its
output. The Files and Batches API's own services do the work, through the tenant."""

from __future__ import annotations

from django.contrib import messages
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from plumbing.errors import DomainError, NotFound
from portal.access import page_context, portal_page
from portal.forms import BatchForm
from scheduler.batches import files
from scheduler.batches import objects as batch_objects
from scheduler.batches import selectors as batch_selectors
from scheduler.batches import service as batches
from scheduler.models import ACTIVE_BATCH_STATUSES, Batch
from tenants.models import Membership

BATCH_PAGE = 50


def _batch(membership: Membership, batch_id: str) -> Batch:
    try:
        return batch_selectors.batch_get(tenant=membership.tenant, batch_id=batch_id)
    except NotFound as exc:
        raise Http404(str(exc)) from None


@portal_page()
def batch_list(request: HttpRequest, membership: Membership) -> HttpResponse:
    return _render_list(request, membership, BatchForm())


def _render_list(
    request: HttpRequest, membership: Membership, form: BatchForm, status: int = 200
) -> HttpResponse:
    shown = batch_selectors.batch_list(tenant=membership.tenant).order_by("-pk")[:BATCH_PAGE]
    rows = [(b, batch_objects.batch_progress_percent(b)) for b in shown]
    context = page_context(
        membership,
        "batches",
        rows=rows,
        form=form,
        moving=any(b.status in ACTIVE_BATCH_STATUSES for b, _ in rows),
    )
    return render(request, "portal/batches.html", context, status=status)


@portal_page(write=True)
@require_POST
def batch_create(request: HttpRequest, membership: Membership) -> HttpResponse:
    """Uploads the file (purpose `batch`) and creates the batch on it, as a client of the
    API would in two calls."""
    form = BatchForm(request.POST, request.FILES)
    if not form.is_valid():
        return _render_list(request, membership, form, status=400)
    tenant, upload = membership.tenant, form.cleaned_data["file"]
    try:
        stored = files.file_upload(
            tenant=tenant,
            purpose="batch",
            filename=upload.name or "batch.jsonl",
            chunks=upload.chunks(files.COPY_CHUNK_BYTES),
        )
        batch = batches.batch_create(
            tenant=tenant,
            api_key=None,
            input_file_id=stored.public_id,
            endpoint=form.cleaned_data["endpoint"],
            completion_window="24h",
        )
    except DomainError as exc:
        form.add_error(None, exc.message)
        return _render_list(request, membership, form, status=exc.http_status)
    messages.success(request, f"Batch {batch.public_id} created; it is being validated.")
    return redirect("portal:batch", slug=tenant.slug, batch_id=batch.public_id)


@portal_page()
def batch_detail(request: HttpRequest, membership: Membership, batch_id: str) -> HttpResponse:
    batch = _batch(membership, batch_id)
    context = page_context(
        membership,
        "batches",
        batch=batch,
        object=batch_objects.batch_object(batch),
        progress=batch_objects.batch_progress_percent(batch),
        moving=batch.status in ACTIVE_BATCH_STATUSES,
    )
    return render(request, "portal/batch.html", context)


@portal_page()
def batch_file(
    request: HttpRequest, membership: Membership, batch_id: str, file_id: str
) -> FileResponse:
    """A batch's input, output or error file, found through the tenant."""
    batch = _batch(membership, batch_id)
    if file_id not in (batch.input_file_id, batch.output_file_id, batch.error_file_id):
        raise Http404(f"{file_id} is not a file of batch {batch_id}.")
    try:
        stored = files.file_get(tenant=membership.tenant, file_id=file_id)
        return files.file_response(stored, "application/jsonl")
    except NotFound as exc:
        raise Http404(str(exc)) from None
    except OSError:
        raise Http404(f"The bytes of {file_id} are gone.") from None
