"""`manage.py gpus discover|list`: record this node's GPUs (or its CPU device) and show them."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from capacity.units import format_units
from plumbing.errors import DomainError
from scheduler.gpu_inventory import discover_gpus, node_name
from scheduler.models import Device
from scheduler.selectors import device_list, device_room
from scheduler.services import device_register_cpu, device_register_gpus


class Command(BaseCommand):
    help = "Discover this node's GPUs with pynvml (or register the CPU device) and list devices."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("discover", help="record this node's GPUs, or its CPU device")
        sub.add_parser("list", help="show every device and the units its engines hold")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["action"] == "discover":
            self._discover()
        self._list()

    def _discover(self) -> None:
        node = node_name(settings.GPUSHARE_NODE_NAME)
        inventory = discover_gpus()
        if inventory.available:
            devices = device_register_gpus(node=node, gpus=inventory.gpus)
            self.stdout.write(
                f"{node}: {len(devices)} NVIDIA GPU(s), driver {inventory.driver_version}"
            )
            return
        gib = settings.GPUSHARE_CPU_KVCACHE_GIB
        self.stdout.write(
            f"{node}: no NVIDIA GPU ({inventory.reason}). Registering the CPU device for the "
            f"vllm-cpu engine with {gib} GiB of KV space (GPUSHARE_CPU_KVCACHE_GIB)."
        )
        try:
            device_register_cpu(node=node, kvcache_gib=gib)
        except DomainError as exc:
            self.stderr.write(str(exc))

    def _list(self) -> None:
        devices = list(device_list(present_only=False))
        if not devices:
            self.stdout.write("No devices yet: run `manage.py gpus discover` on each node.")
            return
        for device in devices:
            self.stdout.write(self._line(device))

    def _line(self, device: Device) -> str:
        room = device_room(device=device, live_only=True)
        absent = "" if device.is_present else "  (not seen at last discovery)"
        return (
            f"{device.key:<24} {device.name[:40]:<40} capacity {format_units(room.capacity_units)}"
            f", running engines hold {room.used_units}, free {room.free_units}{absent}"
        )
