"""Where the Redis primary is, by asking Redis Sentinel, for the hand-written clients
(`plumbing/raw_redis.py`, `plumbing/aio_redis.py`), and the fence they put behind a write.

The primary is found as redis-py's `Sentinel.discover_master` finds it: each sentinel in
turn is asked for the service's state, the first one that knows a primary it sees up (flags
`master`, neither `s_down` nor `o_down`) answers, and it is asked first from then on. A
sentinel that cannot be reached or that knows no such primary is passed over; none that does
is redis-py's `MasterNotFoundError` (a ConnectionError). A client asks again for each new
connection, so a connection closed by a failover, or one dropped after a `READONLY` reply (a
primary demoted to a replica), reconnects to the primary the sentinels name then.
`tests/plumbing/test_sentinel.py` holds both clients to redis-py's answer on a real failover.

The fence: Redis acknowledges a write once its primary applied it, and a replica promoted
in a failover may not have received it. `WAIT replicas timeout_ms`, sent on the connection
right behind the write, answers how many replicas have it; fewer than asked is
`NotReplicated`, a ConnectionError that carries the primary's answer, so a caller that knows
nothing of fencing takes it as a call that may or may not have happened, which it is
(docs/decisions/0013-fence-the-fair-queue-with-wait.md).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import hiredis
import redis
from redis.asyncio.connection import SSLConnection
from redis.sentinel import DEMOTED_MASTER_UNBLOCKED_ERROR, MasterNotFoundError

Address = tuple[str, int]


def parse_sentinels(items: Sequence[str]) -> tuple[Address, ...]:
    """`host:port` items (the port defaults to 26379, Sentinel's own)."""
    addresses = []
    for item in items:
        host, sep, port = item.strip().rpartition(":")
        if not sep:
            host, port = port, "26379"
        try:
            addresses.append((host.strip("[]"), int(port)))
        except ValueError:
            raise ValueError(f"a sentinel is host:port, got {item!r}") from None
    return tuple(addresses)


@dataclass
class Sentinels:
    """The sentinels that watch the Redis primary named `service`, and how to reach them."""

    addresses: list[Address]
    service: str
    password: str = ""
    username: str = ""
    timeout_s: float = 2.0
    # TLS to the sentinels: redis-py's `ssl_*` options (as `Redis(ssl=True, ...)` takes
    # them); None: plain TCP.
    tls: dict[str, Any] | None = None
    _context: ssl.SSLContext | None = field(default=None, repr=False, compare=False)

    def _tls_context(self) -> ssl.SSLContext | None:
        """The TLS context, built once: redis-py's own from the options (the certificate
        required and its name checked unless they say otherwise). Reads the certificate
        files: called off any event loop."""
        if self.tls is None:
            return None
        if self._context is None:
            self._context = SSLConnection(**self.tls).ssl_context.get()
        return self._context

    def _commands(self) -> list[tuple[str, ...]]:
        commands: list[tuple[str, ...]] = []
        if self.password:
            auth = (self.username,) if self.username else ()
            commands.append(("AUTH", *auth, self.password))
        return [*commands, ("SENTINEL", "MASTER", self.service)]

    def _found(self, index: int, replies: list[Any], errors: list[str]) -> Address | None:
        """The primary `replies` name, when it is up; the sentinel that said so goes first.
        Why not, in `errors`, when it is not."""
        reply = replies[-1]
        if isinstance(reply, hiredis.ReplyError) or not isinstance(reply, list):
            errors.append(f"{self.addresses[index]}: {reply!r}")
            return None
        state = {_text(reply[i]): _text(reply[i + 1]) for i in range(0, len(reply) - 1, 2)}
        flags = state.get("flags", "").split(",")
        if "master" not in flags or "s_down" in flags or "o_down" in flags:
            errors.append(f"{self.addresses[index]}: the primary is {state.get('flags')}")
            return None
        self.addresses[0], self.addresses[index] = self.addresses[index], self.addresses[0]
        return state["ip"], int(state["port"])

    def _not_found(self, errors: list[str]) -> MasterNotFoundError:
        return MasterNotFoundError(f"No master found for {self.service!r} : {', '.join(errors)}")

    def master(self) -> Address:
        """The primary's address (blocking)."""
        errors: list[str] = []
        for index, address in enumerate(list(self.addresses)):
            try:
                replies = _ask(address, self._commands(), self.timeout_s, self._tls_context())
            except OSError as exc:
                errors.append(f"{address}: {exc!r}")
                continue
            found = self._found(index, replies, errors)
            if found is not None:
                return found
        raise self._not_found(errors)

    async def master_async(self) -> Address:
        """The primary's address, from an event loop."""
        errors: list[str] = []
        context = await asyncio.to_thread(self._tls_context) if self.tls else None
        for index, address in enumerate(list(self.addresses)):
            try:
                async with asyncio.timeout(self.timeout_s):
                    replies = await _ask_async(address, self._commands(), context)
            except (OSError, TimeoutError) as exc:
                errors.append(f"{address}: {exc!r}")
                continue
            found = self._found(index, replies, errors)
            if found is not None:
                return found
        raise self._not_found(errors)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _pack(commands: list[tuple[str, ...]]) -> bytes:
    return b"".join(hiredis.pack_command(command) for command in commands)  # type: ignore[arg-type]


def _ask(
    address: Address,
    commands: list[tuple[str, ...]],
    timeout_s: float,
    context: ssl.SSLContext | None = None,
) -> list[Any]:
    reader = hiredis.Reader()
    replies: list[Any] = []
    with socket.create_connection(address, timeout_s) as plain:
        sock = context.wrap_socket(plain, server_hostname=address[0]) if context else plain
        sock.sendall(_pack(commands))
        while len(replies) < len(commands):
            reply = reader.gets()
            if reply is not False:
                replies.append(reply)
                continue
            data = sock.recv(65536)
            if not data:
                raise ConnectionResetError("the sentinel closed the connection")
            reader.feed(data)
    return replies


async def _ask_async(
    address: Address, commands: list[tuple[str, ...]], context: ssl.SSLContext | None = None
) -> list[Any]:
    reader, writer = await asyncio.open_connection(
        *address, ssl=context, server_hostname=address[0] if context else None
    )
    try:
        writer.write(_pack(commands))
        parser, replies = hiredis.Reader(), list[Any]()
        while len(replies) < len(commands):
            reply = parser.gets()
            if reply is not False:
                replies.append(reply)
                continue
            data = await reader.read(65536)
            if not data:
                raise ConnectionResetError("the sentinel closed the connection")
            parser.feed(data)
        return replies
    finally:
        writer.close()


def demoted(error: str) -> bool:
    """Whether an error reply says that the server is a replica now: a write refused
    (`READONLY`), a blocked command let go by the demotion, or the fence's WAIT refused
    (a replica takes no WAIT)."""
    return error.startswith(("READONLY", DEMOTED_MASTER_UNBLOCKED_ERROR)) or (
        error.startswith("ERR WAIT cannot be used with replica")
    )


def refused_for_replicas(error: Exception) -> bool:
    """Whether an error reply is a primary's refusal to write for want of replicas in step
    (`min-replicas-to-write`): the write, a script's first one included, did not run."""
    return str(error).startswith("NOREPLICAS")


def sentinels_of(client: redis.Redis) -> Sentinels | None:
    """The sentinels a redis-py client made by `Sentinel.master_for` asks; None for another."""
    pool = client.connection_pool
    manager = getattr(pool, "sentinel_manager", None)
    if manager is None:
        return None
    addresses = []
    for sentinel in manager.sentinels:
        kw = sentinel.connection_pool.connection_kwargs
        addresses.append((str(kw.get("host", "localhost")), int(kw.get("port", 26379))))
    options = manager.sentinel_kwargs
    tls = {k: v for k, v in options.items() if k.startswith("ssl_")} if options.get("ssl") else None
    return Sentinels(
        addresses=addresses,
        service=str(getattr(pool, "service_name", "")),
        password=options.get("password") or "",
        username=options.get("username") or "",
        timeout_s=float(options.get("socket_timeout") or 2.0),
        tls=tls,
    )


class NotReplicated(redis.ConnectionError):
    """The primary applied a write, but fewer replicas than asked acknowledged it in time: a
    failover now may lose it. `answer` is the primary's answer to the write."""

    def __init__(self, answer: Any, acked: int, wanted: int) -> None:
        super().__init__(f"{acked} of {wanted} replicas acknowledged the write in time")
        self.answer, self.acked, self.wanted = answer, acked, wanted


@dataclass(frozen=True)
class Fence:
    """`WAIT replicas timeout_ms` behind a write; `replicas` 0 puts none."""

    replicas: int = 0
    timeout_ms: int = 1000

    def __bool__(self) -> bool:
        return self.replicas > 0

    def command(self) -> tuple[str, int, int]:
        return ("WAIT", self.replicas, self.timeout_ms)

    @property
    def block_s(self) -> float:
        """How long WAIT itself may block."""
        return self.timeout_ms / 1000

    def check(self, answer: Any, acked: Any) -> Any:
        """`answer`, when at least `replicas` acknowledged the write; else NotReplicated."""
        if int(acked) < self.replicas:
            raise NotReplicated(answer, int(acked), self.replicas)
        return answer


NO_FENCE = Fence()
