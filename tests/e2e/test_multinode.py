"""Two "nodes" on one machine: one PostgreSQL, one Redis, one S3 bucket (moto's server), one
web and one beat, and per node a Celery worker and an engine agent (their own
GPUSHARE_NODE_NAME) and a real vLLM CPU engine of the same pool on its own port, started by
the scaler through that node's queue, which the node's agent consumes.
The web and each worker have a files folder of their own, as on machines that share no disk:
a batch runs only through the bucket.

The pool has one hot engine (node A) and one cold (node B): the scaler starts the hot one,
starts the cold one when the online queue stays over target, and drains it once the pool is
quiet. With both running, both serve and two tenants with equal weights get close shares
across them; taking node A away (its worker killed, its engine drained and stopped on its
node) moves the pool's work to node B without losing a request.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import openai
import pytest
import redis
from moto.server import ThreadedMotoServer

from fairqueue import FairQueue
from scheduler.pools.policies import engine_queue
from tests.e2e.conftest import make_tenant
from tests.support.harness import REPO, Database, Platform, free_port, kill_process

MODEL = "tiny-llama"
# Not the shared e2e database: the session's platform (tests/e2e/conftest.py) runs beside
# this cluster, and on one Redis database their workers would take each other's tasks
# (ledger flushes into the other's database) and their pools of the same name would mix.
CLUSTER_REDIS_URL = os.environ.get("GPUSHARE_E2E_CLUSTER_REDIS_URL", "redis://127.0.0.1:6379/14")
NODES = ("node-a", "node-b")
ENGINES = {"node-a": "tiny-llama-1", "node-b": "tiny-llama-2"}
SEQS_PER_ENGINE = 4
# Tokens of the cold-start test's answers, which must outlast the web's admission of the
# next requests (the pool's max_model_len is 4096).
LONG_ANSWER = 3600


def node_env(platform: Platform, node: str) -> dict[str, str]:
    return {**platform.env, "GPUSHARE_NODE_NAME": node, **own_disk(platform, node)}


def own_disk(platform: Platform, process: str) -> dict[str, str]:
    """A files folder no other process of the cluster uses (and none should ever write)."""
    return {"GPUSHARE_BATCH_FILES_DIR": str(platform.workdir / f"{process}-disk")}


@pytest.fixture(scope="module")
def s3_bucket() -> Iterator[dict[str, str]]:
    """A bucket on a real S3 server (moto's, over HTTP): the settings that use it."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint, name = f"http://{host}:{port}", "gpushare-multinode"
    credentials = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id="testing", aws_secret_access_key="testing",
    ).create_bucket(Bucket=name)  # fmt: skip
    yield {
        "GPUSHARE_FILES_S3_BUCKET": name, "GPUSHARE_FILES_S3_ENDPOINT_URL": endpoint,
        "GPUSHARE_FILES_S3_REGION": "us-east-1", **credentials,
    }  # fmt: skip
    server.stop()


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
    # One ticker for the cluster, on the node that stays: on SQLite (`make test`), two
    # processes running periodic jobs at once kept each other's writes waiting past SQLite's
    # lock timeout while two engines starved the machine ("database is locked").
    env = {**node_env(platform, node), "GPUSHARE_WORKER_TICK": "1" if node == NODES[-1] else "0"}
    platform.processes[name] = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "config", "worker", "--pool", "threads",
         "--concurrency", "16", "--loglevel", "INFO", "--without-gossip", "--without-mingle",
         "--without-heartbeat", "--hostname", f"{name}@%h"],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip


