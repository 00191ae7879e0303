"""The agent's own work on its node's engines, with the supervisor's stand-in vLLM server:
the periodic crash check (with its heartbeat) and the drain of every engine when it stops."""

from __future__ import annotations

import os

import pytest

from agent.engines import check_once, drain_node
from agent.main import worker_argv
from scheduler.engines import process
from scheduler.engines.agents import agent_of, heartbeat_end
from scheduler.engines.supervisor import engine_start
from scheduler.models import Engine, EngineStatus
from tests.scheduler.engines.test_supervisor import FAST, NODE, kill_and_wait, pid_of

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_agent_is_a_worker_of_its_nodes_queue_only():
    argv = worker_argv(queue="gpushare.node.n1", node="n1", concurrency=4, loglevel="INFO")
    assert argv[0] == "worker"
    assert argv[argv.index("--queues") + 1] == "gpushare.node.n1"  # not the default queue
    assert argv[argv.index("--pool") + 1] == "threads"
    assert argv[argv.index("--concurrency") + 1] == "4"
    assert argv[argv.index("--hostname") + 1] == "engine-agent@n1"


def test_a_check_fails_a_dead_engine_and_says_the_agent_is_alive(engine, redis_db):
    started = engine_start(name=engine.name, timeouts=FAST)
    assert check_once(NODE, 5.0) == []
    kill_and_wait(pid_of(started))
    assert check_once(NODE, 5.0) == [engine.name]
    dead = Engine.objects.get(pk=engine.pk)
    assert dead.status == EngineStatus.FAILED
    assert "is gone while ready" in dead.status_detail
    seen = agent_of(NODE)
    assert seen is not None
    assert seen["pid"] == os.getpid()
    assert agent_of("another-node") is None
    assert 5 < redis_db.ttl(f"gs:engine-agent:{NODE}") <= 16
    heartbeat_end(NODE)  # an agent that exits says so at once
    assert agent_of(NODE) is None


def test_an_agent_that_stops_drains_and_stops_its_nodes_engines(engine, redis_db, settings):
    settings.GPUSHARE_ENGINE_DRAIN_TIMEOUT_S = 5
    settings.GPUSHARE_ENGINE_STOP_TIMEOUT_S = 5
    pid = pid_of(engine_start(name=engine.name, timeouts=FAST))
    assert drain_node("another-node") == []
    assert process.is_running(pid)
    assert drain_node(NODE) == [engine.name]
    stopped = Engine.objects.get(pk=engine.pk)
    assert stopped.status == EngineStatus.STOPPED
    assert stopped.pid is None
    assert not process.is_running(pid)
