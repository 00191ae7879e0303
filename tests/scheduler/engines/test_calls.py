"""What the engine gets of a call, whoever makes it: each tenant's own prefix-cache salt,
never the client's, keyed by the platform's secret; and usage only for a client that asked."""

from __future__ import annotations

from scheduler.engines.calls import affinity_key, cache_salt, cached_tokens, engine_body


def body_for(tenant_id: int, cache_group: str = "", **fields: object) -> dict:
    request = {
        "endpoint": "chat", "stream": False, "tenant_id": tenant_id, "cache_group": cache_group,
        "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields},
    }  # fmt: skip
    return engine_body(request, "standard", 0.0)


def test_each_tenant_gets_a_salt_of_its_own_and_never_the_clients() -> None:
    a, again, b = body_for(1), body_for(1), body_for(2)
    assert a["cache_salt"] == again["cache_salt"]  # a tenant's prefixes are shared
    assert a["cache_salt"] != b["cache_salt"]  # never across tenants
    chosen = body_for(2, cache_salt=a["cache_salt"])  # B asks for A's salt
    assert chosen["cache_salt"] == b["cache_salt"]


def test_tenants_an_operator_put_in_one_group_share_their_salt_and_no_one_else() -> None:
    a, b, c = body_for(1, "research"), body_for(2, "research"), body_for(3, "other")
    assert a["cache_salt"] == b["cache_salt"]
    assert a["cache_salt"] != c["cache_salt"]
    assert a["cache_salt"] != body_for(1)["cache_salt"]  # the group's, not the tenant's own
    assert body_for(5)["cache_salt"] != body_for(9, "5")["cache_salt"]  # never the same scope


def test_the_salt_follows_the_platforms_secret(settings) -> None:
    before = cache_salt(7)
    cache_salt.cache_clear()
    settings.SECRET_KEY = "another secret of at least fifty characters, for the test's sake"
    try:
        assert cache_salt(7) != before  # not computable without the secret
    finally:
        cache_salt.cache_clear()


def test_the_affinity_key_is_the_scope_of_the_salt(settings) -> None:
    assert affinity_key(1) == affinity_key(1)
    assert affinity_key(1) != affinity_key(2)
    assert affinity_key(1, "research") == affinity_key(2, "research")  # the group's prefixes
    assert affinity_key(5) != affinity_key(9, "5")
    # An adapter's jobs go where the adapter and its own prefixes are.
    assert affinity_key(1, adapter="support-bot") not in (affinity_key(1), "")
    assert affinity_key(1, adapter="a") != affinity_key(1, adapter="b")
    assert affinity_key(1, "research", "a") == affinity_key(2, "research", "a")
    settings.GPUSHARE_CACHE_AFFINITY = False
    assert affinity_key(1, adapter="a") == ""
    assert affinity_key(1) == ""  # the job goes where the pick chooses


def test_cached_tokens_are_read_from_either_kind_of_usage() -> None:
    assert cached_tokens({"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 8}}) == 8
    assert cached_tokens({"input_tokens": 9, "input_tokens_details": {"cached_tokens": 4}}) == 4
    assert cached_tokens({"prompt_tokens": 9, "prompt_tokens_details": None}) == 0
    assert cached_tokens(None) == 0
