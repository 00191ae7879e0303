"""The audit log page: who changed what, when and from where, newest first; filtered by
actor, action (a prefix) and object; read only, paginated. Export is the admin API's
(`/api/v1/audit/?format=csv`)."""

from __future__ import annotations

from django import forms
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from audit import selectors
from staff.access import console_permission
from staff.roles import Perm

PAGE_SIZE = 50


class AuditFilterForm(forms.Form):
    actor = forms.CharField(required=False)
    action = forms.CharField(required=False, help_text="A prefix: tenant. finds every one.")
    object_type = forms.CharField(required=False, label="Object type")
    object_id = forms.CharField(required=False, label="Object id")


@console_permission(Perm.VIEW)
def audit_log(request: HttpRequest) -> HttpResponse:
    form = AuditFilterForm(request.GET or None)
    filters = form.cleaned_data if form.is_valid() else {}
    events = selectors.audit_events(**{k: v for k, v in filters.items() if v})
    page = Paginator(events, PAGE_SIZE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    context = {
        "section": "audit",
        "form": form,
        "page": page,
        "query": query.urlencode(),
    }
    return render(request, "console/audit/log.html", context)
