"""A real Celery worker process, on the real Redis broker, runs the platform's tasks, and
its ticker runs the periodic jobs without beat."""

import json
import os
import sqlite3
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from config.celery import app
from tenants.usage_buffer import PENDING_KEY
from workers.tasks import PING_KEY

REPO = Path(__file__).resolve().parents[2]


def start_worker(settings, output, **env: str) -> subprocess.Popen:
    broker = settings.CELERY_BROKER_URL
    env = {**os.environ, "REDIS_URL": settings.REDIS_URL, "CELERY_BROKER_URL": broker, **env}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "config",
            "worker",
            "--pool",
            "threads",
            "--concurrency",
            "2",
            "--loglevel",
            "WARNING",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ],
        cwd=REPO,
        env=env,
        stdout=output,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.fixture
def worker(redis_db, settings):
    # The ticker would run the periodic jobs on the database of DATABASE_URL, not the test's.
    process = start_worker(settings, subprocess.PIPE, GPUSHARE_WORKER_TICK="0")
    yield process
    process.terminate()
    process.wait(timeout=20)


def test_a_worker_runs_a_task_sent_through_redis(worker, redis_db):
    token = uuid.uuid4().hex
    app.send_task("workers.ping", args=[token])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if redis_db.get(PING_KEY.format(token=token)) == "pong":
            return
        assert worker.poll() is None, worker.stdout.read() if worker.stdout else ""
        time.sleep(0.2)
    pytest.fail("the worker did not run the task within 30 s")


def test_the_celery_settings_that_fairness_relies_on():
    assert app.conf.worker_prefetch_multiplier == 1
    assert app.conf.task_acks_late is True
    assert app.conf.task_reject_on_worker_lost is True
    assert app.conf.accept_content == ["json"]
    assert app.conf.broker_transport_options["visibility_timeout"] >= 3600


def test_a_worker_s_ticker_runs_the_periodic_jobs_without_beat(redis_db, settings, tmp_path):
    """No beat runs: the worker's own ticker flushes a finished request into the ledger."""
    database = f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
    manage = [sys.executable, "manage.py"]
    env = {**os.environ, "DATABASE_URL": database, "REDIS_URL": settings.REDIS_URL}
    subprocess.run([*manage, "migrate", "--noinput"], cwd=REPO, env=env, check=True,
                   capture_output=True)  # fmt: skip
    subprocess.run([*manage, "tenant", "create", "ticked", "--quota-units", "1", "--no-key"],
                   cwd=REPO, env=env, check=True, capture_output=True)  # fmt: skip
    with sqlite3.connect(tmp_path / "ledger.sqlite3") as db:
        (tenant_id,) = db.execute("SELECT id FROM tenants_tenant WHERE slug = 'ticked'").fetchone()
    redis_db.rpush(PENDING_KEY, json.dumps({
        "request_id": "ticked-1", "tenant_id": tenant_id, "model": "m", "outcome": "success",
        "request_class": "standard", "finished_at": datetime.now(UTC).isoformat(),
    }))  # fmt: skip
    log = open(tmp_path / "worker.log", "w")  # noqa: SIM115 - lives with the process
    process = start_worker(settings, log, DATABASE_URL=database, GPUSHARE_WORKER_TICK="1")
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert process.poll() is None, (tmp_path / "worker.log").read_text()
            with sqlite3.connect(tmp_path / "ledger.sqlite3") as db:
                rows = db.execute("SELECT request_id FROM tenants_usagerecord").fetchall()
            if rows and redis_db.llen(PENDING_KEY) == 0:  # inserted, then trimmed
                assert rows == [("ticked-1",)]
                return
            time.sleep(0.2)
        pytest.fail("the ticker did not flush the ledger within 30 s\n"
                    + (tmp_path / "worker.log").read_text())  # fmt: skip
    finally:
        process.terminate()
        process.wait(timeout=20)
        log.close()
