"""The reliability suite: the whole platform as real processes, put under load and faults.

Every platform here has a Redis of its own (a private `redis-server` on a free port, with
`--appendonly yes` as in production), so a test may kill and restart it without touching the
machine's shared Redis, and its own PostgreSQL database. Two platforms with one engine each
are started in all: the engine-crash module's (it destroys its engine) and the session's.

`make test` runs it in a pytest run of its own, after the rest, so that its platforms never
run beside the end-to-end suite's.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.support.harness import Database, Platform, free_port
from tests.support.redis_sentinel import RedisNode

MODEL = "tiny-llama"
HERE = Path(__file__).parent

# Short enough that a dead worker's jobs come back, and queued work gives up, within a test.
RELIABILITY_ENV = {
    "GPUSHARE_SCHED_LEASE_S": "5",
    "GPUSHARE_SCHED_TIMEOUT_STANDARD_S": "20",
    "GPUSHARE_SCHED_TIMEOUT_INTERACTIVE_S": "20",
    "GPUSHARE_HOUSEKEEPING_INTERVAL_S": "1",
    "GPUSHARE_TELEMETRY_INTERVAL_S": "2",
    "GPUSHARE_AUTH_CACHE_S": "1",
}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "reliability: real processes under load and faults (tests/reliability)"
    )


# The engine-crash module first (its platform is gone before the shared one starts, so only
# one engine runs at a time), the Redis restart last (it is the roughest on the platform).
ORDER = ["test_engine_crash", "test_worker_kill", "test_quotas_under_load", "test_security",
         "test_fuzzing", "test_redis_failover", "test_redis_restart"]  # fmt: skip


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    ours = []
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.reliability)
            ours.append(item)
    rank = {name: i for i, name in enumerate(ORDER)}
    ours.sort(key=lambda item: rank.get(Path(str(item.fspath)).stem, len(ORDER)))
    positions = [i for i, item in enumerate(items) if HERE in Path(str(item.fspath)).parents]
    for position, item in zip(positions, ours, strict=True):
        items[position] = item


class RedisServer(RedisNode):
    """A private redis-server with AOF persistence in a temporary folder."""

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir, "redis")

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self, *args: str, client: redis.Redis | None = None) -> None:
        """SIGKILLed later (`kill`), it keeps what the AOF holds: no shutdown save."""
        super().start(
            "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
            "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
            "--protected-mode", "no", *args, client=client,
        )  # fmt: skip


@dataclass
class Stack:
    platform: Platform
    redis: Any  # a RedisServer, or the failover test's SentinelGroup (both start and stop)
    database: Database
    engine: str

    def fair_queue(self) -> Any:
        """A fair-queue client on this platform's Redis, in the test process."""
        from django.conf import settings

        from fairqueue import FairQueue, config_from_settings

        client = redis.Redis.from_url(self.redis.url(), decode_responses=True)
        return FairQueue(client, config_from_settings(settings))


def start_stack(
    workdir: Path,
    engine: str,
    *,
    max_num_seqs: int = 16,
    server: Any = None,
    env: dict[str, str | None] | None = None,
) -> Stack:
    """A platform with one engine on `server` (started here; a RedisServer of its own by
    default), with `env` over RELIABILITY_ENV (None: the variable unset)."""
    model_dir = Path(os.environ.get("GPUSHARE_DEMO_MODEL_DIR", "var/models/tiny-llama"))
    if not (model_dir / "config.json").exists():
        pytest.fail(f"The tiny model is missing at {model_dir}: run `make test` first.")
    server = server or RedisServer(workdir)
    server.start()
    database = Database(os.environ.get("DATABASE_URL", ""), workdir)
    platform = Platform(workdir, database_url=database.url, redis_url=server.url())
    platform.env.update(RELIABILITY_ENV)
    for name, value in (env or {}).items():
        if value is None:
            platform.env.pop(name, None)
        else:
            platform.env[name] = value
    stack = Stack(platform, server, database, engine)
    try:
        platform.start()
        platform.manage("gpus", "discover")
        platform.manage(
            "engine", "create", engine, "--served-model-name", MODEL, "--units", "4",
            "--port", str(free_port()), "--max-model-len", "4096",
            "--max-num-seqs", str(max_num_seqs),
        )  # fmt: skip
        platform.manage("engine", "start", engine, timeout=600)
        platform.wait_http("/readyz", timeout=60)
    except BaseException:
        stop_stack(stack)
        raise
    return stack


def stop_stack(stack: Stack) -> None:
    try:
        stack.platform.manage("engine", "stop", stack.engine, timeout=120)
    except Exception as exc:  # best effort: the engine may be the one a test killed
        print(f"engine stop failed: {exc}")
    stack.platform.stop()
    stack.redis.stop()
    stack.database.drop()


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix: None) -> None:
    """A test database of the suite's own: other suites on the same server use test_<name>."""
    from django.conf import settings

    database = settings.DATABASES["default"]
    if database["ENGINE"] == "django.db.backends.postgresql":
        database.setdefault("TEST", {})["NAME"] = f"test_gs_reliability_{os.getpid()}"


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The suite's shared platform (one engine, 16 seats) on its own Redis."""
    started = start_stack(tmp_path_factory.mktemp("reliability"), "rel-engine")
    try:
        yield started
    finally:
        stop_stack(started)
