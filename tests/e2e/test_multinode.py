"""Two "nodes" on one machine: one PostgreSQL, one Redis, one web and one beat, and per node
a Celery worker (its own GPUSHARE_NODE_NAME) and a real vLLM CPU engine of the same pool on
its own port, started by the scaler through that node's queue.

Both engines serve, two tenants with equal weights get close shares across them, and taking
node A away (its worker killed, its engine drained and stopped on its node) moves the pool's
work to node B without losing a request.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import redis

from tests.e2e.conftest import E2E_REDIS_URL, make_tenant
from tests.e2e.harness import REPO, Database, Platform, free_port, kill_process

MODEL = "tiny-llama"
NODES = ("node-a", "node-b")
ENGINES = {"node-a": "tiny-llama-1", "node-b": "tiny-llama-2"}
SEQS_PER_ENGINE = 4


def node_env(platform: Platform, node: str) -> dict[str, str]:
    return {**platform.env, "GPUSHARE_NODE_NAME": node}


def manage_on(platform: Platform, node: str, *args: str, timeout: float = 600) -> str:
    result = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=REPO, env=node_env(platform, node),
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    if result.returncode != 0:
        raise AssertionError(f"manage.py {' '.join(args)} on {node} failed:\n{result.stderr}")
    return result.stdout


def spawn_worker(platform: Platform, node: str) -> None:
    name = f"worker-{node}"
    log = open(platform.workdir / f"{name}.log", "wb")  # noqa: SIM115 - lives with the process
    platform.processes[name] = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "config", "worker", "--pool", "threads",
         "--concurrency", "16", "--loglevel", "INFO", "--without-gossip", "--without-mingle",
         "--hostname", f"{name}@%h"],
        cwd=REPO, env=node_env(platform, node), stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip


def pool_state(platform: Platform) -> dict[str, Any]:
    return platform.manage_json("pool", "show", MODEL, "--decisions", "20")[0]


def wait_until(predicate: Any, timeout: float, what: str, platform: Platform) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        platform.assert_alive()
        value = predicate()
        if value:
            return value
        time.sleep(2)
    raise AssertionError(f"{what} not within {timeout:.0f} s\n{platform.logs(60)}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    model_dir = Path(os.environ.get("GPUSHARE_DEMO_MODEL_DIR", "var/models/tiny-llama"))
    if not (model_dir / "config.json").exists():
        pytest.fail(f"The tiny model is missing at {model_dir}: run `make test` first.")
    workdir = tmp_path_factory.mktemp("multinode")
    database = Database(os.environ.get("DATABASE_URL", ""), workdir)
    redis.Redis.from_url(E2E_REDIS_URL).flushdb()
    platform = Platform(workdir, database_url=database.url, redis_url=E2E_REDIS_URL)
    platform.env.update(
        {
            "GPUSHARE_SCALER_INTERVAL_S": "2",
            # A job held by a killed worker goes back to its queue soon.
            "GPUSHARE_SCHED_LEASE_S": "15",
            "GPUSHARE_ENGINE_DRAIN_TIMEOUT_S": "90",
            "GPUSHARE_ENGINE_START_TIMEOUT_S": "600",
        }
    )
    try:
        platform.manage("migrate", "--noinput")
        for node in NODES:
            spawn_worker(platform, node)
            manage_on(platform, node, "gpus", "discover")
        celery = [sys.executable, "-m", "celery", "-A", "config"]
        schedule = str(workdir / "beat-schedule")
        platform._spawn("beat", [*celery, "beat", "--loglevel", "INFO", "--schedule", schedule])
        uvicorn = [sys.executable, "-m", "uvicorn", "config.asgi:application"]
        address = ["--host", "127.0.0.1", "--port", str(platform.port), "--log-level", "warning"]
        platform._spawn("web", [*uvicorn, *address])
        platform.wait_http("/healthz", timeout=60)
        # The pool first, disabled, so the scaler waits until both engines are registered.
        platform.manage(
            "pool", "create", MODEL, "--units", "4", "--hot", "2", "--cold-max", "0",
            "--max-model-len", "1024", "--max-num-seqs", str(SEQS_PER_ENGINE),
        )  # fmt: skip
        platform.manage("pool", "set", MODEL, "--disable")
        for node in NODES:
            platform.manage(
                "pool", "add-engines", MODEL, "--port", str(free_port()),
                "--device", f"{node}/cpu0",
            )  # fmt: skip
        platform.manage("pool", "set", MODEL, "--enable")
        wait_until(
            lambda: set(pool_state(platform)["engines"].values()) == {"ready"},
            timeout=900, what="both engines ready (started by the scaler)", platform=platform,
        )  # fmt: skip
        platform.wait_http("/readyz", timeout=30)
        yield platform
    finally:
        for node, engine in ENGINES.items():
            try:
                manage_on(platform, node, "engine", "stop", engine, timeout=180)
            except Exception as exc:  # stopping is best effort; the result stands
                print(f"engine stop on {node} failed: {exc}")
        platform.stop()
        database.drop()


def client_for(platform: Platform, key: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{platform.base_url}/v1", api_key=key, max_retries=0, timeout=300
    )


def usage_by_engine(platform: Platform, slugs: list[str]) -> dict[str, dict[str, int]]:
    rows = platform.shell(
        "import json; from tenants.models import UsageRecord as U; print(json.dumps(list("
        f"U.objects.filter(tenant__slug__in={slugs!r}).values_list('tenant__slug', 'engine', "
        "'outcome'))))"
    )
    counts: dict[str, dict[str, int]] = {}
    for slug, engine, outcome in rows:
        if outcome == "success":
            counts.setdefault(engine, {}).setdefault(slug, 0)
            counts[engine][slug] += 1
    return counts


class Load:
    """Requests from tenants in threads; each answer (or error) is recorded with its time."""

    def __init__(self, platform: Platform) -> None:
        self.platform = platform
        self.done: list[tuple[float, str, int]] = []
        self.errors: list[str] = []
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()

    def send(self, slug: str, key: str, count: int, max_tokens: int = 16) -> None:
        client = client_for(self.platform, key)

        def one(index: int) -> None:
            try:
                answer = client.chat.completions.create(
                    model=MODEL, max_tokens=max_tokens, extra_body={"ignore_eos": True},
                    messages=[{"role": "user", "content": f"tell me about {index}"}],
                )  # fmt: skip
                tokens = answer.usage.completion_tokens if answer.usage else 0
                with self.lock:
                    self.done.append((time.monotonic(), slug, tokens))
            except Exception as exc:  # recorded: the test says which request was lost
                with self.lock:
                    self.errors.append(f"{slug} #{index}: {exc!r}")

        for index in range(count):
            thread = threading.Thread(target=one, args=(index,))
            thread.start()
            self.threads.append(thread)

    def wait(self, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in self.threads), "requests still running"


def test_both_engines_serve_and_equal_tenants_get_close_shares_across_them(cluster):
    tenants = [make_tenant(cluster, quota_units="8") for _ in range(2)]
    load = Load(cluster)
    per_tenant = 24  # 48 requests for 8 slots: both tenants stay backlogged a long while
    for slug, key in tenants:
        load.send(slug, key, per_tenant)
    load.wait()

    assert load.errors == []
    assert len(load.done) == 2 * per_tenant
    # While both were backlogged (the first half of the answers), shares stay close.
    first_half = sorted(load.done)[:per_tenant]
    shares = {slug: sum(1 for _, s, _ in first_half if s == slug) for slug, _ in tenants}
    assert min(shares.values()) >= 0.35 * per_tenant, shares
    slugs = [slug for slug, _ in tenants]
    by_engine = wait_until(
        lambda: (c := usage_by_engine(cluster, slugs))
        and sum(sum(v.values()) for v in c.values()) == 2 * per_tenant
        and c,
        timeout=60, what="the usage ledger", platform=cluster,
    )  # fmt: skip
    assert set(by_engine) == set(ENGINES.values()), by_engine
    for engine, counts in by_engine.items():
        assert sum(counts.values()) >= 8, (engine, by_engine)  # each engine did real work


def test_the_scaler_started_the_hot_engines_each_on_its_own_node(cluster):
    state = pool_state(cluster)
    starts = [d for d in state["decisions"] if d["action"] == "start"]
    assert starts, state["decisions"]
    assert {e for d in starts for e in d["engines"]} == set(ENGINES.values())
    assert all(d["outcome"] == "done" for d in starts), starts
    assert all("hot size 2" in d["reason"] for d in starts)
    for node in NODES:
        log = (cluster.workdir / f"worker-{node}.log").read_text(errors="replace")
        assert f"gpushare.node.{node}" in log
        assert "workers.scale_engine[" in log  # the start ran on this node's worker


def test_stopping_a_node_moves_its_pools_work_to_the_other_without_losing_a_request(cluster):
    # The operator takes node A out: the scaler must not start its engine again meanwhile.
    cluster.manage("pool", "set", MODEL, "--disable")
    tenants = [make_tenant(cluster, quota_units="8") for _ in range(2)]
    load = Load(cluster)
    for slug, key in tenants:
        load.send(slug, key, 20, max_tokens=48)
    time.sleep(3)  # work is running on both nodes now

    kill_process(cluster, "worker-node-a", signal.SIGKILL)
    manage_on(cluster, "node-a", "engine", "stop", ENGINES["node-a"], timeout=300)
    for slug, key in tenants:  # new work after node A is gone
        load.send(slug, key, 6)
    load.wait()

    assert load.errors == []
    assert len(load.done) == 2 * 26
    engines = cluster.manage_json("pool", "show", MODEL)[0]["engines"]
    assert engines == {ENGINES["node-a"]: "stopped", ENGINES["node-b"]: "ready"}
    check = cluster.manage("scheduler", "check")
    assert "no drift" in check, check
