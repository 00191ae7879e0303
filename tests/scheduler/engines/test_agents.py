"""`manage.py engine start|stop` through the engine's agent, with the supervisor's stand-in
vLLM server: the action goes to the node's queue and its progress comes back; without an
agent the command runs the supervisor itself; `engine status` leaves other nodes' engines to
their agents."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from scheduler.engines import agents as control
from scheduler.engines import process
from scheduler.engines.agents import heartbeat
from scheduler.models import Device, Engine, EngineStatus
from tests.scheduler.engines.test_supervisor import NODE
from tests.support.sent_tasks import SentTasks
from workers import engine_tasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A model whose KV cost is known: a ready engine joins the fair queue with its budget."""
    model = tmp_path / "model"
    model.mkdir()
    config = {
        "model_type": "llama", "hidden_size": 128, "num_attention_heads": 2,
        "num_hidden_layers": 2, "num_key_value_heads": 2, "head_dim": 64, "dtype": "bfloat16",
    }  # fmt: skip
    (model / "config.json").write_text(json.dumps(config))
    return model


@pytest.fixture
def agent_queue(sent_tasks: SentTasks) -> SentTasks:
    """The node's agent, in this process: each start or stop sent to it runs at once."""
    sent_tasks.run_at_once(engine_tasks.start_engine)
    sent_tasks.run_at_once(engine_tasks.stop_engine)
    return sent_tasks


def test_with_an_agent_on_its_node_the_command_has_the_agent_start_and_stop_it(
    engine, redis_db, agent_queue, settings
):
    settings.GPUSHARE_ENGINE_DRAIN_TIMEOUT_S = 5
    assert not control.agent_serves(engine.name)
    heartbeat(NODE, 5.0)
    assert control.agent_serves(engine.name)

    out = StringIO()
    call_command("engine", "start", engine.name, stdout=out)
    assert [(c.queue, c.name) for c in agent_queue.calls] == [
        (f"gpushare.node.{NODE}", "workers.engine_start")
    ]
    assert "start requested from manage.py" in out.getvalue()
    assert "KV capacity" in out.getvalue()  # the supervisor's lines, through Redis
    started = Engine.objects.get(pk=engine.pk)
    assert started.status == EngineStatus.READY

    out = StringIO()
    call_command("engine", "stop", engine.name, stdout=out)
    last = agent_queue.calls[-1]
    assert (last.queue, last.name) == (f"gpushare.node.{NODE}", "workers.engine_stop")
    assert f"{engine.name}: stopped" in out.getvalue()
    assert Engine.objects.get(pk=engine.pk).status == EngineStatus.STOPPED
    assert started.pid is not None
    assert not process.is_running(started.pid)


def test_an_agent_that_does_not_finish_is_a_timeout(
    engine, redis_db, monkeypatch, settings, sent_tasks
):
    heartbeat(NODE, 5.0)  # sent_tasks: the message reaches no agent
    monkeypatch.setattr(control, "SLACK_S", 0.0)
    monkeypatch.setattr(control, "POLL_S", 0.05)
    settings.GPUSHARE_ENGINE_START_TIMEOUT_S = 0.3
    with pytest.raises(control.AgentActionTimeout):
        control.agent_start(name=engine.name, on_progress=lambda _: None)


def test_status_does_not_fail_an_engine_whose_process_is_on_another_node(
    engine, settings, redis_db
):
    Engine.objects.filter(pk=engine.pk).update(status=EngineStatus.READY, pid=2**22 + 7)
    settings.GPUSHARE_NODE_NAME = "web-pod"  # the command runs elsewhere than the engine
    call_command("engine", "status", engine.name, stdout=StringIO())
    assert Engine.objects.get(pk=engine.pk).status == EngineStatus.READY
    settings.GPUSHARE_NODE_NAME = NODE
    call_command("engine", "status", engine.name, stdout=StringIO())
    assert Engine.objects.get(pk=engine.pk).status == EngineStatus.FAILED
    assert Device.objects.filter(node=NODE).exists()
