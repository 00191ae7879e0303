"""A real OpenID Connect provider for the portal's sign-in tests: a tiny Django project running
django-oidc-provider, started as a subprocess on a free port (`start_provider`)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[3]


@dataclass
class Provider:
    """A running provider: its base URL, the client the platform signs in as, and the one
    person it knows."""

    process: subprocess.Popen[bytes]
    base_url: str
    client_id: str
    client_secret: str
    username: str
    password: str
    email: str

    def platform_settings(self) -> dict[str, str]:
        """The platform's OIDC_* settings (docs/SSO.md) for this provider."""
        openid = f"{self.base_url}/openid"
        return {
            "OIDC_RP_CLIENT_ID": self.client_id,
            "OIDC_RP_CLIENT_SECRET": self.client_secret,
            "OIDC_RP_SIGN_ALGO": "RS256",
            "OIDC_OP_AUTHORIZATION_ENDPOINT": f"{openid}/authorize",
            "OIDC_OP_TOKEN_ENDPOINT": f"{openid}/token",
            "OIDC_OP_USER_ENDPOINT": f"{openid}/userinfo",
            "OIDC_OP_JWKS_ENDPOINT": f"{openid}/jwks",
        }

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


def start_provider(
    workdir: Path, *, port: int, redirect_uri: str, email: str, password: str = "pw-sso-person"
) -> Provider:
    """Migrates a SQLite file in `workdir`, makes the signing key, the platform's client and
    the person, and serves the provider on 127.0.0.1:`port` until stopped."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.support.oidc_provider.settings",
        "OIDC_TEST_DB": str(workdir / "provider.sqlite3"),
        "OIDC_TEST_SITE_URL": f"http://127.0.0.1:{port}",
        "PYTHONPATH": str(REPO),
    }
    username = email.split("@")[0]
    args = [sys.executable, "-m", "tests.support.oidc_provider.serve", str(port), redirect_uri,
            username, email, password]  # fmt: skip
    log = open(workdir / "provider.log", "wb")  # noqa: SIM115 - lives with the process
    process = subprocess.Popen(args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError((workdir / "provider.log").read_text())
        try:
            if httpx.get(f"{base_url}/openid/jwks", timeout=2).status_code == 200:
                return Provider(process, base_url, "gpushare", "sso-test-secret", username,
                                password, email)  # fmt: skip
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    process.kill()
    raise AssertionError(
        f"the OIDC provider did not answer:\n{(workdir / 'provider.log').read_text()}"
    )
