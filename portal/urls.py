"""The tenant portal's URLs, under /portal/ (a tenant's people; every page checks their
membership of the tenant in the URL). One module per page."""

from __future__ import annotations

from django.urls import include, path

from portal import batches, keys, members, overview, request_lookup, sign_in, usage

app_name = "portal"

urlpatterns = [
    path("", sign_in.home, name="home"),
    path("login/", sign_in.PortalLoginView.as_view(), name="login"),
    path("logout/", sign_in.sign_out, name="logout"),
    path("invitations/<str:token>/", sign_in.invitation, name="invitation"),
    path("t/<slug:slug>/", overview.overview, name="overview"),
    path("t/<slug:slug>/keys/", keys.key_list, name="keys"),
    path("t/<slug:slug>/keys/new/", keys.key_create, name="key-create"),
    path("t/<slug:slug>/keys/<int:key_id>/revoke/", keys.key_revoke, name="key-revoke"),
    path("t/<slug:slug>/usage/", usage.usage, name="usage"),
    path("t/<slug:slug>/batches/", batches.batch_list, name="batches"),
    path("t/<slug:slug>/batches/new/", batches.batch_create, name="batch-create"),
    path("t/<slug:slug>/batches/<str:batch_id>/", batches.batch_detail, name="batch"),
    path(
        "t/<slug:slug>/batches/<str:batch_id>/files/<str:file_id>/",
        batches.batch_file,
        name="batch-file",
    ),
    path("t/<slug:slug>/requests/", request_lookup.request_lookup, name="request-lookup"),
    path("t/<slug:slug>/members/", members.members, name="members"),
    path("t/<slug:slug>/members/invite/", members.invite, name="invite"),
]

# mozilla-django-oidc's sign-in and callback (/portal/oidc/authenticate/, .../callback/).
oidc_urlpatterns = [path("oidc/", include("mozilla_django_oidc.urls"))]
