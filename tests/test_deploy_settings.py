"""The production settings docs/OPERATIONS.md documents (DJANGO_HTTPS=true, a secret key, the
allowed hosts) pass Django's deployment check with no warning; plain HTTP does not."""

from __future__ import annotations

import secrets
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def deploy_check(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {
        "PATH": "/usr/bin:/bin",
        "GPUSHARE_VAR_DIR": str(tmp_path),
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
        "DJANGO_ALLOWED_HOSTS": "gpushare.example.com",
    }
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=REPO, env={**base, **env}, capture_output=True, text=True,
    )  # fmt: skip


def test_the_production_settings_pass_the_deploy_check(tmp_path):
    done = deploy_check(tmp_path, DJANGO_HTTPS="true")
    assert done.returncode == 0, done.stderr[-3000:]
    plain = deploy_check(tmp_path)  # served over plain HTTP: cookies that travel in clear
    assert plain.returncode != 0
    assert "SESSION_COOKIE_SECURE" in plain.stderr + plain.stdout
