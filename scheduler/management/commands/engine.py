"""`manage.py engine create|start|stop|status|key`: register and supervise vLLM engines.

`start` waits until the engine is ready (printing progress) and returns; the engine keeps
running detached. Where an engine agent serves the engine's node, `start` and `stop` are
sent to it and followed (scheduler/engines/agents.py); else they run here, on the engine's node.
`status` checks the process and health of each engine of this node, marking dead ones failed.
`key` prints the key the engine accepts (scheduler.engines.auth), for a benchmark or an
operator's check that calls the engine directly.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.management.base import CommandError, CommandParser

from audit.commands import AuditedCommand
from audit.services import audit_record
from plumbing.errors import DomainError
from scheduler.engines.agents import agent_serves, agent_start, agent_stop
from scheduler.engines.auth import engine_api_key
from scheduler.engines.supervisor import (
    engine_health_check,
    engine_log_path,
    engine_start,
    engine_stop,
)
from scheduler.gpu_inventory import node_name
from scheduler.models import Engine
from scheduler.selectors import device_get, engine_get, engine_list
from scheduler.services import engine_create
from tenants.models import Tenant


class Command(AuditedCommand):
    help = "Register, start, stop and inspect vLLM engines."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="register an engine (placement picks a device)")
        create.add_argument("name")
        create.add_argument(
            "--model",
            default=None,
            help="model folder (default: the demo model, GPUSHARE_DEMO_MODEL_DIR)",
        )
        create.add_argument("--served-model-name", default=None, help="default: the name")
        create.add_argument("--device", default=None, help="node/gpu0, gpu0 or cpu0")
        create.add_argument("--units", type=int, default=4, help="footprint, 256 MiB units")
        create.add_argument("--port", type=int, default=8100)
        create.add_argument("--host", default="127.0.0.1")
        create.add_argument("--max-model-len", type=int, default=2048)
        create.add_argument("--max-num-seqs", type=int, default=32)
        create.add_argument("--offline-load-threshold", type=float, default=0.4)
        create.add_argument(
            "--max-loras",
            type=int,
            default=0,
            help="LoRA adapters loaded at once (0: serves none); each takes a slot of its KV",
        )
        create.add_argument("--max-lora-rank", type=int, default=16)
        create.add_argument("--dedicated-to", default=None, help="tenant slug; default: shared")
        create.add_argument(
            "--task",
            choices=("generate", "embed"),
            default="generate",
            help="generate: chat and completions; embed: /v1/embeddings (vLLM's pooling runner)",
        )
        create.add_argument(
            "--if-missing", action="store_true", help="do nothing if the name is registered"
        )
        for action in ("start", "stop"):
            sub.add_parser(action).add_argument("name")
        key = sub.add_parser("key", help="print the key the engine accepts (a secret)")
        key.add_argument("name")
        status = sub.add_parser("status", help="check and show engines (all by default)")
        status.add_argument("name", nargs="?")

    def handle(self, *args: Any, **options: Any) -> None:
        # Every poll of a starting engine is an HTTP request; the progress lines say enough.
        logging.getLogger("httpx").setLevel(logging.WARNING)
        action = options["action"]
        try:
            if action == "create":
                self._create(options)
            elif action == "start":
                start = agent_start if agent_serves(options["name"]) else engine_start
                engine = start(name=options["name"], on_progress=self.stdout.write)
                audit_record(action="engine.start", instance=engine, object_id=engine.name,
                             after={"status": engine.status})  # fmt: skip
                self._show(engine)
            elif action == "stop":
                stop = agent_stop if agent_serves(options["name"]) else engine_stop
                stop(name=options["name"], on_progress=self.stdout.write)
                audit_record(action="engine.stop", object_type="engine", object_id=options["name"])
            elif action == "key":
                self.stdout.write(engine_api_key(engine_get(name=options["name"]).base_url))
            else:
                self._status(options["name"])
        except DomainError as exc:
            raise CommandError(exc.message) from None

    def _create(self, options: dict[str, Any]) -> None:
        name = options["name"]
        if options["if_missing"] and Engine.objects.filter(name=name).exists():
            self.stdout.write(f"Engine '{name}' is registered already.")
            return
        device = (
            device_get(key=options["device"], default_node=node_name(settings.GPUSHARE_NODE_NAME))
            if options["device"]
            else None
        )
        tenant = None
        if options["dedicated_to"]:
            tenant = Tenant.objects.filter(slug=options["dedicated_to"]).first()
            if tenant is None:
                raise CommandError(f"No tenant '{options['dedicated_to']}'.")
        engine = engine_create(
            name=name,
            model_path=options["model"] or str(settings.GPUSHARE_DEMO_MODEL_DIR),
            served_model_name=options["served_model_name"] or name,
            footprint_units=options["units"],
            port=options["port"],
            host=options["host"],
            device=device,
            max_model_len=options["max_model_len"],
            max_num_seqs=options["max_num_seqs"],
            offline_load_threshold=options["offline_load_threshold"],
            dedicated_tenant=tenant,
            task=options["task"],
            max_loras=options["max_loras"],
            max_lora_rank=options["max_lora_rank"],
        )
        self.stdout.write(f"Registered engine '{engine.name}' on {engine.device.key}.")
        self._show(engine)

    def _status(self, name: str | None) -> None:
        engines = [engine_get(name=name)] if name else list(engine_list())
        if not engines:
            self.stdout.write("No engines: register one with `manage.py engine create NAME`.")
        here = node_name(settings.GPUSHARE_NODE_NAME)
        for engine in engines:
            # Another node's engine process cannot be seen from here: its agent checks it.
            self._show(engine_health_check(engine=engine) if engine.device.node == here else engine)

    def _show(self, engine: Engine) -> None:
        kv = (
            f"{engine.kv_capacity_tokens} tokens (block {engine.block_size})"
            if engine.kv_capacity_tokens is not None
            else "unknown until started"
        )
        owner = engine.dedicated_tenant.slug if engine.dedicated_tenant else "shared"
        self.stdout.write(
            f"{engine.name}: {engine.status.upper()}\n"
            f"  model     {engine.served_model_name} <- {engine.model_path} ({engine.task})\n"
            f"  device    {engine.device.key}, {engine.footprint_display}, {owner}\n"
            f"  url       {engine.base_url}  (pid {engine.pid or '-'})\n"
            f"  KV cache  {kv}; max_model_len {engine.max_model_len}, "
            f"max_num_seqs {engine.max_num_seqs}\n"
            f"  log       {engine_log_path(engine)}"
        )
        if engine.max_loras:
            self.stdout.write(
                f"  adapters  up to {engine.max_loras} loaded, rank <= {engine.max_lora_rank}"
            )
        if engine.status_detail:
            self.stdout.write(f"  detail    {engine.status_detail}")
        if engine.health_misses:
            self.stdout.write(f"  health    missed the last {engine.health_misses} checks")
