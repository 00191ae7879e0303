"""Redis from an event loop, over connections of our own (asyncio, hiredis).

Everything the platform's event loops ask of Redis goes through here: the web's admission
(the fair queue's enqueue script, the limits' script), its waits for a job's events, and the
worker's dispatcher (picks, releases, lease renewals, relayed events). A synchronous Redis
call on an event loop stalls every request that loop serves for the length of a round trip,
and far longer when Redis or the machine is busy: it is never made there.

Through redis-py's asyncio client a call cost 60-100 us of the caller's CPU (its connection
pool, retry wrapper, command packing, timeout task and parser layers); here it is one write
and one hiredis-parsed reply on a connection kept for the next call, about 15 us
(bench/aio_redis.py). A pipeline is one write and its replies read in order.

Errors are redis-py's own classes (ConnectionError, TimeoutError, ResponseError,
NoScriptError, ...), so callers treat a Redis that is away the same way whichever client met
it. A command is never sent twice, except BLPOP on a kept connection that Redis had closed
(nothing was popped through it). A connection that was interrupted mid-call (its caller
cancelled, a timeout, a broken reply) is closed, never reused: its reply would answer the
next caller.

Under Redis Sentinel (`sentinels`) each new connection goes to the primary the sentinels
name then (`plumbing/sentinel.py`), as redis-py's do; a `READONLY` reply (a primary demoted
to a replica) closes its connection and is raised as redis-py raises it, a ConnectionError,
and the command is not sent again. `call(..., fence=...)` sends `WAIT` behind the command in
the same write: a write fewer replicas acknowledged than asked is raised as NotReplicated.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import hiredis
import redis
from redis._parsers.base import BaseParser
from redis.asyncio.connection import RedisSSLContext, SSLConnection, parse_url

from plumbing.sentinel import NO_FENCE, Fence, Sentinels, demoted

Arg = str | bytes | int | float


def pack_command(*args: Arg) -> bytes:
    """One command in RESP (an array of bulk strings)."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, bytes):
            data = arg
        elif isinstance(arg, str):
            data = arg.encode()
        else:
            data = repr(arg).encode() if isinstance(arg, float) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


@dataclass(frozen=True)
class _Address:
    """Where and how to connect, as redis-py reads a redis://, rediss:// or unix:// URL: its
    own parser (`redis.asyncio.connection.parse_url`, what `from_url` calls) and, for TLS, its
    own context from the URL's `ssl_*` options with its defaults (the server's certificate
    required and its name checked), so that a URL connects here exactly where it connects
    through redis-py, and fails where it fails there."""

    host: str
    port: int
    path: str  # a unix socket's path, else ""
    tls: RedisSSLContext | None
    username: str
    password: str
    db: int

    @classmethod
    def from_url(cls, url: str) -> _Address:
        kwargs = parse_url(url)
        tls = None
        if kwargs.get("connection_class") is SSLConnection:
            options: dict[str, Any] = {k: v for k, v in kwargs.items() if k.startswith("ssl_")}
            tls = SSLConnection(**options).ssl_context
        return cls(
            host=kwargs.get("host", "localhost"),
            port=kwargs.get("port", 6379),
            path=kwargs.get("path", ""),
            tls=tls,
            username=kwargs.get("username", ""),
            password=kwargs.get("password", ""),
            db=kwargs.get("db", 0),
        )


