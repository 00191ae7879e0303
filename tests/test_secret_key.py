"""The platform's SECRET_KEY (config/secret_key.py): a set one is used, a placeholder is
refused, and without one every process of a machine shares one random key kept in a file
only its user reads."""

from __future__ import annotations

import stat
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from config.secret_key import secret_key

REPO = Path(__file__).resolve().parent.parent


def test_a_set_key_is_the_key_and_a_placeholder_or_a_short_one_is_refused(tmp_path):
    chosen = "k" * 50
    assert secret_key(chosen, tmp_path / "secret_key") == chosen
    assert not (tmp_path / "secret_key").exists()
    for bad in ("CHANGE-ME", "change-me-in-production", "short"):
        with pytest.raises(ImproperlyConfigured, match="DJANGO_SECRET_KEY"):
            secret_key(bad, tmp_path / "secret_key")


def test_without_one_a_random_key_is_made_once_readable_by_its_user_only(tmp_path):
    path = tmp_path / "var" / "secret_key"
    first = secret_key("", path)
    assert len(first) >= 50
    assert secret_key("", path) == first
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert secret_key("", tmp_path / "elsewhere") != first  # another machine's own
    assert [p.name for p in path.parent.iterdir()] == ["secret_key"]  # no temporary left


def test_processes_that_start_together_agree_on_the_key(tmp_path):
    path = tmp_path / "secret_key"
    with ProcessPoolExecutor(6) as pool:
        keys = set(pool.map(secret_key, [""] * 24, [path] * 24))
    assert keys == {path.read_text().strip()}


def test_the_platform_does_not_start_on_a_placeholder(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "DJANGO_SECRET_KEY": "CHANGE-ME",
           "GPUSHARE_VAR_DIR": str(tmp_path)}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert done.returncode != 0
    assert "DJANGO_SECRET_KEY is a placeholder" in done.stderr
