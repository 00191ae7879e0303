"""Redis commands on the hot path over connections of our own: one per thread, sync.

A worker's turn (release and pick, one script call) and the web's enqueue each cost about
80 us of the caller's CPU through redis-py 8 (its connection pool, retry wrapper,
observability hooks and command packing), twice what the call itself needs: here a call is
one `hiredis.pack_command`, one `sendall` and a hiredis-parsed reply on a connection the
thread keeps (bench/raw_redis.py). Only the fair queue's script calls, its loops' waits and
its events come here (it lives beside the fair queue, which has no Django in it);
everything else stays on redis-py.

What keeps it as safe as redis-py:
- A kept connection that Redis closed while it sat unused (a restart, idle clients dropped)
  is readable: it is checked before each use and replaced, and nothing was sent on it.
- A command is never sent twice. A connection that fails once the command is on its way
  (a reset, a timeout, a reply cut short) is closed and the error raised, as redis-py's
  ConnectionError or TimeoutError: the command may or may not have run, and only the
  caller knows whether running it again is harmless.
- Error replies are redis-py's own exception classes (NoScriptError, ResponseError, ...),
  those inside a transaction's EXEC too, and a pipeline reads every reply before it raises,
  so the connection stays in step.
- TLS, unix sockets and Redis Cluster are left to redis-py (`RawRedis.like` returns None
  for them).
- Under Redis Sentinel (a client of redis-py's `Sentinel.master_for`) each new connection
  goes to the primary the sentinels name then (`plumbing/sentinel.py`), as redis-py's
  connections do; a `READONLY` reply (a primary demoted to a replica) closes the connection
  and is raised as redis-py raises it, a ConnectionError: the command did not run there,
  and the next call asks the sentinels again. The command is not sent again.
- `call(..., fence=...)` sends `WAIT` behind the command in the same write
  (`plumbing.sentinel.Fence`): a write fewer replicas acknowledged than asked is raised
  as NotReplicated, with the primary's answer.
"""

from __future__ import annotations

import os
import select
import socket
import threading
from collections.abc import Sequence
from typing import Any

import hiredis
import redis
from redis._parsers.base import BaseParser
from redis.sentinel import SentinelManagedConnection

from plumbing.sentinel import NO_FENCE, Fence, Sentinels, demoted, sentinels_of

Arg = str | bytes | int | float


class _Connection:
    def __init__(self, sock: socket.socket, decode: bool, timeout_s: float | None) -> None:
        self.sock = sock
        self.timeout_s = timeout_s  # as set on the socket: set again only when it changes
        self.reader = hiredis.Reader(encoding="utf-8") if decode else hiredis.Reader()
        self.pid = os.getpid()
        # poll, not select: select() refuses a descriptor above 1024, which a web with a few
        # hundred clients open reaches.
        self.poller = select.poll()
        self.poller.register(sock, select.POLLIN)

    def closed_by_peer(self) -> bool:
        """Readable (or hung up) while idle: Redis closed it (or sent what nobody asked for)."""
        return bool(self.poller.poll(0))

    def close(self) -> None:
        self.sock.close()


