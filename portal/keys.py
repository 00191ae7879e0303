"""The keys page: the tenant's API keys, making one (shown once, with its own spending
budget where one is given) and revoking one."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from billing.selectors import currency
from billing.services import budget_set
from plumbing.errors import DomainError, NotFound
from portal.access import page_context, portal_page
from portal.forms import KeyForm
from scheduler.selectors import engine_list
from tenants import selectors, services
from tenants.models import BudgetPeriod, Membership


def _served_models() -> list[str]:
    return sorted(set(engine_list().values_list("served_model_name", flat=True)))


def _form(membership: Membership, data: object = None) -> KeyForm:
    return KeyForm(data, tenant=membership.tenant, models=_served_models())


@portal_page()
def key_list(request: HttpRequest, membership: Membership) -> HttpResponse:
    return _render(request, membership, _form(membership))


def _render(
    request: HttpRequest, membership: Membership, form: KeyForm, status: int = 200
) -> HttpResponse:
    keys = (
        selectors.api_key_list(tenant=membership.tenant)
        .prefetch_related("money_budgets")
        .order_by("revoked_at", "-created_at")
    )
    context = page_context(membership, "keys", keys=keys, form=form, currency=currency())
    return render(request, "portal/keys.html", context, status=status)


@portal_page(write=True)
@require_http_methods(["POST"])
def key_create(request: HttpRequest, membership: Membership) -> HttpResponse:
    form = _form(membership, request.POST)
    if form.is_valid():
        fields = dict(form.cleaned_data)
        amount, period, hard_stop = (fields.pop(name) for name in KeyForm.BUDGET_FIELDS)
        try:
            with transaction.atomic():  # the key and its budget, or neither
                issued = services.api_key_create(tenant=membership.tenant, **fields)
                if amount is not None:
                    budget_set(
                        tenant=membership.tenant, api_key=issued.api_key, amount=amount,
                        period=period or BudgetPeriod.MONTH, hard_stop=hard_stop,
                    )  # fmt: skip
        except ValidationError as exc:
            for field, errors in exc.message_dict.items():
                form.add_error(field if field in form.fields else None, errors)
        except DomainError as exc:
            form.add_error("budget_amount", str(exc))
        else:
            # The raw key is in this answer only, never in a message or the session.
            context = page_context(membership, "keys", issued=issued)
            return render(request, "portal/key_created.html", context)
    return _render(request, membership, form, status=400)


@portal_page(write=True)
@require_POST
def key_revoke(request: HttpRequest, membership: Membership, key_id: int) -> HttpResponse:
    try:
        api_key = selectors.api_key_get(tenant=membership.tenant, key_id=key_id)
    except NotFound as exc:
        raise Http404(str(exc)) from None
    services.api_key_revoke(api_key=api_key)
    messages.success(request, f"Key {api_key.prefix}… ({api_key.name}) revoked.")
    return redirect("portal:keys", slug=membership.tenant.slug)
