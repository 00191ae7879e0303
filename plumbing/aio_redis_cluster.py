"""`AsyncRedisCluster`: `AsyncRedis`'s calls on a Redis Cluster, from an event loop.

Each call goes to the primary that serves its keys' slot (`plumbing/cluster.py`), over an
`AsyncRedis` of that node, so a call costs what it costs on one Redis: one write and its
replies, on a connection kept for the next call. A pipeline is one write to one node: its
commands' keys share a slot (the fair queue's keys of one pool share its hash tag), or it is
refused before anything is sent (CrossSlot).

Redirects are followed as redis-py's cluster clients follow them, and a command is still
never run twice:
- MOVED (the slot is served elsewhere for good): nothing ran; the map learns the slot's new
  owner, the whole map is read again before the next call, and the commands go to the new
  owner.
- ASK (the slot is moving and the key is already on the other node): nothing ran; the
  commands go to that node, each behind ASKING, this once.
- A redirect for some commands of a pipeline but not others (a slot that moves between two
  of them) is raised: the others ran, so the redirected ones are not sent again blindly.
- A node that cannot be reached raises ConnectionError, as a lost connection does on one
  Redis, and the map is read again before the next call (a replica may have taken over).

Loading a library or a script (FUNCTION LOAD, SCRIPT LOAD) reaches every primary, so any
slot's calls find it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import hiredis
import redis
from redis.exceptions import AskError

from plumbing.aio_redis import Arg, AsyncRedis, raise_errors
from plumbing.cluster import Redirect, SlotMap, command_keys, pipeline_slot, to_every_primary
from plumbing.sentinel import NO_FENCE, Fence

# As redis-py's cluster client: a slot moving twice while one call follows it is rare; more
# means the cluster's own map is broken.
MAX_REDIRECTS = 5


class AsyncRedisCluster:
    """The cluster that `url` names one node of (any node: the others are learnt from it).
    `max_connections` and `read_timeout_s` hold per node, as `AsyncRedis` takes them."""

    def __init__(self, url: str, *, max_connections: int, read_timeout_s: float) -> None:
        self._seed = AsyncRedis(url, max_connections=max_connections, read_timeout_s=read_timeout_s)
        self.max_connections = max_connections
        self._nodes: dict[tuple[str, int], AsyncRedis] = {}
        self._map: SlotMap | None = None
        self._stale = True
        self._reading = asyncio.Lock()

    async def call(self, *args: Arg, block_s: float = 0.0, fence: Fence = NO_FENCE) -> Any:
        """One command's reply, from the node that serves its key (`AsyncRedis.call`)."""
        if to_every_primary(args):
            return (await self._on_every_primary(args, block_s))[0]
        if not fence:
            return (await self.pipeline([args], block_s=block_s))[0]
        answer, acked = await self._routed([args, fence.command()], block_s + fence.block_s)
        return fence.check(answer, acked)

    async def pipeline(
        self, commands: Sequence[Sequence[Arg]], *, block_s: float = 0.0, fence: Fence = NO_FENCE
    ) -> list[Any]:
        """`AsyncRedis.pipeline` on the node that serves the commands' slot; CrossSlot
        (nothing sent) when their keys are in several."""
        if fence:
            *replies, acked = await self._routed(
                [*commands, fence.command()], block_s + fence.block_s
            )
            return list(fence.check(replies, acked))
        return await self._routed(commands, block_s)

    async def evalsha(self, sha: str, source: Arg, *args: Arg) -> Any:
        """EVALSHA, the script loaded on every primary first if its node does not know it."""
        try:
            return await self.call("EVALSHA", sha, *args)
        except redis.exceptions.NoScriptError:
            await self.call("SCRIPT", "LOAD", source)
            return await self.call("EVALSHA", sha, *args)

    async def blpop(self, key: str, timeout_s: int) -> tuple[bytes, bytes] | None:
        """`AsyncRedis.blpop` on the node that serves `key`."""
        address = await self._owner(pipeline_slot([("BLPOP", key, timeout_s)]))
        for _ in range(MAX_REDIRECTS):
            try:
                return await self._node(address).blpop(key, timeout_s)
            except AskError as error:  # MOVED too (a subclass): nothing was popped
                redirect = Redirect.parse(str(error))
                if redirect is None:
                    raise
                if redirect.ask:
                    replies = await self._node((redirect.host, redirect.port)).pipeline(
                        [("ASKING",), ("BLPOP", key, timeout_s)], block_s=timeout_s
                    )
                    reply = replies[1]
                    return None if reply is None else (reply[0], reply[1])
                address = self._moved(redirect)
            except (redis.ConnectionError, redis.TimeoutError):
                self._stale = True
                raise
        raise redis.exceptions.ClusterError(f"{key!r}: more than {MAX_REDIRECTS} redirects")

    async def _routed(self, commands: Sequence[Sequence[Arg]], block_s: float) -> list[Any]:
        address = await self._owner(pipeline_slot(commands))
        # Only a command with a key is redirected (a fence's WAIT answers wherever it goes).
        keyed = [i for i, command in enumerate(commands) if command_keys(command)]
        asking = False
        for _ in range(MAX_REDIRECTS):
            sent: Sequence[Sequence[Arg]] = commands
            if asking:
                sent = [part for command in commands for part in (("ASKING",), command)]
            try:
                replies = await self._node(address).replies(sent, block_s=block_s)
            except (redis.ConnectionError, redis.TimeoutError):
                self._stale = True
                raise
            if asking:
                replies = replies[1::2]
            redirects = [_redirect(replies[i]) for i in keyed]
            redirect = redirects[0] if redirects else None
            if redirect is None or any(found is None for found in redirects):
                raise_errors(replies)  # a redirect among replies that ran is raised
                return replies
            asking = redirect.ask
            address = (redirect.host, redirect.port) if asking else self._moved(redirect)
        raise redis.exceptions.ClusterError(f"more than {MAX_REDIRECTS} redirects")

    async def _on_every_primary(self, args: Sequence[Arg], block_s: float) -> list[Any]:
        """The command on every primary, at once; their replies, the first error raised once
        all have answered."""
        await self._owner(None)
        assert self._map is not None
        replies = await asyncio.gather(
            *(
                self._node(address).replies([args], block_s=block_s)
                for address in self._map.primaries
            ),
            return_exceptions=True,
        )
        for reply in replies:
            if isinstance(reply, BaseException):
                self._stale = True
                raise reply
        flat = [reply[0] for reply in replies if not isinstance(reply, BaseException)]
        raise_errors(flat)
        return flat

    async def _owner(self, slot: int | None) -> tuple[str, int]:
        """The primary that serves `slot` (any primary for None), reading the map first
        where it is stale."""
        if self._stale or self._map is None:
            async with self._reading:
                if self._stale or self._map is None:
                    await self._read_map()
        assert self._map is not None
        owner = self._map.owner(slot) if slot is not None else self._map.primaries[0]
        if owner is None:
            raise redis.exceptions.ClusterDownError(f"no node serves slot {slot}")
        return owner

    async def _read_map(self) -> None:
        """CLUSTER SLOTS from the first node that answers: the seed, then the known ones."""
        error: Exception | None = None
        for client in (self._seed, *self._nodes.values()):
            try:
                reply = await client.call("CLUSTER", "SLOTS")
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                error = exc
                continue
            self._map, self._stale = SlotMap(reply, default_host=self._seed_host()), False
            return
        assert error is not None
        raise error

    def _seed_host(self) -> str:
        return self._seed._address.host

    def _moved(self, redirect: Redirect) -> tuple[str, int]:
        """A MOVED reply: where to send now; the whole map is read again before the next
        call (a slot rarely moves alone)."""
        if self._map is not None:
            self._map.moved(redirect)
        self._stale = True
        return (redirect.host, redirect.port)

    def _node(self, address: tuple[str, int]) -> AsyncRedis:
        client = self._nodes.get(address)
        if client is None:
            client = self._nodes[address] = self._seed.at(*address)
        return client

    def close(self) -> None:
        self._seed.close()
        for client in self._nodes.values():
            client.close()


def _redirect(reply: Any) -> Redirect | None:
    if isinstance(reply, hiredis.ReplyError):
        return Redirect.parse(str(reply))
    return None