def spawn_agent(platform: Platform, node: str) -> None:
    """The node's engine agent: it starts, drains and checks that node's engines."""
    name = f"agent-{node}"
    log = open(platform.workdir / f"{name}.log", "wb")  # noqa: SIM115 - lives with the process
    platform.processes[name] = subprocess.Popen(
        [sys.executable, "-m", "agent", "--concurrency", "4"],
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
    raise AssertionError(f"{what} not within {timeout:.0f} s\n{diagnosis(platform)}")


def diagnosis(platform: Platform) -> str:
    """What a failed wait needs explained: the pool's engines and decisions (holds with
    their reasons), the fair queue's rows, then the logs."""
    try:
        state = json.dumps(pool_state(platform), indent=1, default=str)
        queues = FairQueue(redis.Redis.from_url(CLUSTER_REDIS_URL)).snapshot().queues
    except Exception as exc:  # the diagnosis must not hide the failure it explains
        state, queues = f"unavailable: {exc!r}", []
    rows = "\n".join(repr(row) for row in queues)
    return f"--- pool\n{state}\n--- fair queue\n{rows}\n{platform.logs(60)}"


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, s3_bucket: dict[str, str]
) -> Iterator[Platform]:
    model_dir = Path(os.environ.get("GPUSHARE_DEMO_MODEL_DIR", "var/models/tiny-llama"))
    if not (model_dir / "config.json").exists():
        pytest.fail(f"The tiny model is missing at {model_dir}: run `make test` first.")
    workdir = tmp_path_factory.mktemp("multinode")
    database = Database(os.environ.get("DATABASE_URL", ""), workdir)
    redis.Redis.from_url(CLUSTER_REDIS_URL).flushdb()
    platform = Platform(workdir, database_url=database.url, redis_url=CLUSTER_REDIS_URL)
    platform.env.update(
        {
            "GPUSHARE_SCALER_INTERVAL_S": "2",
            # A job held by a killed worker goes back to its queue soon; but not so soon that
            # a worker starved of CPU for a few seconds (two engines and two platforms share
            # two cores in CI) loses the lease of a long answer it is still running (15 s did:
            # the job ran twice, its first run ended as cancelled in the ledger).
            "GPUSHARE_SCHED_LEASE_S": "60",
            "GPUSHARE_ENGINE_DRAIN_TIMEOUT_S": "90",
            "GPUSHARE_ENGINE_START_TIMEOUT_S": "600",
            **s3_bucket,
            **own_disk(platform, "operator"),  # manage.py and beat
        }
    )
    try:
        platform.manage("migrate", "--noinput")
        for node in NODES:
            spawn_worker(platform, node)
            spawn_agent(platform, node)
            manage_on(platform, node, "gpus", "discover")
        celery = [sys.executable, "-m", "celery", "-A", "config"]
        platform._spawn("beat", [*celery, "beat", "--loglevel", "INFO"])
        uvicorn = [sys.executable, "-m", "plumbing.serve", "config.asgi:application"]
        address = ["--host", "127.0.0.1", "--port", str(platform.port), "--log-level", "warning"]
        # Each in-flight request holds one of the web's pooled database connections until it
        # ends (seen here: 32 long requests at once got 500 "couldn't get a connection" with
        # the default 20), so the web gets room for every request these tests have at once.
        web_env = {**platform.env, "DATABASE_POOL_MAX": "56", **own_disk(platform, "web")}
        log = open(workdir / "web.log", "wb")  # noqa: SIM115 - lives with the process
        platform.processes["web"] = subprocess.Popen(
            [*uvicorn, *address], cwd=REPO, env=web_env, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        platform.wait_http("/healthz", timeout=60)
        # The pool first, disabled, so the scaler waits until both engines are registered.
        platform.manage(
            "pool", "create", MODEL, "--units", "4", "--hot", "1", "--cold-max", "1",
            "--target-depth", "4", "--target-wait", "5", "--sustain", "6",
            "--quiet", "100000", "--max-model-len", "4096",
            "--max-num-seqs", str(SEQS_PER_ENGINE),
        )  # fmt: skip
        platform.manage("pool", "set", MODEL, "--disable")
        for node in NODES:
            platform.manage(
                "pool", "add-engines", MODEL, "--port", str(free_port()),
                "--device", f"{node}/cpu0",
            )  # fmt: skip
        platform.manage("pool", "set", MODEL, "--enable")
        wait_until(
            lambda: pool_state(platform)["engines"]
            == {ENGINES["node-a"]: "ready", ENGINES["node-b"]: "stopped"},
            timeout=900, what="the hot engine ready (started by the scaler)", platform=platform,
        )  # fmt: skip
        platform.wait_http("/readyz", timeout=30)
        yield platform
    finally:
        # The scaler first: it would start a hot engine again while the others are stopped.
        try:
            platform.manage("pool", "set", MODEL, "--disable")
        except Exception as exc:  # no pool yet: nothing to disable
            print(f"pool disable failed: {exc}")
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


def ledger_rows(platform: Platform, slugs: list[str]) -> list[dict[str, Any]]:
    """The tenants' ledger rows, each with when it was picked (received + queue wait)."""
    return list(
        platform.shell(
            "import json; from tenants.models import UsageRecord as U; print(json.dumps(["
            "{'slug': r.tenant.slug, 'engine': r.engine, 'outcome': r.outcome, 'picked_ms': "
            "r.finished_at.timestamp() * 1000 - r.latency_ms + r.queue_wait_ms} for r in "
            f"U.objects.filter(tenant__slug__in={slugs!r}).select_related('tenant')]))"
        )
    )


def jobs_of(slug: str) -> tuple[int, int]:
    """The tenant's jobs running and waiting, from the fair queue. The read may wait: two CPU
    engines and two platforms on two cores stall everything for seconds at a time (a CI run
    saw Redis answer a probe after redis-py's default 5 s), which the platform's own clients
    allow for; a probe must not fail the test for it."""
    client = redis.Redis.from_url(CLUSTER_REDIS_URL, socket_timeout=30)
    queues = FairQueue(client).snapshot().queues
    rows = [row for row in queues if row.tenant == slug]
    return sum(row.running for row in rows), sum(row.waiting for row in rows)


class Load:
    """Requests from tenants in threads; each answer (or error) is recorded with its time."""

    def __init__(self, platform: Platform) -> None:
        self.platform = platform
        self.done: list[tuple[float, str, int]] = []
        self.errors: list[str] = []
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()
        self.sent_by: dict[str, int] = {}

    @property
    def sent(self) -> int:
        return sum(self.sent_by.values())

    def outstanding(self, slug: str) -> int:
        """The tenant's requests sent and not yet answered."""
        with self.lock:
            answered = sum(1 for _, who, _ in self.done if who == slug)
        return self.sent_by.get(slug, 0) - answered

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

        self.sent_by[slug] = self.sent_by.get(slug, 0) + count
        for index in range(count):
            thread = threading.Thread(target=one, args=(index,))
            thread.start()
            self.threads.append(thread)

    def wait(self, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in self.threads), "requests still running"


def test_a_queue_over_target_for_long_enough_starts_the_cold_engine_on_its_node(cluster):
    tenants = [make_tenant(cluster, quota_units="8") for _ in range(2)]
    load = Load(cluster)
    # Long answers, kept at about 6 per slot of the hot engine (4 slots, target depth 4)
    # until the scaler decides: the queue stays over target however fast the engine drains
    # it (a fixed 32 could be gone before the window of sustain_s was covered). Answers of
    # 900 tokens were not long enough in CI: the tiny model answered them about as fast as
    # the web, sharing the two cores, admitted new ones, and the queue stayed short.
    deadline = time.monotonic() + 180
    decision = None
    while decision is None:
        assert load.errors == []  # a refused request would keep the queue short
        for slug, key in tenants:
            load.send(slug, key, max(0, 12 - load.outstanding(slug)), max_tokens=LONG_ANSWER)
        decisions = pool_state(cluster)["decisions"]
        decision = next((d for d in decisions if d["code"] == "sustained"), None)
        if decision is None and time.monotonic() > deadline:
            raise AssertionError(f"no sustained start within 180 s\n{diagnosis(cluster)}")
        time.sleep(2)
    assert decision["action"] == "start"
    assert decision["engines"] == [ENGINES["node-b"]]
    assert "waiting" in decision["reason"]
    wait_until(
        lambda: pool_state(cluster)["engines"][ENGINES["node-b"]] == "ready",
        timeout=900, what="the cold engine ready", platform=cluster,
    )  # fmt: skip
    load.wait()
    assert load.errors == []
    assert len(load.done) == load.sent
    log = (cluster.workdir / "agent-node-b.log").read_text(errors="replace")
    assert "workers.scale_engine[" in log  # started by node B's own engine agent


def test_both_engines_serve_and_a_late_tenant_gets_an_equal_share_across_them(cluster):
    """Tenant A floods both engines; tenant B (same weight) arrives while A's backlog is
    long. First come first served would run B after all of A's; the fair queue shares the
    two engines' slots between them from B's arrival on. Shares are counted on the
    scheduler's picks (from the ledger): when answers arrive depends on each engine's speed,
    which two CPU engines sharing two cores make uneven."""
    (slug_a, key_a), (slug_b, key_b) = [make_tenant(cluster, quota_units="8") for _ in range(2)]
    load = Load(cluster)
    # Long answers: the web admits A's 48 requests faster than the two engines (sharing two
    # cores with it) finish them, so A's backlog builds up.
    load.send(slug_a, key_a, 48, max_tokens=900)

    # Every seat of both engines and every place in their queues is A's, and A has a backlog
    # of at least three times B's 8 requests: sharing fairly, B is done long before A's
    # backlog is.
    in_flight = 2 * (SEQS_PER_ENGINE + engine_queue(SEQS_PER_ENGINE))

    def a_holds_everything() -> bool:
        running, waiting = jobs_of(slug_a)
        return running == in_flight and waiting >= 24

    wait_until(a_holds_everything, timeout=120, what="A on both engines, 24 waiting",
               platform=cluster)  # fmt: skip
    load.send(slug_b, key_b, 8, max_tokens=900)
    load.wait()

    assert load.errors == []
    assert len(load.done) == 56
    slugs = [slug_a, slug_b]
    rows = wait_until(
        lambda: len(found := ledger_rows(cluster, slugs)) == 56 and found,
        timeout=60, what="the usage ledger", platform=cluster,
    )  # fmt: skip
    assert {row["outcome"] for row in rows} == {"success"}, rows
    picks = [row["slug"] for row in sorted(rows, key=lambda row: row["picked_ms"])]
    b_picks = [i for i, slug in enumerate(picks) if slug == slug_b]
    assert b_picks[-1] < len(picks) - 1 - picks[::-1].index(slug_a)  # B not behind A's backlog
    # From B's first pick to its last, B got about half of the picks (all of them if A had
    # been starved, none before A's backlog was done with first come first served).
    during = picks[b_picks[0] : b_picks[-1] + 1]
    share_b = during.count(slug_b) / len(during)
    assert 0.3 <= share_b <= 0.7, (share_b, picks)
    served = [row["engine"] for row in rows]
    by_engine = {engine: served.count(engine) for engine in ENGINES.values()}
    assert min(by_engine.values()) >= SEQS_PER_ENGINE, by_engine  # each did real work


def test_a_batch_runs_when_the_web_and_the_workers_share_only_the_bucket(cluster, s3_bucket):
    _, key = make_tenant(cluster, quota_units="8")
    client = client_for(cluster, key)
    lines = [
        {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": MODEL, "max_tokens": 4, "ignore_eos": True,
                  "messages": [{"role": "user", "content": f"line {i}"}]}}
        for i in range(3)
    ]  # fmt: skip
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    uploaded = client.files.create(file=("in.jsonl", content), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )

    def finished() -> Any:
        seen = client.batches.retrieve(batch.id)
        return seen if seen.status in ("completed", "failed", "expired", "cancelled") else None

    done = wait_until(finished, timeout=600, what="the batch", platform=cluster)
    assert done.status == "completed", done
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (3, 0)
    assert done.output_file_id is not None
    output = [
        json.loads(line) for line in client.files.content(done.output_file_id).text.splitlines()
    ]
    assert sorted(o["custom_id"] for o in output) == ["r0", "r1", "r2"]
    assert all(o["response"]["status_code"] == 200 for o in output)
    # The web wrote the upload and a worker the output, each through the bucket: no
    # process's own folder holds a file.
    on_disk = [path for path in cluster.workdir.glob("*-disk/**/*") if path.is_file()]
    assert on_disk == []
    objects = boto3.client(
        "s3", endpoint_url=s3_bucket["GPUSHARE_FILES_S3_ENDPOINT_URL"], region_name="us-east-1",
        aws_access_key_id="testing", aws_secret_access_key="testing",
    ).list_objects_v2(Bucket=s3_bucket["GPUSHARE_FILES_S3_BUCKET"])  # fmt: skip
    assert len(objects.get("Contents", [])) >= 2  # the input and the output


