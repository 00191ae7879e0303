"""A process started as the agent starts an engine cannot read the agent's environment:
every process that loads the platform's settings is not dumpable (config/dumpable.py).

The agent here is a real Python process that loads the settings, with a secret in its
environment, and starts a real child through the supervisor's own `process.spawn`, with an
engine's environment, in a directory of its own; the child tries to read
/proc/<agent>/environ. Both run as one user without privileges: this test's user, or, where
that is root (which may read any process), root without any capability (`setpriv`), as
a same-user process is to another.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

SECRET = "the-agents-secret-0123456789abcdef0123456789"

AGENT = """
import json, os, sys
from pathlib import Path

import django

django.setup()
from config.dumpable import is_dumpable
from scheduler.engines import process
from scheduler.engines.launch import LaunchSpec, engine_env

work = Path(sys.argv[1])
reader = (
    "import os\\n"
    "try:\\n"
    "    data = open(f'/proc/{os.getppid()}/environ', 'rb').read()\\n"
    "    print('read', os.environ['SECRET_NAME'].encode() in data)\\n"
    "except OSError as exc:\\n"
    "    print('refused', exc.errno)\\n"
)
env = {**engine_env(os.environ), "SECRET_NAME": os.environ["DJANGO_SECRET_KEY"][:12]}
pid = process.spawn(
    LaunchSpec(argv=[sys.executable, "-c", reader], env=env),
    log_path=work / "engine.log",
    cwd=process.work_dir(work / "cwd", None),
)
process._children[pid].wait(timeout=60)
print(json.dumps({"dumpable": is_dumpable(), "engine": (work / "engine.log").read_text()}))
"""


def unprivileged() -> list[str]:
    """How to run a command as a user without privileges, of one uid with its children."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root, and no setpriv to drop root's capabilities")
    return [setpriv, "--bounding-set=-all", "--inh-caps=-all", "--"]


def run_agent(tmp_path: Path, *, dumpable: bool) -> dict:
    work = tmp_path / ("dumpable" if dumpable else "not-dumpable")
    work.mkdir()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DJANGO_SECRET_KEY": SECRET,
        "GPUSHARE_VAR_DIR": str(tmp_path / "var"),
        "GPUSHARE_DUMPABLE": "true" if dumpable else "false",
    }
    done = subprocess.run(
        [*unprivileged(), sys.executable, "-c", AGENT, str(work)],
        cwd=settings.BASE_DIR, env=env, capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl and /proc are Linux's")
def test_a_process_started_like_an_engine_cannot_read_the_agents_environment(tmp_path):
    kept = run_agent(tmp_path, dumpable=False)
    assert kept["dumpable"] is False
    assert kept["engine"].split() == ["refused", "13"]  # EACCES
    # The same, with the flag left set (GPUSHARE_DUMPABLE=true): the child reads the secret.
    # What the settings do is what keeps it.
    open_ = run_agent(tmp_path, dumpable=True)
    assert open_["dumpable"] is True
    assert open_["engine"].split() == ["read", "True"]


def test_this_process_which_loaded_the_settings_is_not_dumpable():
    from config.dumpable import is_dumpable

    assert is_dumpable() is (False if sys.platform.startswith("linux") else None)
