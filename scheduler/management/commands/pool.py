"""`manage.py pool create|set|add-engines|show|tick|targets|reservation`: engine pools.

A pool is the shared engines of one served model: `hot_size` always run, up to `cold_max`
more are started by the scaler (`workers.scaler_tick`, on the workers' ticker) when the online
queue stays over target or ahead of a scheduled peak, and drained after a quiet period.
Engines are registered from the pool's launch profile with `add-engines`; the scaler only
starts and stops registered engines. `show` prints the pool, its engines and the latest
decisions with their reasons; `tick` runs the scaler once, now. `targets` sets a pool's
seat bounds (TTFT targets, fixed seats for the classes below) in place of the settings', and
shows each engine's bounds, measured p99 and seats by class. `reservation` sets what the
pool's requests reserve of the KV (the worst case, or a prediction) in place of the settings',
and shows each engine's budget and reservations and each tenant's predicted output.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.core.management.base import CommandError, CommandParser

from audit.commands import AuditedCommand
from plumbing.errors import DomainError
from scheduler.gpu_inventory import node_name
from scheduler.models import Pool, ScalingDecision
from scheduler.pools.policies import fair_queue, sync_pool_engines
from scheduler.pools.scaler import scaler_tick
from scheduler.reservation.modes import pool_reservation, pool_reservation_set
from scheduler.reservation.report import engine_line as reservation_engine_line
from scheduler.reservation.report import mode_line, pool_reservation_dict
from scheduler.seats.bounds import pool_bounds, pool_targets_set
from scheduler.seats.report import bounds_line, engine_line, pool_seats_dict
from scheduler.selectors import (
    device_get,
    pool_engines,
    pool_get,
    pool_list,
    scaling_decisions,
)
from scheduler.services import pool_add_engines, pool_create, pool_update

# Option name -> model field, for create and set.
POLICY_OPTIONS = {
    "hot": "hot_size",
    "cold_max": "cold_max",
    "target_wait": "target_wait_s",
    "target_depth": "target_depth",
    "sustain": "sustain_s",
    "quiet": "quiet_period_s",
    "peak_lead": "peak_lead_s",
    "peaks": "peaks",
    "timezone": "timezone",
    "max_model_len": "max_model_len",
    "max_num_seqs": "max_num_seqs",
    "offline_load_threshold": "offline_load_threshold",
    "max_loras": "max_loras",
    "max_lora_rank": "max_lora_rank",
    "model": "model_path",
    "units": "footprint_units",
}


def _peaks(text: str) -> list[dict[str, object]]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CommandError(f"--peaks is not JSON: {exc}") from None
    if not isinstance(value, list):
        raise CommandError('--peaks is a JSON list, e.g. [{"start": "11:30", "end": "13:30"}]')
    return value


INHERIT = "inherit"


def _pairs(text: str) -> dict[str, float] | str:
    """CLASS=NUMBER pairs separated by commas; 'none' (an empty mapping) or 'inherit'."""
    if text.strip().lower() == "none":
        return {}
    if text.strip().lower() == INHERIT:
        return INHERIT
    pairs: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        try:
            pairs[key.strip()] = float(value) if sep else float("nan")
        except ValueError:
            raise CommandError(f"{item!r} is not CLASS=NUMBER") from None
        if not sep:
            raise CommandError(f"{item!r} is not CLASS=NUMBER")
    return pairs


def decision_dict(decision: ScalingDecision) -> dict[str, Any]:
    return {
        "pool": decision.pool.served_model_name,
        "at": decision.at.isoformat(),
        "action": decision.action,
        "code": decision.code,
        "reason": decision.reason,
        "engines": decision.engines,
        "outcome": decision.outcome,
        "outcome_detail": decision.outcome_detail,
    }


class Command(AuditedCommand):
    help = "Create and inspect hot/cold engine pools and the scaler's decisions."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="a pool for a served model")
        create.add_argument("name", help="served model name")
        setter = sub.add_parser("set", help="change a pool's policy or launch profile")
        setter.add_argument("name")
        for command in (create, setter):
            command.add_argument("--model", help="model folder (default: the demo model)")
            command.add_argument("--units", type=int, help="engine footprint, 256 MiB units")
            command.add_argument("--hot", type=int, help="engines always running")
            command.add_argument("--cold-max", type=int, help="most engines on top of the hot")
            command.add_argument("--target-wait", type=float, help="seconds, oldest online wait")
            command.add_argument("--target-depth", type=int, help="waiting online jobs")
            command.add_argument("--sustain", type=int, help="seconds over target before a start")
            command.add_argument("--quiet", type=int, help="seconds quiet before a drain")
            command.add_argument("--peak-lead", type=int, help="seconds ahead of a peak")
            command.add_argument("--peaks", type=_peaks, help="JSON list of expected peaks")
            command.add_argument("--timezone", help="time zone of the peaks' times")
            command.add_argument("--max-model-len", type=int)
            command.add_argument("--max-num-seqs", type=int)
            command.add_argument("--offline-load-threshold", type=float)
            command.add_argument("--max-loras", type=int, help="LoRA adapters loaded at once")
            command.add_argument("--max-lora-rank", type=int)
        setter.add_argument("--enable", dest="enabled", action="store_true", default=None)
        setter.add_argument("--disable", dest="enabled", action="store_false")
        add = sub.add_parser("add-engines", help="register engines from the launch profile")
        add.add_argument("name")
        add.add_argument("--count", type=int, default=1)
        add.add_argument("--port", type=int, default=8100, help="first port to try")
        add.add_argument("--host", default="127.0.0.1")
        add.add_argument("--device", default=None, help="node/gpu0, gpu0 or cpu0")
        show = sub.add_parser("show", help="pools, engines and the latest decisions")
        show.add_argument("name", nargs="?")
        show.add_argument("--decisions", type=int, default=10)
        show.add_argument("--json", action="store_true")
        sub.add_parser("tick", help="run the scaler once now")
        targets = sub.add_parser(
            "targets", help="a pool's TTFT targets and fixed seat bounds, and each engine's seats"
        )
        targets.add_argument("name", nargs="?", help="pool id (served model name); all: none")
        targets.add_argument(
            "--ttft-ms", type=_pairs, metavar="CLASS=MS,...|none|inherit",
            help="TTFT p99 targets of the pool (interactive, standard); none: no targets; "
            "inherit: the settings'",
        )  # fmt: skip
        targets.add_argument(
            "--fixed-seats", type=_pairs, metavar="CLASS=SEATS,...|none|inherit",
            help="seats the classes below each class may hold, fixed",
        )  # fmt: skip
        targets.add_argument("--json", action="store_true")
        reservation = sub.add_parser(
            "reservation",
            help="what a pool's requests reserve of the KV (worst case or a prediction), and "
            "each engine's budget, reservations and each tenant's predicted output",
        )
        reservation.add_argument("name", nargs="?", help="pool id (served model name); all: none")
        reservation.add_argument(
            "--mode", choices=["predict", "worst", INHERIT],
            help="the pool's own mode; inherit: GPUSHARE_KV_RESERVATION's",
        )  # fmt: skip
        reservation.add_argument("--json", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        try:
            if action == "create":
                fields = self._fields(options)
                fields.setdefault("model_path", str(settings.GPUSHARE_DEMO_MODEL_DIR))
                fields.setdefault("footprint_units", 4)
                pool = pool_create(served_model_name=options["name"], **fields)
                self.stdout.write(f"Created pool '{pool}'.")
                self._show(pool, 0)
            elif action == "set":
                fields = self._fields(options)
                if options["enabled"] is not None:
                    fields["enabled"] = options["enabled"]
                pool = pool_update(pool=pool_get(served_model_name=options["name"]), **fields)
                self._show(pool, 0)
            elif action == "add-engines":
                self._add(options)
            elif action == "show":
                self._show_all(options)
            elif action == "targets":
                self._targets(options)
            elif action == "reservation":
                self._reservation(options)
            else:
                self.stdout.write(json.dumps(scaler_tick()))
        except DomainError as exc:
            raise CommandError(exc.message) from None

    def _targets(self, options: dict[str, Any]) -> None:
        name, changes = options["name"], {}
        for option, field in (("ttft_ms", "ttft_targets_ms"), ("fixed_seats", "fixed_seats_below")):
            if options[option] is not None:
                changes[field] = None if options[option] == INHERIT else options[option]
        if changes:
            if not name:
                raise CommandError("Name the pool whose targets to set.")
            pool_targets_set(pool=name, **changes)
            sync_pool_engines(name)
        reports = fair_queue().seat_reports(pool=name or None)
        pools = sorted({name} if name else {r.pool for r in reports})
        if options["json"]:
            data = [pool_seats_dict(pool, pool_bounds(pool), reports) for pool in pools]
            self.stdout.write(json.dumps(data, indent=2))
            return
        for pool in pools:
            bounds = pool_bounds(pool)
            self.stdout.write(f"{pool}: {bounds_line(bounds)}")
            for report in (r for r in reports if r.pool == pool):
                self.stdout.write(f"  {report.engine_id}: {engine_line(report)}")

    def _reservation(self, options: dict[str, Any]) -> None:
        name, mode = options["name"], options["mode"]
        if mode is not None:
            if not name:
                raise CommandError("Name the pool whose reservation mode to set.")
            pool_reservation_set(pool=name, mode=None if mode == INHERIT else mode)
            sync_pool_engines(name)
        queue = fair_queue()
        reports = queue.reservation_reports(pool=name or None)
        pools = sorted({name} if name else {r.pool for r in reports})
        if options["json"]:
            data = [
                pool_reservation_dict(
                    pool, pool_reservation(pool), reports, queue.output_predictions(pool)
                )
                for pool in pools
            ]
            self.stdout.write(json.dumps(data, indent=2))
            return
        for pool in pools:
            self.stdout.write(f"{pool}: {mode_line(pool_reservation(pool))}")
            for report in (r for r in reports if r.pool == pool):
                self.stdout.write(f"  {report.engine_id}: {reservation_engine_line(report)}")
            predictions = queue.output_predictions(pool)
            if predictions:
                listed = ", ".join(f"{t} {n}" for t, n in sorted(predictions.items()))
                self.stdout.write(f"  predicted output tokens per sequence: {listed}")

    def _fields(self, options: dict[str, Any]) -> dict[str, Any]:
        return {
            field: options[option]
            for option, field in POLICY_OPTIONS.items()
            if options.get(option) is not None
        }

    def _add(self, options: dict[str, Any]) -> None:
        pool = pool_get(served_model_name=options["name"])
        device = (
            device_get(key=options["device"], default_node=node_name(settings.GPUSHARE_NODE_NAME))
            if options["device"]
            else None
        )
        engines = pool_add_engines(
            pool=pool, count=options["count"], first_port=options["port"],
            host=options["host"], device=device,
        )  # fmt: skip
        for engine in engines:
            self.stdout.write(
                f"Registered engine '{engine.name}' on {engine.device.key} at {engine.base_url}."
            )

    def _show_all(self, options: dict[str, Any]) -> None:
        pools = (
            [pool_get(served_model_name=options["name"])] if options["name"] else list(pool_list())
        )
        if options["json"]:
            data = [
                {
                    "pool": p.served_model_name,
                    "enabled": p.enabled,
                    "hot_size": p.hot_size,
                    "cold_max": p.cold_max,
                    "engines": {e.name: e.status for e in pool_engines(pool=p)},
                    "decisions": [
                        decision_dict(d)
                        for d in scaling_decisions(pool=p, limit=options["decisions"])
                    ],
                }
                for p in pools
            ]
            self.stdout.write(json.dumps(data, indent=2))
            return
        if not pools:
            self.stdout.write("No pools: create one with `manage.py pool create MODEL`.")
        for pool in pools:
            self._show(pool, options["decisions"])

    def _show(self, pool: Pool, decisions: int) -> None:
        state = "" if pool.enabled else " (disabled)"
        self.stdout.write(
            f"{pool.served_model_name}{state}: hot {pool.hot_size}, cold max {pool.cold_max}\n"
            f"  scale up  online wait >= {pool.target_wait_s:g} s or depth >= "
            f"{pool.target_depth} for {pool.sustain_s} s; drain after {pool.quiet_period_s} s "
            f"quiet\n"
            f"  peaks     {json.dumps(pool.peaks) if pool.peaks else 'none'} "
            f"({pool.timezone}, started {pool.peak_lead_s} s ahead)\n"
            f"  profile   {pool.model_path}, {pool.footprint_units} units, max_model_len "
            f"{pool.max_model_len}, max_num_seqs {pool.max_num_seqs}"
            + (
                f", max_loras {pool.max_loras} (rank <= {pool.max_lora_rank})"
                if pool.max_loras
                else ""
            )
        )
        engines = list(pool_engines(pool=pool))
        listed = ", ".join(f"{e.name} {e.status}" for e in engines) or "none registered"
        self.stdout.write(f"  engines   {listed}")
        for decision in scaling_decisions(pool=pool, limit=decisions):
            outcome = "" if decision.outcome == "none" else f" [{decision.outcome}]"
            self.stdout.write(
                f"  {decision.at:%Y-%m-%d %H:%M:%S} {decision.action}{outcome}: {decision.reason}"
            )
