"""`GPUSHARE_REDIS_CLUSTER`'s settings (plumbing/redis.py `check_cluster_settings`): what a
Redis Cluster cannot serve is refused when the settings load, with a message that names the
setting to change."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from plumbing.redis import check_cluster_settings

NODE = "redis://10.0.0.5:7000/0"
BROKER = "redis://10.0.0.9:6379/0"


def test_a_cluster_with_a_broker_of_its_own_is_accepted() -> None:
    check_cluster_settings(cluster=True, redis_url=NODE, broker_url=BROKER, sentinels=[])
    check_cluster_settings(cluster=True, redis_url="redis://10.0.0.5:7000", broker_url=BROKER,
                           sentinels=[])  # fmt: skip


@pytest.mark.parametrize(
    ("redis_url", "broker_url", "sentinels", "named"),
    [
        (NODE, NODE, [], "CELERY_BROKER_URL"),  # the default: the broker on the cluster
        (NODE, BROKER, ["10.0.0.7:26379"], "GPUSHARE_REDIS_SENTINELS"),
        ("redis://10.0.0.5:7000/3", BROKER, [], "database 0"),
    ],
)
def test_what_a_cluster_cannot_serve_is_refused(
    redis_url: str, broker_url: str, sentinels: list[str], named: str
) -> None:
    with pytest.raises(ImproperlyConfigured, match=named):
        check_cluster_settings(
            cluster=True, redis_url=redis_url, broker_url=broker_url, sentinels=sentinels
        )


def test_without_a_cluster_nothing_is_checked() -> None:
    check_cluster_settings(cluster=False, redis_url=NODE, broker_url=NODE, sentinels=["h:1"])
