"""The platform installs and loads on every Python pyproject.toml allows, not only on the
development one (3.11): scripts/check_pythons.sh, one Python per test (about half a minute
each once pip's cache holds the wheels). A Python not installed on this machine is skipped."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
OTHER_PYTHONS = ["3.12", "3.13"]


def test_pyproject_allows_the_pythons_checked_here():
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == ">=3.11,<3.14"


@pytest.mark.parametrize("version", OTHER_PYTHONS)
def test_the_platform_installs_and_loads_on(version):
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "check_pythons.sh"), version],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if result.returncode == 0 and "not found" in result.stdout:
        pytest.skip(f"Python {version} is not installed here")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert re.search(
        rf"Python {re.escape(version)}\.\d+: Django \S+, \d+ modules import", result.stdout
    )
