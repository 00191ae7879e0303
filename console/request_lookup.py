"""Find a request by its id (the `x-request-id` its answer carried): its row in the usage ledger."""

from __future__ import annotations

import contextlib

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from plumbing.errors import NotFound
from staff.access import console_permission
from staff.roles import Perm
from tenants import selectors

# --- one request, by its id ------------------------------------------------------------------

# A request id as the platform makes them (a job id, 32 hex digits) is far shorter: anything
# longer is nobody's, and is not looked up.
REQUEST_ID_MAX_CHARS = 64


@console_permission(Perm.VIEW)
def request_lookup(request: HttpRequest) -> HttpResponse:
    """A request's ledger row by its id (the `X-Request-Id` its answer carried)."""
    request_id = request.GET.get("id", "").strip()
    record = None
    if request_id and len(request_id) <= REQUEST_ID_MAX_CHARS:
        with contextlib.suppress(NotFound):
            record = selectors.usage_record_get(request_id=request_id)
    context = {"section": "requests", "request_id": request_id, "record": record}
    return render(request, "console/requests/lookup.html", context)
