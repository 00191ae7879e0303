"""A job whose engine cannot be reached goes back to the queue, and the engine's node's agent
is asked to check it (the dispatch worker cannot see its process); when its process is gone,
the agent fails it and takes it out of the picks, so the job's next pick goes to an engine
that can run it instead of failing three times on the dead one.
Real Redis fair queue and database; the engine call is a real connection to a port that
refuses it."""

from __future__ import annotations

import json
import subprocess

import pytest
from django.conf import settings

from fairqueue.queue import FairQueue
from scheduler import worker_tasks
from scheduler.gpu_inventory import node_name
from scheduler.models import Device, Engine, EngineStatus
from scheduler.pools.policies import fair_queue, sync_all_engines, sync_tenant
from scheduler.worker_tasks import node_queue
from tests.factories import TenantFactory
from tests.support.sent_tasks import SentTasks
from workers import engine_tasks
from workers.dispatch import Dispatcher, run_picked
from workers.runner import Run, RunResult

MODEL = "tiny"
MODEL_CONFIG = {
    "model_type": "llama", "hidden_size": 128, "num_attention_heads": 2,
    "num_hidden_layers": 2, "num_key_value_heads": 2, "head_dim": 64, "dtype": "bfloat16",
}  # fmt: skip
PAYLOAD = {
    "endpoint": "chat", "stream": False, "tenant_id": 1, "model": MODEL,
    "body": {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8},
}  # fmt: skip


def dead_pid() -> int:
    finished = subprocess.Popen(["true"])
    finished.wait()
    return finished.pid


@pytest.fixture
def queue(redis_db, transactional_db) -> FairQueue:
    queue = fair_queue()
    sync_tenant(TenantFactory.create(slug="acme", quota_units=16))
    return queue


def make_engine(node: str, model_dir, name: str, *, port: int, kv_tokens: int) -> Engine:
    device, _ = Device.objects.get_or_create(
        node=node, kind="cpu", index=0,
        defaults={"name": "cpu", "memory_bytes": 2**34, "capacity_units": 64},
    )  # fmt: skip
    # Port 1 refuses connections at once: this engine's process is gone.
    return Engine.objects.create(
        name=name, model_path=str(model_dir), served_model_name=MODEL, device=device,
        footprint_units=4, port=port, status=EngineStatus.READY, kv_capacity_tokens=kv_tokens,
        max_num_seqs=8, pid=dead_pid(),
    )  # fmt: skip


@pytest.fixture(autouse=True)
def agent_checks(sent_tasks: SentTasks) -> SentTasks:
    """The checks the dispatcher sends to the engines' agents; this node's run at once, as
    the node's agent runs them."""
    here = node_queue(node_name(settings.GPUSHARE_NODE_NAME))
    sent_tasks.run_at_once(engine_tasks.check_unreachable, queue=here)
    return sent_tasks


def checks(sent: SentTasks) -> list[tuple[str | None, str]]:
    assert {c.name for c in sent.calls} <= {worker_tasks.ENGINE_CHECK_UNREACHABLE}
    return [(c.queue, c.args[0]) for c in sent.calls]


def run_on_dispatcher(queue: FairQueue, job) -> RunResult:
    dispatcher = Dispatcher(queue=lambda: queue)
    try:
        return dispatcher.run_soon(lambda d: run_picked(d, Run(job))).result(timeout=30)
    finally:
        dispatcher.stop(drain_s=0)


def pick_on_dead_engine(queue: FairQueue):
    queue.enqueue(
        tenant="acme", pool=MODEL, request_class="standard", prompt_tokens=4, max_tokens=8,
        kv_bytes=1024, payload=json.dumps(PAYLOAD),
    )  # fmt: skip
    job = queue.pick(MODEL)
    assert job is not None
    assert job.engine_id == "dead"  # the most free KV
    return job


@pytest.fixture
def model_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(MODEL_CONFIG))
    return tmp_path


def test_a_dead_engine_of_this_node_is_failed_before_its_job_goes_back(
    queue, model_dir, settings, agent_checks
):
    here = node_name(settings.GPUSHARE_NODE_NAME)
    make_engine(here, model_dir, "dead", port=1, kv_tokens=100_000)
    make_engine(here, model_dir, "alive", port=2, kv_tokens=10_000)
    sync_all_engines(queue)
    job = pick_on_dead_engine(queue)

    result = run_on_dispatcher(queue, job)

    assert result.outcome == "requeued"
    assert checks(agent_checks) == [(f"gpushare.node.{here}", "dead")]  # the check is the agent's
    dead = Engine.objects.get(name="dead")
    assert dead.status == EngineStatus.FAILED
    assert "is gone while ready" in dead.status_detail
    assert queue.pool_engines(MODEL) == ["alive"]
    again = queue.pick(MODEL)
    assert again is not None
    assert (again.job_id, again.engine_id) == (job.job_id, "alive")


def test_an_unreachable_engine_of_another_node_is_left_to_its_node(queue, model_dir, agent_checks):
    # Its process is not ours to look at: its own node's periodic check decides.
    make_engine("elsewhere", model_dir, "dead", port=1, kv_tokens=100_000)
    sync_all_engines(queue)
    job = pick_on_dead_engine(queue)

    assert run_on_dispatcher(queue, job).outcome == "requeued"
    assert checks(agent_checks) == [("gpushare.node.elsewhere", "dead")]
    assert Engine.objects.get(name="dead").status == EngineStatus.READY