def test_the_scaler_started_each_engine_on_its_own_node_and_logged_why(cluster):
    state = pool_state(cluster)
    starts = {d["code"]: d for d in state["decisions"] if d["action"] == "start"}
    assert set(starts) == {"floor", "sustained"}, state["decisions"]
    assert starts["floor"]["engines"] == [ENGINES["node-a"]]
    assert "hot size 1" in starts["floor"]["reason"]
    assert starts["sustained"]["engines"] == [ENGINES["node-b"]]
    assert all(d["outcome"] == "done" for d in starts.values()), starts
    for node in NODES:
        log = (cluster.workdir / f"agent-{node}.log").read_text(errors="replace")
        assert f"gpushare.node.{node}" in log
        assert "workers.scale_engine[" in log  # the start ran on this node's engine agent
        worker_log = (cluster.workdir / f"worker-{node}.log").read_text(errors="replace")
        assert "workers.scale_engine[" not in worker_log


def test_stopping_a_node_moves_its_pools_work_to_the_other_without_losing_a_request(cluster):
    # The operator takes node A out: the scaler must not start its engine again meanwhile.
    cluster.manage("pool", "set", MODEL, "--disable")
    tenants = [make_tenant(cluster, quota_units="8") for _ in range(2)]
    load = Load(cluster)
    for slug, key in tenants:
        load.send(slug, key, 20, max_tokens=48)
    time.sleep(3)  # work is running on both nodes now

    kill_process(cluster, "worker-node-a", signal.SIGKILL)
    cluster.processes.pop("worker-node-a")  # gone on purpose: not a failure of the platform
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


def test_a_quiet_pool_drains_its_cold_engine_through_the_scaler(cluster):
    # Node A is gone; node B's engine is the only one. With no hot engine wanted, a quiet
    # pool drains it on node B.
    cluster.manage("pool", "set", MODEL, "--hot", "0", "--quiet", "10", "--enable")

    def drained() -> dict[str, Any] | None:
        state = pool_state(cluster)
        drains = [d for d in state["decisions"] if d["action"] == "drain"]
        if drains and drains[0]["outcome"] == "done":
            return {"decision": drains[0], "engines": state["engines"]}
        return None

    result = wait_until(drained, timeout=180, what="a quiet drain", platform=cluster)
    assert result["decision"]["code"] == "quiet"
    assert result["decision"]["engines"] == [ENGINES["node-b"]]
    assert set(result["engines"].values()) == {"stopped"}
