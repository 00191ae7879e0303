"""BLPOP for the web's waiting requests, over Redis connections of our own (asyncio).

Each request that waits in the fair queue or streams reads its job's events with BLPOP, one
call per event (one for a whole answer, its `done`; one per chunk for a stream). Through
redis-py's asyncio client a call cost 60-100 us of the web's CPU (its connection pool, retry
wrapper, command packing, timeout task and parser layers); here it is one write and one
parsed reply on a connection kept for the next call, about 15 us (bench/blocking_pops.py).

Only BLPOP, nothing else: the web's other Redis work goes through redis-py. Errors are
redis-py's own classes (ConnectionError, TimeoutError, ResponseError), so callers treat a
Redis that is away the same way whichever client met it. A connection that was interrupted
mid-call (its caller cancelled, a timeout, a broken reply) is closed, never reused: its
reply would answer the next caller.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import unquote, urlsplit

import hiredis
import redis


def pack_command(*args: str | bytes) -> bytes:
    """One command in RESP (an array of bulk strings)."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg.encode() if isinstance(arg, str) else arg
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


@dataclass(frozen=True)
class _Address:
    """Where and how to connect, from a redis://, rediss:// or unix:// URL."""

    host: str
    port: int
    path: str  # a unix socket's path, else ""
    tls: bool
    username: str
    password: str
    db: int

    @classmethod
    def from_url(cls, url: str) -> _Address:
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss", "unix"):
            raise ValueError(f"not a Redis URL: {url!r}")
        query = dict(p.split("=", 1) for p in parts.query.split("&") if "=" in p)
        if parts.scheme == "unix":
            db = query.get("db", "0")
        else:
            db = (parts.path or "/0").lstrip("/") or query.get("db", "0")
        return cls(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 6379,
            path=parts.path if parts.scheme == "unix" else "",
            tls=parts.scheme == "rediss",
            username=unquote(parts.username or ""),
            password=unquote(parts.password or ""),
            db=int(db),
        )


class _Connection(asyncio.Protocol):
    """One connection: a command out, its reply back, one call at a time."""

    def __init__(self) -> None:
        self._parser = hiredis.Reader()
        self._reply: asyncio.Future[Any] | None = None
        self._transport: asyncio.Transport | None = None
        self.usable = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # asyncio's or uvloop's (the web's loop under uvicorn), which is not a subclass.
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._parser.feed(data)
        reply = self._parser.gets()
        if reply is False:  # not whole yet
            return
        waiting, self._reply = self._reply, None
        if waiting is None or waiting.done():  # a reply nobody asked for: out of step
            self.close()
            return
        waiting.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.usable = False
        if self._reply is not None and not self._reply.done():
            self._reply.set_exception(
                redis.ConnectionError(f"Redis closed the connection: {exc or 'end of stream'}")
            )

    async def call(self, command: bytes, timeout_s: float) -> Any:
        """Sends `command` and returns its reply; a reply that does not come within
        `timeout_s`, or a call interrupted any other way, closes the connection."""
        assert self._transport is not None
        if not self.usable or self._transport.is_closing():
            raise redis.ConnectionError("the connection to Redis is closed")
        loop = asyncio.get_running_loop()
        self._reply = reply = loop.create_future()
        try:
            self._transport.write(command)
        except (OSError, RuntimeError) as exc:  # closed under us (uvloop raises here)
            self.close()
            raise redis.ConnectionError(f"cannot write to Redis: {exc}") from exc
        timer = loop.call_later(timeout_s, _time_out, reply, timeout_s)
        try:
            result = await reply
        except BaseException:
            self.close()
            raise
        finally:
            timer.cancel()
        if isinstance(result, hiredis.ReplyError):
            raise redis.ResponseError(str(result))
        return result

    def close(self) -> None:
        self.usable = False
        if self._transport is not None:
            self._transport.abort()


def _time_out(reply: asyncio.Future[Any], timeout_s: float) -> None:
    if not reply.done():
        reply.set_exception(redis.TimeoutError(f"no reply from Redis within {timeout_s:g} s"))


class BlockingPops:
    """BLPOP on a pool of at most `max_connections` connections (each call holds one while
    it blocks): a call beyond that waits for one to come back. Made per event loop."""

    def __init__(self, url: str, *, max_connections: int, read_timeout_s: float) -> None:
        self._address = _Address.from_url(url)
        self._read_timeout_s = read_timeout_s
        self._free: list[_Connection] = []
        self._slots = asyncio.Semaphore(max_connections)
        self.max_connections = max_connections

    async def blpop(self, key: str, timeout_s: int) -> tuple[bytes, bytes] | None:
        """The list's first element (key, value), or None when none came within `timeout_s`
        (whole seconds; Redis waits, not us)."""
        command = pack_command("BLPOP", key, str(timeout_s))
        async with self._slots:
            connection = self._kept()
            try:
                reply = await self._call(connection, command, timeout_s)
            except redis.ConnectionError:
                if connection is None:
                    raise
                # A kept connection that Redis closed while it sat here (Redis restarted, or
                # dropped idle clients): nothing was popped through it, so ask again, once,
                # on a new one.
                reply = await self._call(None, command, timeout_s)
        return None if reply is None else (reply[0], reply[1])

    def _kept(self) -> _Connection | None:
        """A connection kept from an earlier call and still open, if any."""
        while self._free:
            connection = self._free.pop()
            if connection.usable:
                return connection
        return None

    async def _call(self, connection: _Connection | None, command: bytes, timeout_s: int) -> Any:
        connection = connection or await self._connect()
        reply = await connection.call(command, timeout_s + self._read_timeout_s)
        if connection.usable:
            self._free.append(connection)
        return reply

    async def _connect(self) -> _Connection:
        address, loop = self._address, asyncio.get_running_loop()
        try:
            if address.path:
                _, connection = await loop.create_unix_connection(_Connection, address.path)
            else:
                tls = ssl.create_default_context() if address.tls else None
                _, connection = await loop.create_connection(
                    _Connection, address.host, address.port, ssl=tls
                )
        except OSError as exc:
            raise redis.ConnectionError(f"cannot connect to Redis: {exc}") from exc
        try:
            if address.password:
                auth = [address.username] if address.username else []
                await connection.call(
                    pack_command("AUTH", *auth, address.password), self._read_timeout_s
                )
            if address.db:
                await connection.call(pack_command("SELECT", str(address.db)), self._read_timeout_s)
        except BaseException:
            connection.close()
            raise
        return connection

    def close(self) -> None:
        for connection in self._free:
            connection.close()
        self._free.clear()
