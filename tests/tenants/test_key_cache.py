"""The per-process cache of live keys (tenants.services._live_keys), with the real Redis and
database: an entry that ran out is read again only when a tenant or a key was saved since
(the tenants' change mark), so a revocation made by another process still bites once the
entry runs out, and a quiet key costs no database read."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import redis
from django.core.exceptions import SynchronousOnlyOperation
from django.utils import timezone

from plumbing import change_marks
from plumbing.change_marks import counts
from plumbing.errors import InvalidApiKey
from tenants import services
from tenants.models import ApiKey, Tenant
from tenants.services import IssuedKey

pytestmark = pytest.mark.django_db

TTL_S = 0.05


@pytest.fixture
def short_lived(monkeypatch: pytest.MonkeyPatch, redis_db: redis.Redis) -> None:
    monkeypatch.setattr(services._live_keys, "ttl_s", TTL_S)


def run_out() -> None:
    time.sleep(TTL_S * 2)


def test_a_key_that_ran_out_is_not_read_again_while_nothing_was_saved(
    short_lived: None, owner_key: IssuedKey, django_assert_num_queries
) -> None:
    services.api_key_authenticate(raw_key=owner_key.raw_key)  # read, and its use written
    run_out()
    with django_assert_num_queries(0):
        assert services.api_key_authenticate(raw_key=owner_key.raw_key).pk == owner_key.api_key.pk


@pytest.mark.parametrize("change", ["key_revoked", "tenant_deactivated"])
def test_a_save_made_by_another_process_bites_once_the_entry_runs_out(
    short_lived: None, owner_key: IssuedKey, django_capture_on_commit_callbacks, change: str
) -> None:
    services.api_key_authenticate(raw_key=owner_key.raw_key)
    # Another process's save: its own rows, not through this process's services (which
    # would clear this process's cache at once).
    with django_capture_on_commit_callbacks(execute=True):
        if change == "key_revoked":
            other_key = ApiKey.objects.get(pk=owner_key.api_key.pk)
            other_key.revoked_at = timezone.now()
            other_key.save(update_fields=["revoked_at"])
        else:
            other_tenant = Tenant.objects.get(pk=owner_key.api_key.tenant_id)
            other_tenant.is_active = False
            other_tenant.save(update_fields=["is_active"])
    run_out()
    with pytest.raises(InvalidApiKey):
        services.api_key_authenticate(raw_key=owner_key.raw_key)


def test_revoking_keys_in_bulk_moves_the_mark_though_an_update_sends_no_signal(
    short_lived: None,
    owner_key: IssuedKey,
    teammate_key: IssuedKey,
    django_capture_on_commit_callbacks,
) -> None:
    services.api_key_authenticate(raw_key=owner_key.raw_key)
    before = counts([services.tenant_changes()])[0]
    with django_capture_on_commit_callbacks(execute=True):
        revoked = services.api_keys_revoke(api_keys=ApiKey.objects.filter(tenant__slug="acme"))
    assert revoked == 2
    assert counts([services.tenant_changes()])[0] != before  # other processes read again
    with pytest.raises(InvalidApiKey):  # this process at once
        services.api_key_authenticate(raw_key=owner_key.raw_key)


def test_on_the_webs_loop_a_key_that_ran_out_is_refreshed_by_a_thread_then_used(
    short_lived: None, owner_key: IssuedKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop neither reads the mark (Redis) nor the row: it hands the step to a thread
    (scheduler.online.admission does), and uses the entry that thread refreshed."""
    monkeypatch.delenv("DJANGO_ALLOW_ASYNC_UNSAFE", raising=False)
    services.api_key_authenticate(raw_key=owner_key.raw_key)  # read, and its use written
    run_out()
    mark_reads: list[int] = []
    counts_of_marks = change_marks.counts

    def counted(marks: list[change_marks.ChangeMark]) -> tuple[str, ...]:
        mark_reads.append(threading.get_ident())
        return counts_of_marks(marks)

    monkeypatch.setattr(change_marks, "counts", counted)

    async def on_the_loop() -> int:
        return services.api_key_authenticate(raw_key=owner_key.raw_key).pk

    with pytest.raises(SynchronousOnlyOperation):
        asyncio.run(on_the_loop())
    assert mark_reads == []
    # The thread's entry must outlast the hop back to a loop however loaded the machine is.
    monkeypatch.setattr(services._live_keys, "ttl_s", 60.0)
    thread = threading.Thread(
        target=services.api_key_authenticate, kwargs={"raw_key": owner_key.raw_key}
    )
    thread.start()
    thread.join(5)
    assert mark_reads == [thread.ident]  # the thread read the mark: unchanged, no query
    assert asyncio.run(on_the_loop()) == owner_key.api_key.pk