class _Connection(asyncio.Protocol):
    """One connection: commands out, their replies back, one call at a time."""

    def __init__(self) -> None:
        self._parser = hiredis.Reader()
        self._reply: asyncio.Future[list[Any]] | None = None
        self._expected = 0
        self._replies: list[Any] = []
        self._transport: asyncio.Transport | None = None
        self.usable = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # asyncio's or uvloop's (the web's loop under uvicorn), which is not a subclass.
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._parser.feed(data)
        while True:
            reply = self._parser.gets()
            if reply is False:  # not whole yet
                return
            waiting = self._reply
            if waiting is None or waiting.done():  # a reply nobody asked for: out of step
                self.close()
                return
            self._replies.append(reply)
            if len(self._replies) == self._expected:
                self._reply, replies, self._replies = None, self._replies, []
                waiting.set_result(replies)

    def connection_lost(self, exc: Exception | None) -> None:
        self.usable = False
        if self._reply is not None and not self._reply.done():
            self._reply.set_exception(
                redis.ConnectionError(f"Redis closed the connection: {exc or 'end of stream'}")
            )

    async def call(self, data: bytes, count: int, timeout_s: float) -> list[Any]:
        """Sends `data` (`count` packed commands) and returns their replies in order; replies
        that do not all come within `timeout_s`, or a call interrupted any other way, close
        the connection."""
        assert self._transport is not None
        if not self.usable or self._transport.is_closing():
            raise redis.ConnectionError("the connection to Redis is closed")
        loop = asyncio.get_running_loop()
        self._reply = reply = loop.create_future()
        self._expected, self._replies = count, []
        try:
            self._transport.write(data)
        except (OSError, RuntimeError) as exc:  # closed under us (uvloop raises here)
            self.close()
            raise redis.ConnectionError(f"cannot write to Redis: {exc}") from exc
        timer = loop.call_later(timeout_s, _time_out, reply, timeout_s)
        try:
            return await reply
        except BaseException:
            self.close()
            raise
        finally:
            timer.cancel()

    def close(self) -> None:
        self.usable = False
        if self._transport is not None:
            self._transport.abort()


def _time_out(reply: asyncio.Future[Any], timeout_s: float) -> None:
    if not reply.done():
        reply.set_exception(redis.TimeoutError(f"no reply from Redis within {timeout_s:g} s"))


def raise_errors(replies: list[Any]) -> None:
    """The first error reply among `replies` (those inside a transaction's EXEC too), raised
    as redis-py's class, once every reply was read (the connection stays in step)."""
    for reply in replies:
        for part in reply if isinstance(reply, list) else (reply,):
            if isinstance(part, hiredis.ReplyError):
                raise BaseParser.parse_error(str(part))


