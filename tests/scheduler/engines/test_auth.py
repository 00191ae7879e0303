"""Each engine's key: derived from its address under the platform's SECRET_KEY, the same in
every process, different for every engine and for every platform."""

from django.test import override_settings

from scheduler.engines.auth import engine_api_key, engine_auth_headers


def test_the_key_is_the_same_wherever_it_is_computed_and_its_own_for_each_engine():
    key = engine_api_key("http://10.0.0.7:8100")
    assert key == engine_api_key("http://10.0.0.7:8100/")  # Engine.base_url with or without /
    assert len(key) == 64
    assert key != engine_api_key("http://10.0.0.7:8101")
    assert key != engine_api_key("http://10.0.0.8:8100")
    assert engine_auth_headers("http://10.0.0.7:8100") == {"Authorization": f"Bearer {key}"}


def test_another_secret_key_gives_other_keys():
    key = engine_api_key("http://127.0.0.1:8100")
    with override_settings(SECRET_KEY="another platform's secret"):
        assert engine_api_key("http://127.0.0.1:8100") != key
