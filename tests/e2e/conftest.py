"""One platform, one real vLLM CPU engine, for the whole end-to-end session.

The engine takes about a minute to start, so it is started once; each test makes its own
tenants, so tests do not see each other's data.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.support.harness import Database, Platform, free_port, start_engine_through_agent

E2E_REDIS_URL = os.environ.get("GPUSHARE_E2E_REDIS_URL", "redis://127.0.0.1:6379/15")
MODEL = "tiny-llama"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def platform_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    model_dir = Path(os.environ.get("GPUSHARE_DEMO_MODEL_DIR", "var/models/tiny-llama"))
    if not (model_dir / "config.json").exists():
        pytest.fail(
            f"The tiny model is missing at {model_dir}: run `make test` (it runs "
            "scripts/setup_vllm.sh and scripts/make_tiny_model.py first)."
        )
    workdir = tmp_path_factory.mktemp("platform")
    database = Database(os.environ.get("DATABASE_URL", ""), workdir)
    redis.Redis.from_url(E2E_REDIS_URL).flushdb()
    platform = Platform(workdir, database_url=database.url, redis_url=E2E_REDIS_URL)
    try:
        platform.start()
        platform.manage("gpus", "discover")
        # A port the kernel hands out as free now; a neighbour of the platform's port may be
        # the local end of one of its Redis or database connections.
        engine_port = str(free_port(avoid={platform.port}))
        platform.manage(
            "engine", "create", MODEL, "--units", "4", "--port", engine_port,
            "--max-model-len", "4096", "--max-num-seqs", "16",
        )  # fmt: skip
        # As the console starts it: through the node's engine agent (test_engine_agent.py).
        start_engine_through_agent(platform, MODEL, timeout=600)
        platform.wait_http("/readyz", timeout=30)
        yield platform
    finally:
        try:
            platform.manage("engine", "stop", MODEL, timeout=120)
        except Exception as exc:  # stopping is best effort; the test result stands
            print(f"engine stop failed: {exc}")
        platform.stop()
        database.drop()


def remove_engine(platform: Platform, name: str, timeout: float = 180) -> None:
    """Stops a module's own engine and removes it: a stopped engine still holds its units on
    the device (16 in all here), which the next modules' engines need."""
    platform.manage("engine", "stop", name, timeout=timeout)
    platform.shell(
        f"from scheduler.models import Engine as E; E.objects.filter(name='{name}').delete(); "
        "print('null')"
    )


def make_tenant(platform: Platform, **options: str) -> tuple[str, str]:
    """A new tenant (slug, raw key) with the given `tenant create` options."""
    slug = f"t-{uuid.uuid4().hex[:8]}"
    args = ["tenant", "create", slug]
    options = {"quota_units": "4", **options}
    for name, value in options.items():
        args += [f"--{name.replace('_', '-')}", *value.split()]
    data = platform.manage_json(*args)
    return slug, data["api_key"]["key"]
