"""Signing in to the portal and choosing a tenant: single sign-on when a provider is
configured (docs/SSO.md), else the password a person chose on their invitation's link; and
accepting an invitation."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth import get_user_model, login, logout
from django.contrib.auth.views import LoginView
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from plumbing.errors import NotFound
from portal.access import LOGIN_PATH
from portal.forms import AcceptForm
from portal.sso import sso_enabled
from tenants.memberships import invitation_accept, invitation_get, membership_list


class PortalLoginView(LoginView):
    """The sign-in page: a button to the identity provider where one is configured; the
    password form where none is (people who accepted an invitation with a password)."""

    template_name = "portal/login.html"
    redirect_authenticated_user = True

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        return {
            **super().get_context_data(**kwargs),
            "sso": sso_enabled(),
            "failed": "failed" in self.request.GET,
        }

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if sso_enabled():
            return redirect(LOGIN_PATH)  # with a provider, it is the only way in
        return super().post(request, *args, **kwargs)


@require_POST
def sign_out(request: HttpRequest) -> HttpResponse:
    logout(request)
    return redirect(LOGIN_PATH)


def home(request: HttpRequest) -> HttpResponse:
    """The person's tenants: the one they are in, or a choice of several."""
    if not request.user.is_authenticated:
        return redirect(f"{LOGIN_PATH}?next=/portal/")
    memberships = list(membership_list(user=request.user))
    if len(memberships) == 1:
        return redirect("portal:overview", slug=memberships[0].tenant.slug)
    return render(request, "portal/home.html", {"memberships": memberships})


@require_http_methods(["GET", "POST"])
def invitation(request: HttpRequest, token: str) -> HttpResponse:
    """An invitation's link. Signed in: join. With SSO: sign in with the invited address
    (which accepts it). Without: choose a username and a password, and join."""
    try:
        invited = invitation_get(token=token)
    except NotFound as exc:
        return render(request, "portal/invitation.html", {"error": str(exc)}, status=404)
    form = AcceptForm(request.POST or None)
    user = request.user
    if user.is_authenticated and request.method == "POST" and not user.is_staff:
        invitation_accept(invitation=invited, user=user)
        messages.success(request, f"You joined {invited.tenant.name}.")
        return redirect("portal:overview", slug=invited.tenant.slug)
    if request.method == "POST" and not sso_enabled() and form.is_valid():
        users = get_user_model().objects
        if users.filter(username=form.cleaned_data["username"]).exists():
            form.add_error("username", "That username is taken; choose another.")
        else:
            created = users.create_user(
                form.cleaned_data["username"],
                email=invited.email,
                password=form.cleaned_data["password"],
            )
            invitation_accept(invitation=invited, user=created)
            login(request, created, backend="django.contrib.auth.backends.ModelBackend")
            return redirect("portal:overview", slug=invited.tenant.slug)
    context = {"invitation": invited, "form": form, "sso": sso_enabled()}
    return render(request, "portal/invitation.html", context)
