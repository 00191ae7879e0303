"""`manage.py demo`: the admin user, a demo tenant and its key, for a first run.

Idempotent. The credentials it makes are kept in var/demo-credentials.json (never committed)
so that each `make run` prints the same login and key instead of minting new ones.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.management.base import CommandParser

from audit.commands import AuditedCommand
from plumbing.env import env_str
from plumbing.errors import InvalidApiKey
from protocol.classes import REQUEST_CLASSES
from staff.roles import Role, role_assign
from staff.tokens import admin_token_authenticate, admin_token_create
from tenants import services
from tenants.models import Tenant

DEMO_TENANT = "demo"


def _credentials_file() -> Path:
    return Path(settings.VAR_DIR) / "demo-credentials.json"


def _load_saved() -> dict[str, Any]:
    path = _credentials_file()
    return json.loads(path.read_text()) if path.exists() else {}


def _save(credentials: dict[str, Any]) -> None:
    path = _credentials_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(credentials, indent=2))
    path.chmod(0o600)


class Command(AuditedCommand):
    help = "Create (once) the admin user, the demo tenant and its API key; print them."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--base-url", default="http://127.0.0.1:8000")
        parser.add_argument("--json", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        saved = _load_saved()
        username = env_str("GPUSHARE_ADMIN_USER", "admin")
        password = env_str("GPUSHARE_ADMIN_PASSWORD", "") or saved.get("admin_password")
        password = self._ensure_admin(username, password)
        admin = User.objects.get(username=username)
        # The admin role for a user that existed before as staff only (a new one is a
        # superuser, which holds every permission anyway): the printed login does everything.
        role_assign(user=admin, role=Role.ADMIN)
        staff_token = self._ensure_token(admin, saved.get("admin_api_token"))
        tenant = self._ensure_tenant()
        api_key = self._ensure_key(tenant, saved.get("demo_api_key"))
        credentials = {
            "admin_user": username,
            "admin_password": password,
            "admin_api_token": staff_token,
            "demo_tenant": tenant.slug,
            "demo_api_key": api_key,
        }
        _save(credentials)
        if options["json"]:
            self.stdout.write(json.dumps(credentials, indent=2))
            return
        self._print(options["base_url"].rstrip("/"), credentials)

    def _ensure_admin(self, username: str, password: str | None) -> str:
        user = User.objects.filter(username=username).first()
        if user is None:
            password = password or secrets.token_urlsafe(12)
            User.objects.create_superuser(username, f"{username}@localhost", password)
        elif password is None or not user.check_password(password):
            # We no longer know the password (credentials file removed): set a new one.
            password = secrets.token_urlsafe(12)
            user.set_password(password)
            user.save(update_fields=["password"])
        return password

    def _ensure_token(self, admin: User, raw_token: str | None) -> str:
        """The saved admin API token while it still opens the API as the admin; else a new
        one (the database keeps only its digest, so the saved file is where it is read)."""
        if raw_token:
            token = admin_token_authenticate(raw_token=raw_token)
            if token is not None and token.user_id == admin.pk:
                return raw_token
        return admin_token_create(user=admin, name="demo").raw_token

    def _ensure_tenant(self) -> Tenant:
        tenant = Tenant.objects.filter(slug=DEMO_TENANT).first()
        if tenant is None:
            tenant = services.tenant_create(
                slug=DEMO_TENANT, name="Demo tenant", weight=1.0, quota_units=4, burst_units=4,
                allowed_classes=list(REQUEST_CLASSES),  # the demo shows every class
            )  # fmt: skip
        return tenant

    def _ensure_key(self, tenant: Tenant, raw_key: str | None) -> str:
        if raw_key:
            try:
                if services.api_key_authenticate(raw_key=raw_key).tenant == tenant:
                    return raw_key
            except InvalidApiKey:
                pass
        return services.api_key_create(tenant=tenant, name="demo").raw_key

    def _print(self, base: str, c: dict[str, Any]) -> None:
        lines = [
            "",
            "gpushare is running.",
            f"  OpenAI-compatible API  {base}/v1/   (key below)",
            f"  Admin API              {base}/api/v1/   (docs: {base}/api/docs/)",
            f"  Django admin           {base}/admin/",
            f"  Health / readiness     {base}/healthz  {base}/readyz",
            f"  Admin login            {c['admin_user']} / {c['admin_password']}",
            f"  Admin API token        {c['admin_api_token']}",
            f"  Demo tenant key        {c['demo_api_key']}",
            "",
            "Try a chat completion through the fair queue and the demo engine:",
            f"  curl {base}/v1/chat/completions -H 'Authorization: Bearer {c['demo_api_key']}' \\",
            "    -H 'Content-Type: application/json' \\",
            """    -d '{"model": "demo", "messages": [{"role": "user", "content": "Hi"}], """
            """"max_tokens": 16}'""",
            "",
        ]
        self.stdout.write("\n".join(lines))
