"""`manage.py scheduler check|status|sweep|simulate`: operate and inspect the fair queue.

- check: compare reserved totals with the in-flight jobs; exit 1 on drift (`--repair` sets
  the totals to what the in-flight jobs hold).
- status: queues per pool, class and tenant (waiting, running, oldest wait, VTC counter)
  and the memory each tenant and engine holds.
- sweep: reap expired leases and expire jobs past their queue deadline, once.
- simulate: the deterministic engine simulation with backlogged tenants of the given
  weights, on keys of its own; prints each tenant's share, its target and Jain's index.
"""

import uuid
from typing import Any

import redis
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from capacity.units import UNIT_BYTES, format_units
from fairqueue import FairQueue, FairQueueConfig, config_from_settings
from fairqueue.simulate import SimTenant, simulate
from plumbing.redis import new_client


def _units(nbytes: int) -> str:
    return format_units(round(nbytes / UNIT_BYTES, 2))


class Command(BaseCommand):
    help = "Check, show, sweep or simulate the fair scheduler's queues in Redis."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        check = sub.add_parser("check", help="reserved totals against in-flight jobs")
        check.add_argument("--repair", action="store_true", help="fix the totals")
        sub.add_parser("status", help="queues per pool, class and tenant")
        sub.add_parser("sweep", help="reap expired leases and expire overdue jobs, once")
        sim = sub.add_parser("simulate", help="fairness simulation on a simulated engine")
        sim.add_argument("--weights", default="1,2,3,4", help="tenant weights, e.g. 1,2,3,4")
        sim.add_argument("--ticks", type=int, default=2000)
        sim.add_argument("--seats", type=int, default=8, help="the engine's max_num_seqs")

    def handle(self, *args: Any, **options: Any) -> None:
        client = new_client(settings.REDIS_URL, decode_responses=True)
        action = options["action"]
        if action == "simulate":
            self._simulate(client, options["weights"], options["ticks"], options["seats"])
            return
        fq = FairQueue(client, config_from_settings(settings))
        if action == "check":
            self._check(fq, options["repair"])
        elif action == "status":
            self._status(fq)
        else:
            reaped, expired = fq.reap_expired_leases(), fq.expire_waiting()
            self.stdout.write(f"reaped {len(reaped)} lease(s), expired {len(expired)} job(s)")

    def _check(self, fq: FairQueue, repair: bool) -> None:
        report = fq.check(repair=repair)
        for tenant, (recorded, _) in sorted(report.tenant_reserved.items()):
            self.stdout.write(f"tenant {tenant}: {_units(recorded)} reserved")
        for engine, (recorded, _, jobs, _) in sorted(report.engine_reserved.items()):
            self.stdout.write(f"engine {engine}: {_units(recorded)} reserved, {jobs} in flight")
        if report.ok:
            self.stdout.write(self.style.SUCCESS("no drift"))
            return
        for problem in report.problems:
            self.stderr.write(f"drift: {problem}")
        if repair:
            self.stdout.write(self.style.WARNING("repaired: totals now match in-flight jobs"))
            return
        raise CommandError(f"{len(report.problems)} drift(s) found; --repair fixes the totals")

    def _status(self, fq: FairQueue) -> None:
        snap = fq.snapshot()
        self.stdout.write("pool / class / tenant: waiting, running, oldest wait, counter")
        for row in snap.queues:
            oldest = "-" if row.oldest_wait_s is None else f"{row.oldest_wait_s:.1f}s"
            self.stdout.write(
                f"{row.pool} / {row.request_class} / {row.tenant}: {row.waiting}, "
                f"{row.running}, {oldest}, {row.counter:g}"
            )
        for tenant, nbytes in snap.tenant_reserved_bytes.items():
            self.stdout.write(f"tenant {tenant}: {_units(nbytes)} reserved")
        for engine, nbytes in snap.engine_reserved_bytes.items():
            jobs = snap.engine_inflight[engine]
            self.stdout.write(f"engine {engine}: {_units(nbytes)} reserved, {jobs} in flight")

    def _simulate(self, client: redis.Redis, weights_text: str, ticks: int, seats: int) -> None:
        try:
            weights = [float(w) for w in weights_text.split(",")]
        except ValueError as exc:
            raise CommandError(f"--weights must be numbers separated by commas: {exc}") from exc
        if not weights or min(weights) <= 0:
            raise CommandError("--weights must be positive")
        # Keys of its own, removed after: a simulation never touches the live queues.
        prefix = f"gs:fqsim:{uuid.uuid4().hex}:"
        forever = {"interactive": 1e12, "standard": 1e12, "offline": 1e12}
        fq = FairQueue(
            client, FairQueueConfig(queue_timeouts_s=forever, lease_s=1e12, prefix=prefix)
        )
        tenants = [SimTenant(f"tenant{i + 1}", w) for i, w in enumerate(weights)]
        try:
            result = simulate(fq, tenants, ticks=ticks, seats=seats)
        finally:
            for key in client.scan_iter(match=f"{prefix}*", count=1000):
                client.delete(key)
        shares = result.shares()
        self.stdout.write("tenant   weight   share    target")
        for tenant in tenants:
            target = tenant.weight / sum(weights)
            self.stdout.write(
                f"{tenant.name:8} {tenant.weight:<8g} {shares[tenant.name]:<8.4f} {target:.4f}"
            )
        jain = result.jain({t.name: t.weight for t in tenants})
        self.stdout.write(
            f"Jain's index over service/weight: {jain:.4f} ({len(result.picks)} jobs)"
        )
