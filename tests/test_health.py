import pytest

from scheduler.models import Device, Engine, EngineStatus


def test_healthz_says_the_process_is_alive(client):
    assert client.get("/healthz").json() == {"status": "ok"}


@pytest.fixture
def ready_engine(db) -> Engine:
    device = Device.objects.create(
        node="n1", kind="cpu", index=0, name="cpu", memory_bytes=2**31, capacity_units=8
    )
    return Engine.objects.create(
        name="e1", model_path="/m", served_model_name="m", device=device, footprint_units=4,
        port=8199, status=EngineStatus.READY,
    )  # fmt: skip


@pytest.mark.django_db
def test_readyz_is_ready_when_database_redis_and_an_engine_answer(client, redis_db, ready_engine):
    response = client.get("/readyz")
    assert response.status_code == 200, response.content
    assert response.json()["checks"] == {
        "database": {"ok": True},
        "redis": {"ok": True},
        "engines": {"ok": True},
    }


@pytest.mark.django_db
def test_readyz_says_which_dependency_is_down(client, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    settings.GPUSHARE_READY_TIMEOUT_S = 0.5
    response = client.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["failing"] == ["redis", "engines"]
    assert body["checks"]["database"] == {"ok": True}
    assert "ConnectionError" in body["checks"]["redis"]["error"]
    assert "no engine is ready" in body["checks"]["engines"]["error"]


@pytest.mark.django_db
def test_readyz_leaves_out_the_checks_it_is_told_to(client, redis_db):
    # No engine: the web pods' probe asks for the database and Redis only.
    response = client.get("/readyz?exclude=engines")
    assert response.status_code == 200, response.content
    assert response.json()["checks"] == {"database": {"ok": True}, "redis": {"ok": True}}
    both = client.get("/readyz", {"exclude": ["engines", "redis"]}).json()
    assert both["checks"] == client.get("/readyz?exclude=engines,redis").json()["checks"]
    assert both["checks"] == {"database": {"ok": True}}


@pytest.mark.django_db
def test_readyz_refuses_a_check_it_does_not_know(client):
    response = client.get("/readyz?exclude=engine")
    assert response.status_code == 400
    assert "unknown check(s): engine" in response.json()["error"]
