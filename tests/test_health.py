import pytest


def test_healthz_says_the_process_is_alive(client):
    assert client.get("/healthz").json() == {"status": "ok"}


@pytest.mark.django_db
def test_readyz_is_ready_when_database_and_redis_answer(client, redis_db):
    response = client.get("/readyz")
    assert response.status_code == 200, response.content
    assert response.json()["checks"] == {"database": {"ok": True}, "redis": {"ok": True}}


@pytest.mark.django_db
def test_readyz_says_which_dependency_is_down(client, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    settings.GPUSHARE_READY_TIMEOUT_S = 0.5
    response = client.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["failing"] == ["redis"]
    assert body["checks"]["database"] == {"ok": True}
    assert "ConnectionError" in body["checks"]["redis"]["error"]
