"""Redis Cluster's routing rules, as data: which slot a command goes to, which node serves a
slot, and what a redirect says. Pure: the clients that follow them are
`plumbing/aio_redis_cluster.py` (asyncio) and redis-py's own cluster clients (threads).

A key's slot is redis-py's (`redis.crc.key_slot`: CRC16 of the key, or of its `{hash tag}`).
A command's keys are where Redis's command table puts them for the commands the platform
sends; a command that names keys of several slots is refused by Redis itself (CROSSSLOT).
Commands without a key go to any primary, except those that must reach every primary
(loading a library or a script), as redis-py sends them. `tests/plumbing/test_cluster.py`
holds these rules to redis-py's `RedisCluster.determine_slot` and node choice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

Arg = str | bytes | int | float

_SCRIPTS = frozenset({"EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO", "FCALL", "FCALL_RO"})
_EVERY_KEY = frozenset({"MGET", "DEL", "EXISTS", "UNLINK", "TOUCH", "WATCH", "SDIFF", "SINTER",
                        "SUNION", "PFCOUNT"})  # fmt: skip
_BLOCKING_POPS = frozenset({"BLPOP", "BRPOP", "BZPOPMIN", "BZPOPMAX"})  # keys, then a timeout
_COUNTED_KEYS = frozenset({"LMPOP", "ZMPOP", "SINTERCARD", "ZINTERCARD"})  # numkeys, keys...
_BLOCKING_COUNTED_KEYS = frozenset({"BLMPOP", "BZMPOP"})  # a timeout, numkeys, keys...
_KEYLESS = frozenset({"PING", "WAIT", "INFO", "TIME", "ECHO", "ASKING", "READONLY", "READWRITE",
                      "CLUSTER", "COMMAND", "CLIENT", "CONFIG", "DBSIZE", "FUNCTION", "SCRIPT",
                      "MULTI", "EXEC", "DISCARD", "HELLO", "AUTH", "SELECT"})  # fmt: skip
# Sent to every primary, as redis-py's cluster client sends them (its PRIMARIES flag).
_EVERY_PRIMARY = frozenset({("FUNCTION", "LOAD"), ("FUNCTION", "DELETE"), ("FUNCTION", "FLUSH"),
                            ("SCRIPT", "LOAD"), ("SCRIPT", "FLUSH"), ("SCRIPT", "EXISTS"),
                            ("FLUSHDB",), ("FLUSHALL",)})  # fmt: skip


class CrossSlot(ValueError):
    """Commands meant for one call (a pipeline) whose keys are in different slots."""


def _text(arg: Arg) -> str:
    return arg.decode() if isinstance(arg, bytes) else str(arg)


def _key_bytes(arg: Arg) -> bytes:
    return arg if isinstance(arg, bytes) else str(arg).encode()


def command_keys(args: Sequence[Arg]) -> list[Arg]:
    """The keys `args` (one command) names, in order."""
    name = _text(args[0]).upper()
    if name in _SCRIPTS:
        count = int(_text(args[2]))
        return list(args[3 : 3 + count])
    if name in _KEYLESS or len(args) < 2:
        return []
    if name in _EVERY_KEY:
        return list(args[1:])
    if name in _BLOCKING_POPS:
        return list(args[1:-1])
    if name in _COUNTED_KEYS:
        return list(args[2 : 2 + int(_text(args[1]))])
    if name in _BLOCKING_COUNTED_KEYS:
        return list(args[3 : 3 + int(_text(args[2]))])
    if name in ("MSET", "MSETNX"):
        return list(args[1::2])
    return [args[1]]


def key_slot_of(key: Arg) -> int:
    """The slot of one key (of its `{hash tag}` where it has one)."""
    return key_slot(_key_bytes(key))


def command_slot(args: Sequence[Arg]) -> int | None:
    """The slot of the command's first key; None for a command without one."""
    keys = command_keys(args)
    return key_slot_of(keys[0]) if keys else None


def pipeline_slot(commands: Sequence[Sequence[Arg]]) -> int | None:
    """The one slot the commands' keys are in (None: no keys at all); CrossSlot when they are
    in several: a pipeline is one write to one node."""
    slot: int | None = None
    for command in commands:
        for key in command_keys(command):
            found = key_slot_of(key)
            if slot is None:
                slot = found
            elif found != slot:
                raise CrossSlot(f"the commands' keys are in slots {slot} and {found}")
    return slot


def to_every_primary(args: Sequence[Arg]) -> bool:
    name = tuple(_text(arg).upper() for arg in args[:2])
    return name in _EVERY_PRIMARY or name[:1] in _EVERY_PRIMARY


@dataclass(frozen=True)
class Redirect:
    """A MOVED or ASK reply: `slot` is served by `host`:`port` (for good, or for this key
    while the slot moves)."""

    ask: bool
    slot: int
    host: str
    port: int

    @classmethod
    def parse(cls, message: str) -> Redirect | None:
        """The redirect an error reply's message says ("MOVED 3999 127.0.0.1:6381"), None for
        another error. redis-py raises them as MovedError and AskError, whose message drops
        the first word ("3999 127.0.0.1:6381"); both are read."""
        parts = message.split()
        if parts and parts[0] in ("MOVED", "ASK"):
            kind, parts = parts[0], parts[1:]
        else:
            kind = ""
        if len(parts) != 2 or not parts[0].isdigit() or ":" not in parts[1]:
            return None
        host, _, port = parts[1].rpartition(":")
        return cls(ask=kind == "ASK", slot=int(parts[0]), host=host, port=int(port))


class SlotMap:
    """Which primary serves each slot, from a CLUSTER SLOTS reply."""

    def __init__(self, reply: Sequence[Any], default_host: str) -> None:
        self.owners: list[tuple[str, int] | None] = [None] * REDIS_CLUSTER_HASH_SLOTS
        primaries: set[tuple[str, int]] = set()
        for start, end, primary, *_replicas in reply:
            host = _text(primary[0]) or default_host  # "" or "?": the node we asked
            address = (host if host != "?" else default_host, int(primary[1]))
            primaries.add(address)
            for slot in range(int(start), int(end) + 1):
                self.owners[slot] = address
        self.primaries = sorted(primaries)

    def owner(self, slot: int) -> tuple[str, int] | None:
        return self.owners[slot]

    def moved(self, redirect: Redirect) -> None:
        """A MOVED reply: the slot is served elsewhere now."""
        self.owners[redirect.slot] = (redirect.host, redirect.port)
