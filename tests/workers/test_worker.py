"""A real Celery worker process, on the real Redis broker, runs the platform's tasks."""

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from config.celery import app
from workers.tasks import PING_KEY

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def worker(redis_db, settings):
    broker = settings.CELERY_BROKER_URL
    env = {**os.environ, "REDIS_URL": settings.REDIS_URL, "CELERY_BROKER_URL": broker}
    process = subprocess.Popen(
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
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
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
