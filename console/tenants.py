"""The tenants pages: the list, creating and editing a tenant (its quota in 256 MiB units, weight
and limits), its API keys, and a preview of what a number of units means."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.safestring import mark_safe
from django.views.decorators.http import require_http_methods, require_POST

from capacity.units import bytes_to_units_exact, format_units
from console.billing import tenant_spend
from console.charts import Segment, stacked_bar
from console.reports import USAGE_RANGES, usage_charts
from console.tenant_forms import ApiKeyCreateForm, TenantCreateForm, TenantForm, add_service_errors
from plumbing.errors import NotFound
from scheduler.adapters.selectors import adapter_list
from scheduler.pools.policies import fair_queue
from staff.access import console_permission
from staff.roles import TENANT_LIMIT_FIELDS, Perm
from tenants import reports, selectors, services
from tenants.models import Tenant

_ACTIVE_FILTERS = {"active": True, "inactive": False}


def _tenant_or_404(slug: str) -> Tenant:
    try:
        return selectors.tenant_get(slug=slug)
    except NotFound as exc:
        raise Http404(str(exc)) from None


@console_permission(Perm.VIEW)
def tenant_list(request: HttpRequest) -> HttpResponse:
    shown = request.GET.get("show", "all")
    tenants = list(selectors.tenant_list_with_key_counts(is_active=_ACTIVE_FILTERS.get(shown)))
    reserved = fair_queue().snapshot().tenant_reserved_bytes
    since = reports.period_start("day", timezone.now())
    rows = [
        {
            "tenant": tenant,
            "reserved_units": bytes_to_units_exact(reserved.get(tenant.slug, 0)),
            "today": reports.tenant_usage_report(tenant=tenant, since=since, until=timezone.now()),
        }
        for tenant in tenants
    ]
    return render(
        request,
        "console/tenants/list.html",
        {"section": "tenants", "rows": rows, "shown": shown},
    )


@console_permission(Perm.CHANGE_TENANT_ACCESS)
@require_http_methods(["GET", "POST"])
def tenant_create(request: HttpRequest) -> HttpResponse:
    form = TenantCreateForm(request.POST or None, initial=TenantCreateForm.defaults())
    if request.method == "POST" and form.is_valid():
        try:
            tenant = services.tenant_create(**form.cleaned_data)
        except ValidationError as exc:
            add_service_errors(form, exc)
        else:
            messages.success(request, f"Tenant '{tenant.slug}' created.")
            return redirect("console:tenant", slug=tenant.slug)
    return render(request, "console/tenants/form.html", {"section": "tenants", "form": form})


@console_permission(Perm.VIEW)
def tenant_detail(request: HttpRequest, slug: str) -> HttpResponse:
    tenant = _tenant_or_404(slug)
    return _render_detail(request, tenant, ApiKeyCreateForm())


def _render_detail(
    request: HttpRequest, tenant: Tenant, key_form: ApiKeyCreateForm, status: int = 200
) -> HttpResponse:
    usage_range = request.GET.get("usage", "24h")
    if usage_range not in USAGE_RANGES:
        usage_range = "24h"
    context = {
        "section": "tenants",
        "tenant": tenant,
        "keys": selectors.api_key_list(tenant=tenant),
        "adapters": adapter_list(tenant=tenant),
        "key_form": key_form,
        "allowance_bar": mark_safe(_allowance_bar(tenant)),
        "usage_range": usage_range,
        "usage_ranges": [(key, label) for key, (_, _, label) in USAGE_RANGES.items()],
        "usage": usage_charts(tenant, usage_range),
        "spend": tenant_spend(tenant),
        "prefix_cache": _prefix_cache_use(tenant, usage_range),
    }
    return render(request, "console/tenants/detail.html", context, status=status)


def _prefix_cache_use(tenant: Tenant, range_key: str) -> reports.PrefixCacheUse:
    span, _, _ = USAGE_RANGES[range_key]
    until = timezone.now()
    return reports.prefix_cache_use(tenant=tenant, since=until - span, until=until)


def _allowance_bar(tenant: Tenant) -> str:
    return stacked_bar(
        [
            Segment("Quota", tenant.quota_units, "#2f6fb0", format_units(tenant.quota_units)),
            Segment("Burst", tenant.burst_units, "#8fb8e0", format_units(tenant.burst_units)),
        ],
        title=f"Memory allowance of {tenant.slug}",
    )


@console_permission(Perm.CHANGE_TENANT_LIMITS)
@require_http_methods(["GET", "POST"])
def tenant_edit(request: HttpRequest, slug: str) -> HttpResponse:
    tenant = _tenant_or_404(slug)
    form = TenantForm(request.POST or None, initial=TenantForm.initial_for(tenant))
    if not request.user.has_perm(Perm.CHANGE_TENANT_ACCESS.value):
        # An operator changes quotas and limits: the other fields show, and keep their values
        # whatever is posted (a disabled field's value is its initial one).
        for name, field in form.fields.items():
            field.disabled = name not in TENANT_LIMIT_FIELDS
    if request.method == "POST" and form.is_valid():
        try:
            services.tenant_update(tenant=tenant, **form.cleaned_data)
        except ValidationError as exc:
            add_service_errors(form, exc)
            # tenant_update set the refused values on the instance: show the stored ones.
            tenant = _tenant_or_404(slug)
        else:
            messages.success(request, f"Tenant '{tenant.slug}' saved.")
            return redirect("console:tenant", slug=tenant.slug)
    return render(
        request,
        "console/tenants/form.html",
        {"section": "tenants", "form": form, "tenant": tenant},
    )


@console_permission(Perm.VIEW)
def units_preview(request: HttpRequest) -> HttpResponse:
    """'8 units = 2.0 GiB' for the number typed into a units field; empty if not a count."""
    typed = request.GET.get("quota_units", request.GET.get("burst_units", ""))
    try:
        units = int(typed)
    except ValueError:
        return HttpResponse("")
    return HttpResponse(format_units(units) if units >= 0 else "")


@console_permission(Perm.MANAGE_KEYS)
@require_POST
def api_key_create(request: HttpRequest, slug: str) -> HttpResponse:
    tenant = _tenant_or_404(slug)
    form = ApiKeyCreateForm(request.POST)
    if form.is_valid():
        try:
            issued = services.api_key_create(tenant=tenant, **form.cleaned_data)
        except ValidationError as exc:
            add_service_errors(form, exc)
        else:
            # The only time the raw key exists outside the client: render it, never store it,
            # and keep it out of caches.
            response = render(
                request,
                "console/tenants/key_created.html",
                {"section": "tenants", "tenant": tenant, "issued": issued},
            )
            response["Cache-Control"] = "no-store"
            return response
    return _render_detail(request, tenant, form, status=400)


@console_permission(Perm.MANAGE_KEYS)
@require_POST
def api_key_revoke(request: HttpRequest, slug: str, key_id: int) -> HttpResponseRedirect:
    tenant = _tenant_or_404(slug)
    try:
        api_key = selectors.api_key_get(tenant=tenant, key_id=key_id)
    except NotFound as exc:
        raise Http404(str(exc)) from None
    services.api_key_revoke(api_key=api_key)
    messages.success(request, f"Key {api_key.prefix}… ({api_key.name}) revoked.")
    return redirect("console:tenant", slug=tenant.slug)
