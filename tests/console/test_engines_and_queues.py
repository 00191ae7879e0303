"""The console's live pages through Django's test client: the overview (unit grids, engines,
queue depth), engines (list, placement preview, start/drain/stop), queues (the fair queue's
snapshot and the offline gate). The state is real rows and the real Redis (REDIS_URL)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from unittest import mock

import pytest
import redis
from django.contrib.auth.models import User
from django.test import Client

from capacity.units import GIB
from fairqueue import EnginePolicy, TenantPolicy
from scheduler.adapters.loading import loaded_key
from scheduler.engines.progress import action_pending, progress_begin, progress_lines
from scheduler.engines.supervisor import EngineStartError
from scheduler.models import Device, DeviceKind, Engine, EngineStatus
from scheduler.pools.policies import fair_queue
from telemetry.engines import engine_key
from telemetry.gpus import gpu_key
from tenants.models import Tenant
from tests.factories import TenantFactory
from workers.engine_tasks import start_engine

pytestmark = pytest.mark.django_db


@dataclass
class Fleet:
    gpu0: Device
    gpu1: Device
    shared: Engine
    dedicated: Engine
    stopped: Engine
    acme: Tenant
    globex: Tenant


def make_fleet(client: redis.Redis) -> Fleet:
    """Two GPUs: gpu0 (80 GiB = 320 units) runs a shared engine of 64 units and one of 32
    dedicated to acme; gpu1 (24 GiB = 96 units) has a stopped engine of 40 units. In the
    fair queue: acme has 2 interactive jobs waiting and globex 1 offline job running."""
    acme = TenantFactory.create(slug="acme", quota_units=64)
    globex = TenantFactory.create(slug="globex", quota_units=16)
    gpu0, gpu1 = (
        Device.objects.create(
            node="node1",
            kind=DeviceKind.GPU,
            index=index,
            uuid=f"GPU-{index}",
            name=name,
            memory_bytes=gib * GIB,
            capacity_units=gib * 4,
        )
        for index, gib, name in ((0, 80, "NVIDIA A100-SXM4-80GB"), (1, 24, "NVIDIA L4"))
    )

    def engine(name: str, device: Device, units: int, port: int, **extra: object) -> Engine:
        return Engine.objects.create(
            name=name,
            model_path="/models/llama",
            served_model_name="llama",
            device=device,
            footprint_units=units,
            port=port,
            **extra,
        )

    shared = engine("llama-a", gpu0, 64, 8101, status=EngineStatus.READY, kv_capacity_tokens=50_000)
    dedicated = engine(
        "llama-b",
        gpu0,
        32,
        8102,
        status=EngineStatus.READY,
        kv_capacity_tokens=20_000,
        dedicated_tenant=acme,
    )
    stopped = engine("qwen-c", gpu1, 40, 8103, status=EngineStatus.STOPPED)
    queue = fair_queue()
    for tenant in (acme, globex):
        queue.set_tenant_policy(tenant.slug, TenantPolicy(weight=1.0, quota_bytes=16 * GIB))
    queue.set_engine_policy(
        EnginePolicy("llama-a", "llama", kv_budget_bytes=8 * GIB, max_num_seqs=32, load=0.25)
    )
    queue.set_engine_policy(
        EnginePolicy("llama-b", "llama@acme", kv_budget_bytes=4 * GIB, max_num_seqs=16, load=0.6)
    )
    queue.enqueue(
        tenant="globex",
        pool="llama",
        request_class="offline",
        prompt_tokens=10,
        max_tokens=10,
        kv_bytes=GIB // 4,
    )
    assert queue.pick("llama", "llama-a") is not None
    for _ in range(2):
        queue.enqueue(
            tenant="acme",
            pool="llama",
            request_class="interactive",
            prompt_tokens=10,
            max_tokens=10,
            kv_bytes=GIB // 4,
        )
    client.hset(
        gpu_key("node1", 0),
        mapping={"utilization_smoothed": "35.0", "memory_used_bytes": str(41 * GIB), "at": "1"},
    )
    client.hset(
        engine_key("llama-a"),
        mapping={"load": "0.25", "kv_cache_usage": "0.42", "requests_running": "1", "at": "1"},
    )
    return Fleet(gpu0, gpu1, shared, dedicated, stopped, acme, globex)


@pytest.fixture
def fleet(redis_db: redis.Redis) -> Fleet:
    return make_fleet(redis_db)


def _units(html: str, device: Device, kind: str) -> int:
    section = re.search(
        rf'<section class="card device" id="device-{device.pk}".*?</section>', html, re.S
    )
    assert section is not None
    return len(re.findall(rf'class="unit {kind}"', section.group(0)))


def test_the_overview_draws_each_device_as_its_units_held_and_free(console: Client, fleet: Fleet):
    html = console.get("/console/").content.decode()

    assert (_units(html, fleet.gpu0, "used"), _units(html, fleet.gpu0, "free")) == (96, 224)
    # A stopped engine holds no memory: its device is all free.
    assert (_units(html, fleet.gpu1, "used"), _units(html, fleet.gpu1, "free")) == (0, 96)
    assert "96</strong> of 320 units held" in html
    assert "SM 35% · 41 GiB in use" in html  # the GPU sampler's live reading
    assert html.count('data-engine="llama-a"><title>') == 1


def test_a_dedicated_engine_takes_its_tenants_colour(console: Client, fleet: Fleet):
    html = console.get("/console/").content.decode()

    legend = re.search(r'<li><span class="swatch" style="background:(#\w+)"></span>llama-b', html)
    assert legend is not None
    assert "dedicated to acme" in html
    assert legend.group(1) == "#d9480f"  # the first tenant colour, not a shared engine's


def test_the_overview_shows_load_kv_usage_and_queue_depth_per_class(console: Client, fleet: Fleet):
    html = console.get("/console/").content.decode()

    row = re.search(r'<tr data-engine="llama-a">.*?</tr>', html, re.S)
    assert row is not None
    assert "25%" in row.group(0)  # load, from the fair queue
    assert "42%" in row.group(0)  # KV usage, from the telemetry sampler's live hash
    assert "1 / 64" in row.group(0)  # in flight of its seats (32) and queue (32 by default)
    assert "32 seats + 32 in its queue" in row.group(0)
    interactive = re.search(r'id="class-interactive".*?</div>\s*</div>', html, re.S)
    offline = re.search(r'id="class-offline".*?</div>\s*</div>', html, re.S)
    assert interactive is not None
    assert offline is not None
    assert re.search(r'big waiting">2<', interactive.group(0))
    assert re.search(r'big running">1<', offline.group(0))


def test_the_live_fragment_polls_itself_and_has_no_page_frame(console: Client, fleet: Fleet):
    response = console.get("/console/live/overview/")

    html = response.content.decode()
    assert response.status_code == 200
    assert html.lstrip().startswith('<div id="overview-live"')
    assert 'hx-trigger="every 5s"' in html
    assert "<header" not in html
    assert _units(html, fleet.gpu0, "used") == 96


def test_an_overview_without_devices_says_how_to_find_them(console: Client, redis_db: redis.Redis):
    html = console.get("/console/").content.decode()

    assert "gpus discover" in html


def test_the_engine_list_shows_each_engine_with_its_actions(console: Client, fleet: Fleet):
    html = console.get("/console/engines/").content.decode()

    ready = re.search(r'<tr id="engine-llama-a">.*?</tr>', html, re.S)
    stopped = re.search(r'<tr id="engine-qwen-c">.*?</tr>', html, re.S)
    assert ready is not None
    assert stopped is not None
    assert "node1/gpu0" in ready.group(0)
    assert "8101" in ready.group(0)
    assert "50000 tokens" in ready.group(0)
    assert "/console/engines/llama-a/drain/" in ready.group(0)
    assert "/console/engines/llama-a/start/" not in ready.group(0)
    assert "/console/engines/qwen-c/start/" in stopped.group(0)
    assert "dedicated to acme" in html


def test_the_placement_preview_says_where_a_stopped_engine_would_go(console: Client, fleet: Fleet):
    html = console.get("/console/engines/qwen-c/").content.decode()

    assert "fits on node1/gpu1: it takes 40 of the 96 free units there, leaving 56 of 96" in html
    assert html.count('class="unit used"') == 40  # the preview draws it on its device


def test_the_placement_preview_says_why_an_engine_does_not_fit(console: Client, fleet: Fleet):
    Engine.objects.create(
        name="big",
        model_path="/m",
        served_model_name="big",
        device=fleet.gpu1,
        footprint_units=80,
        port=8200,
        status=EngineStatus.READY,
    )

    html = console.get("/console/engines/qwen-c/").content.decode()

    assert "no device has room" in html
    assert "short by 24 units" in html
    assert "node1/gpu0 has room for it" in html


def test_start_runs_the_supervisor_in_a_task_and_the_page_follows_it(console: Client, fleet: Fleet):
    with mock.patch("scheduler.worker_tasks.current_app") as celery:
        response = console.post("/console/engines/qwen-c/start/")

    assert response.status_code == 302
    assert response["Location"] == "/console/engines/qwen-c/"
    # To the engine's node, where its process will run.
    celery.send_task.assert_called_once_with(
        "workers.engine_start", args=("qwen-c",), queue="gpushare.node.node1"
    )
    assert progress_lines("qwen-c")[-1].endswith("start requested from the console")
    # Still stopped (no worker has the task yet), but the page already follows it.
    waiting = console.get("/console/engines/qwen-c/").content.decode()
    assert 'hx-trigger="every 2s"' in waiting
    Engine.objects.filter(name="qwen-c").update(
        status=EngineStatus.STARTING, status_detail="process 42 launched"
    )
    page = console.get("/console/engines/qwen-c/", HTTP_HX_REQUEST="true").content.decode()
    assert page.lstrip().startswith('<section class="card" id="progress"')
    assert 'hx-trigger="every 2s"' in page  # polls while the engine moves
    assert "process 42 launched" in page
    assert "start requested from the console" in page


def test_the_start_task_reports_what_the_supervisor_says(fleet: Fleet):
    def fake_start(*, name: str, on_progress) -> Engine:
        on_progress(f"{name}: healthy after 3 s, warming")
        raise EngineStartError("the engine died while starting")

    progress_begin("qwen-c", "start requested from the console")
    with mock.patch("workers.engine_tasks.engine_start", fake_start):
        assert start_engine("qwen-c") == "failed"

    lines = progress_lines("qwen-c")
    assert not action_pending("qwen-c")  # the page stops following
    assert lines[1].endswith("qwen-c: healthy after 3 s, warming")
    assert lines[2].endswith("start failed: the engine died while starting")


def test_start_is_refused_before_any_task_when_the_device_has_no_room(
    console: Client, fleet: Fleet
):
    Engine.objects.create(
        name="big",
        model_path="/m",
        served_model_name="big",
        device=fleet.gpu1,
        footprint_units=80,
        port=8200,
        status=EngineStatus.READY,
    )
    with mock.patch("scheduler.worker_tasks.current_app") as celery:
        response = console.post("/console/engines/qwen-c/start/", follow=True)

    celery.send_task.assert_not_called()
    assert "qwen-c cannot start" in response.content.decode()


def test_drain_takes_a_ready_engine_out_of_the_fair_queue(console: Client, fleet: Fleet):
    response = console.post("/console/engines/llama-a/drain/", follow=True)

    fleet.shared.refresh_from_db()
    assert fleet.shared.status == EngineStatus.DRAINING
    assert "takes no new work" in response.content.decode()
    queue = fair_queue()
    assert not queue.redis.sismember(queue.keys.pool_engines("llama"), "llama-a")


def test_stop_runs_in_a_task(console: Client, fleet: Fleet):
    with mock.patch("scheduler.worker_tasks.current_app") as celery:
        console.post("/console/engines/llama-b/stop/")

    celery.send_task.assert_called_once_with(
        "workers.engine_stop", args=("llama-b",), queue="gpushare.node.node1"
    )


def test_engine_actions_need_a_post_and_a_known_action(console: Client, fleet: Fleet):
    assert console.get("/console/engines/llama-a/stop/").status_code == 405
    assert console.post("/console/engines/llama-a/explode/").status_code == 404
    assert console.get("/console/engines/nope/").status_code == 404


def test_engine_actions_need_a_csrf_token(staff_user: User, fleet: Fleet):
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff_user)

    assert client.post("/console/engines/llama-a/drain/").status_code == 403
    fleet.shared.refresh_from_db()
    assert fleet.shared.status == EngineStatus.READY


def test_the_queues_page_shows_each_pool_class_and_tenant(console: Client, fleet: Fleet):
    html = console.get("/console/queues/").content.decode()

    acme = re.search(r'<tr data-class="interactive" data-tenant="acme">.*?</tr>', html, re.S)
    globex = re.search(r'<tr data-class="offline" data-tenant="globex">.*?</tr>', html, re.S)
    assert acme is not None
    assert globex is not None
    assert re.search(r'class="num waiting">2<', acme.group(0))
    assert re.search(r'class="num running">1<', globex.group(0))
    assert re.search(r"\d+\.\d s", acme.group(0))  # the oldest wait


def test_the_queues_page_shows_the_offline_gate_of_each_engine(console: Client, fleet: Fleet):
    html = console.get("/console/queues/").content.decode()

    def gate(engine: str) -> str:
        row = re.search(rf'<tr data-engine="{engine}">.*?</tr>', html, re.S)
        assert row is not None
        return row.group(0)

    assert "open" in gate("llama-a")  # 25% < 40%
    assert "under 40%" in gate("llama-a")
    assert "closed" in gate("llama-b")  # 60% >= 40%
    assert "60%, at or over 40%" in gate("llama-b")  # which signal, its value, the threshold
    assert "not in the queue" in gate("qwen-c")
    assert 'data-label="llama-b"' in html  # the gate chart


def test_the_queues_fragment_is_the_live_part(console: Client, fleet: Fleet):
    html = console.get("/console/live/queues/").content.decode()

    assert html.lstrip().startswith('<div id="queues-live"')
    assert "<header" not in html


def test_an_engines_page_shows_the_adapters_it_holds_oldest_first(
    console: Client, fleet: Fleet, redis_db: redis.Redis
):
    Engine.objects.filter(pk=fleet.stopped.pk).update(max_loras=2, max_lora_rank=8)
    redis_db.zadd(loaded_key(fleet.stopped.name), {"acme-b": 2.0, "acme-a": 1.0})
    html = console.get("/console/engines/qwen-c/").content.decode()
    assert (
        "up to 2 loaded, rank &le; 8; holds <code>acme-a</code>, <code>acme-b</code> "
        "(least recently used first)"
    ) in html
    assert 'id="adapters"' not in console.get("/console/engines/llama-a/").content.decode()