class RawRedis:
    def __init__(
        self,
        *,
        host: str,
        port: int,
        db: int = 0,
        username: str | None = None,
        password: str | None = None,
        socket_timeout_s: float | None = None,
        connect_timeout_s: float | None = None,
        decode_responses: bool = False,
        sentinels: Sentinels | None = None,
    ) -> None:
        self.host, self.port, self.db = host, port, db
        self.sentinels = sentinels  # when set, they say where the primary is (host, port)
        self.username, self.password = username, password
        self.socket_timeout_s, self.connect_timeout_s = socket_timeout_s, connect_timeout_s
        self.decode_responses = decode_responses
        self._local = threading.local()

    @classmethod
    def like(cls, client: redis.Redis) -> RawRedis | None:
        """One that talks to the same Redis as `client`, with its settings; None where
        `client` does what this does not (TLS, a unix socket, another connection class, a
        cluster: redis-py's RedisCluster routes each call itself)."""
        pool = getattr(client, "connection_pool", None)
        if pool is None:
            return None
        sentinels = sentinels_of(client)
        if pool.connection_class is not (
            redis.Connection if sentinels is None else SentinelManagedConnection
        ):
            return None
        kw = pool.connection_kwargs
        defaults = redis.Connection.__init__.__kwdefaults__ or {}
        return cls(
            host=kw.get("host", "localhost"),
            port=int(kw.get("port", 6379)),
            db=int(kw.get("db", 0)),
            username=kw.get("username"),
            password=kw.get("password"),
            socket_timeout_s=kw.get("socket_timeout", defaults.get("socket_timeout")),
            connect_timeout_s=kw.get(
                "socket_connect_timeout", defaults.get("socket_connect_timeout")
            ),
            decode_responses=bool(kw.get("decode_responses", False)),
            sentinels=sentinels,
        )

    # --- calls ------------------------------------------------------------------------------

    def call(self, *args: Arg, block_s: float = 0.0, fence: Fence = NO_FENCE) -> Any:
        """One command's reply; `block_s` is how long the command itself may block (BLPOP's
        timeout), added to the socket timeout. With a `fence`, its WAIT follows the command
        in the same write, and a reply it did not see replicated raises NotReplicated."""
        if not fence:
            return self.pipeline([args], block_s=block_s)[0]
        answer, acked = self.pipeline([args, fence.command()], block_s=block_s + fence.block_s)
        return fence.check(answer, acked)

    def pipeline(self, commands: Sequence[Sequence[Arg]], *, block_s: float = 0.0) -> list[Any]:
        """The replies of `commands`, sent in one write and read in order. An error reply is
        raised once all replies are read (the first one, as redis-py's class)."""
        connection = self._connection()
        try:
            self._send(connection, commands, block_s)
            replies = [self._read(connection) for _ in commands]
        except BaseException:
            self._drop(connection)
            raise
        for reply in replies:
            # EXEC answers a list that holds each queued command's error, as redis-py raises.
            for part in reply if isinstance(reply, list) else (reply,):
                if isinstance(part, hiredis.ReplyError):
                    self._demoted(connection, str(part))
                    raise BaseParser.parse_error(str(part))
        return replies

    def _demoted(self, connection: _Connection, error: str) -> None:
        """Under Sentinel, an error that says the primary was demoted closes the connection and
        is a ConnectionError, as in redis-py: the next connection asks the sentinels."""
        if self.sentinels is not None and demoted(error):
            self._drop(connection)
            raise redis.ConnectionError("The previous master is now a slave")

    def _timeout(self, block_s: float) -> float | None:
        return None if self.socket_timeout_s is None else self.socket_timeout_s + block_s

    def _send(
        self, connection: _Connection, commands: Sequence[Sequence[Arg]], block_s: float
    ) -> None:
        # hiredis's stub types the argument as a tuple of one element; it takes any length.
        packed = (hiredis.pack_command(tuple(command)) for command in commands)  # type: ignore[arg-type]
        data = b"".join(packed)
        timeout_s = self._timeout(block_s)
        try:
            if connection.timeout_s != timeout_s:
                connection.sock.settimeout(timeout_s)
                connection.timeout_s = timeout_s
            connection.sock.sendall(data)
        except TimeoutError as exc:
            raise redis.TimeoutError("Timeout writing to Redis") from exc
        except OSError as exc:
            raise redis.ConnectionError(f"Error writing to Redis: {exc}") from exc

    @staticmethod
    def _read(connection: _Connection) -> Any:
        while True:
            reply = connection.reader.gets()
            if reply is not False:
                return reply
            try:
                data = connection.sock.recv(65536)
            except TimeoutError as exc:
                raise redis.TimeoutError("Timeout reading from Redis") from exc
            except OSError as exc:
                raise redis.ConnectionError(f"Error reading from Redis: {exc}") from exc
            if not data:
                raise redis.ConnectionError("Redis closed the connection")
            connection.reader.feed(data)

    # --- connections --------------------------------------------------------------------------

    def _connection(self) -> _Connection:
        """This thread's connection: the kept one while it is open, else a new one."""
        connection: _Connection | None = getattr(self._local, "connection", None)
        if connection is not None and (
            connection.pid != os.getpid() or connection.closed_by_peer()
        ):
            self._drop(connection)
            connection = None
        if connection is None:
            connection = self._local.connection = self._connect()
        return connection

    def _drop(self, connection: _Connection) -> None:
        connection.close()
        if getattr(self._local, "connection", None) is connection:
            self._local.connection = None

    def _connect(self) -> _Connection:
        if self.sentinels is not None:
            self.host, self.port = self.sentinels.master()
        try:
            sock = socket.create_connection((self.host, self.port), self.connect_timeout_s)
        except OSError as exc:
            raise redis.ConnectionError(
                f"Error connecting to Redis at {self.host}:{self.port}: {exc}"
            ) from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection = _Connection(sock, self.decode_responses, self.connect_timeout_s)
        setup: list[tuple[Arg, ...]] = []
        if self.password:
            auth = (self.username,) if self.username else ()
            setup.append(("AUTH", *auth, self.password))
        if self.db:
            setup.append(("SELECT", self.db))
        if setup:
            self._local.connection = connection
            try:
                self.pipeline(setup)
            except BaseException:  # refused (a wrong password): never used unauthenticated
                self._drop(connection)
                raise
        return connection

    def close(self) -> None:
        """Closes this thread's connection (the others close with their threads)."""
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            self._drop(connection)