class AsyncRedis:
    """Commands on a pool of at most `max_connections` connections (a call holds one while
    it runs, a BLPOP while it blocks): a call beyond that waits for one to come back. Made
    per event loop. `read_timeout_s` is how long a reply may take past what the command
    itself blocks for: it only catches a connection that died silently."""

    def __init__(
        self,
        url: str,
        *,
        max_connections: int,
        read_timeout_s: float,
        sentinels: Sentinels | None = None,
    ) -> None:
        self._address = _Address.from_url(url)
        # When set, they say where the primary is: the URL gives the rest (db, auth, TLS).
        self.sentinels = sentinels
        self._tls: ssl.SSLContext | None = None  # built at the first TLS connection
        self._read_timeout_s = read_timeout_s
        self._free: list[_Connection] = []
        self._slots = asyncio.Semaphore(max_connections)
        self.max_connections = max_connections

    async def call(self, *args: Arg, block_s: float = 0.0, fence: Fence = NO_FENCE) -> Any:
        """One command's reply; `block_s` is how long the command itself may block. With a
        `fence`, its WAIT follows the command in the same write, and a reply it did not see
        replicated raises NotReplicated."""
        if not fence:
            return (await self.pipeline([args], block_s=block_s))[0]
        commands = [args, fence.command()]
        answer, acked = await self.pipeline(commands, block_s=block_s + fence.block_s)
        return fence.check(answer, acked)

    async def pipeline(
        self, commands: Sequence[Sequence[Arg]], *, block_s: float = 0.0, fence: Fence = NO_FENCE
    ) -> list[Any]:
        """The replies of `commands`, sent in one write and read in order. An error reply is
        raised once all replies are read (the first one, as redis-py's class). With a
        `fence`, its WAIT follows them in the same write, and replies it did not see
        replicated raise NotReplicated (its answer: the replies)."""
        if fence:
            *replies, acked = await self.pipeline(
                [*commands, fence.command()], block_s=block_s + fence.block_s
            )
            return list(fence.check(replies, acked))
        replies = await self.replies(commands, block_s=block_s)
        raise_errors(replies)
        return replies

    async def replies(
        self, commands: Sequence[Sequence[Arg]], *, block_s: float = 0.0
    ) -> list[Any]:
        """The replies of `commands` as they came, error replies among them (hiredis's
        ReplyError), for a caller that acts on them (a cluster's redirects)."""
        data = b"".join(pack_command(*command) for command in commands)
        async with self._slots:
            connection = self._kept() or await self._connect()
            replies = await connection.call(data, len(commands), block_s + self._read_timeout_s)
            self._keep(connection, replies)
        return replies

    def at(self, host: str, port: int) -> AsyncRedis:
        """A client of the server at `host`:`port` with this one's options (user, password,
        TLS, timeouts, pool size): a cluster's other nodes."""
        other = AsyncRedis.__new__(AsyncRedis)
        other.__dict__.update(self.__dict__)
        other._address = dataclasses.replace(self._address, host=host, port=port, path="")
        other.sentinels, other._free = None, []
        other._slots = asyncio.Semaphore(self.max_connections)
        return other

    def _keep(self, connection: _Connection, replies: list[Any]) -> None:
        """The connection back to the pool, unless its replies say that its server is a
        replica now (under Sentinel): then it is closed and that is a ConnectionError, as in
        redis-py, and the next connection asks the sentinels."""
        if self.sentinels is not None:
            for reply in replies:
                for part in reply if isinstance(reply, list) else (reply,):
                    if isinstance(part, hiredis.ReplyError) and demoted(str(part)):
                        connection.close()
                        raise redis.ConnectionError("The previous master is now a slave")
        if connection.usable:
            self._free.append(connection)

    async def evalsha(self, sha: str, source: Arg, *args: Arg) -> Any:
        """EVALSHA of a script, loaded first if Redis does not know it (a restart, a flush:
        NOSCRIPT means nothing ran, so the call is made again)."""
        try:
            return await self.call("EVALSHA", sha, *args)
        except redis.exceptions.NoScriptError:
            await self.call("SCRIPT", "LOAD", source)
            return await self.call("EVALSHA", sha, *args)

    async def blpop(self, key: str, timeout_s: int) -> tuple[bytes, bytes] | None:
        """The list's first element (key, value), or None when none came within `timeout_s`
        (whole seconds; Redis waits, not us)."""
        command = pack_command("BLPOP", key, str(timeout_s))
        async with self._slots:
            connection = self._kept()
            try:
                reply = await self._blocking(connection, command, timeout_s)
            except redis.ConnectionError:
                if connection is None:
                    raise
                # A kept connection that Redis closed while it sat here (Redis restarted, or
                # dropped idle clients): nothing was popped through it, so ask again, once,
                # on a new one.
                reply = await self._blocking(None, command, timeout_s)
        raise_errors([reply])
        return None if reply is None else (reply[0], reply[1])

    async def _blocking(
        self, connection: _Connection | None, command: bytes, timeout_s: int
    ) -> Any:
        connection = connection or await self._connect()
        (reply,) = await connection.call(command, 1, timeout_s + self._read_timeout_s)
        self._keep(connection, [reply])
        return reply

    def _kept(self) -> _Connection | None:
        """A connection kept from an earlier call and still open, if any."""
        while self._free:
            connection = self._free.pop()
            if connection.usable:
                return connection
        return None

    async def _connect(self) -> _Connection:
        address, loop = self._address, asyncio.get_running_loop()
        host, port = address.host, address.port
        if self.sentinels is not None:
            host, port = await self.sentinels.master_async()
        try:
            if address.path:
                _, connection = await loop.create_unix_connection(_Connection, address.path)
            else:
                _, connection = await loop.create_connection(
                    _Connection, host, port, ssl=await self._tls_context()
                )
        except OSError as exc:
            raise redis.ConnectionError(f"cannot connect to Redis: {exc}") from exc
        setup: list[bytes] = []
        if address.password:
            auth = [address.username] if address.username else []
            setup.append(pack_command("AUTH", *auth, address.password))
        if address.db:
            setup.append(pack_command("SELECT", str(address.db)))
        try:
            if setup:
                raise_errors(
                    await connection.call(b"".join(setup), len(setup), self._read_timeout_s)
                )
        except BaseException:  # refused (a wrong password): never used unauthenticated
            connection.close()
            raise
        return connection

    async def _tls_context(self) -> ssl.SSLContext | None:
        """The URL's TLS context, None without TLS. Building it reads the certificate files,
        so it is built once, off the loop."""
        if self._address.tls is None:
            return None
        if self._tls is None:
            self._tls = await asyncio.to_thread(self._address.tls.get)
        return self._tls

    def close(self) -> None:
        for connection in self._free:
            connection.close()
        self._free.clear()
