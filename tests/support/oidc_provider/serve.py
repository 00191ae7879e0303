"""Runs the test provider: `python -m tests.support.oidc_provider.serve PORT REDIRECT_URI
USERNAME EMAIL PASSWORD` (DJANGO_SETTINGS_MODULE=tests.support.oidc_provider.settings)."""

from __future__ import annotations

import sys
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server


def userinfo(claims: dict[str, Any], user: Any) -> dict[str, Any]:
    """The claims the provider tells about its person: a verified email."""
    claims["email"] = user.email
    claims["email_verified"] = True
    return claims


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _LogHandler(WSGIRequestHandler):
    def log_message(self, template: str, *args: Any) -> None:
        sys.stdout.write(f"{self.address_string()} {template % args}\n")


def main(port: int, redirect_uri: str, username: str, email: str, password: str) -> None:
    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.core.wsgi import get_wsgi_application
    from oidc_provider.models import Client, ResponseType

    call_command("migrate", verbosity=0)
    call_command("creatersakey")
    User.objects.create_user(username, email, password)
    client = Client.objects.create(
        name="gpushare",
        client_id="gpushare",
        client_secret="sso-test-secret",
        client_type="confidential",
        jwt_alg="RS256",
        require_consent=False,
        _redirect_uris=redirect_uri,
    )
    client.response_types.add(ResponseType.objects.get(value="code"))
    server = make_server(
        "127.0.0.1", port, get_wsgi_application(), server_class=_Server, handler_class=_LogHandler
    )
    sys.stdout.write(f"serving on {port}\n")
    sys.stdout.flush()
    server.serve_forever()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5])
