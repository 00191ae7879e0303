"""Adapters on the engines: a job that names an adapter gets it loaded on the engine it was
picked for before the engine is called, and the engine's least recently used adapter is
unloaded first when the engine holds its `max_loras` already.

What each engine holds is kept in Redis (`gs:adapters:loaded:<engine>`, adapter name ->
its latest use), shared by every worker process; a load or an unload on an engine is done
under that engine's lock (`gs:adapters:lock:<engine>`), so that two workers never pass its
`max_loras` between them. The entry is dropped whenever the engine stops being ready (its
process, and so what it had loaded, may be gone: `scheduler.pools.policies.sync_engine`).
vLLM loads an adapter by name and folder at run time (`/v1/load_lora_adapter`, which
VLLM_ALLOW_RUNTIME_LORA_UPDATING opens: scheduler.engines.launch) and forgets it at
`/v1/unload_lora_adapter`; a request that names an adapter the engine does not hold is
refused by the engine, never served by the base model.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import redis

from plumbing import wire
from plumbing.aio_redis import AsyncRedis
from scheduler.engines.aio_client import AsyncEngineClient
from scheduler.engines.auth import engine_auth_headers
from scheduler.engines.client import EngineRequestError, EngineUnavailable, raise_for_status
from scheduler.models import Engine

log = logging.getLogger(__name__)

LOAD_PATH = "/v1/load_lora_adapter"
UNLOAD_PATH = "/v1/unload_lora_adapter"
# The longest a load or an unload may hold an engine's lock: a load reads the adapter's
# files, which is well under this; a holder that died frees it after this.
LOCK_S = 60.0
LOCK_POLL_S = 0.05


def loaded_key(engine_name: str) -> str:
    return f"gs:adapters:loaded:{engine_name}"


def lock_key(engine_name: str) -> str:
    return f"gs:adapters:lock:{engine_name}"


class AdapterLoads:
    """One event loop's loads of adapters onto engines, over its asynchronous Redis client.
    `local_dir(name)` gives the adapter's folder on this node (it may copy it from the files
    storage, so it is awaited off the loop by the caller's choice of function)."""

    def __init__(self, redis_client: AsyncRedis, local_dir: Callable[[str], Awaitable[Path]]):
        self._redis = redis_client
        self._local_dir = local_dir
        # One load per engine at a time from this loop; the Redis lock covers the others.
        self._locks: dict[str, asyncio.Lock] = {}

    async def ensure(self, engine: Engine, client: AsyncEngineClient, name: str) -> bool:
        """Makes sure `engine` holds adapter `name`, unloading its least recently used
        adapter first where it holds its `max_loras`; marks `name` used now. True when it
        was loaded by this call. EngineRequestError where the engine refuses the adapter,
        EngineUnavailable where it cannot be reached."""
        key = loaded_key(engine.name)
        # Held already: a use, one round trip (ZADD XX CH counts an update of its score).
        if await self._redis.call("ZADD", key, "XX", "CH", f"{time.time():.6f}", name):
            return False
        lock = self._locks.setdefault(engine.name, asyncio.Lock())
        async with lock:
            token = await self._acquire(engine.name)
            try:
                return await self._load(engine, client, name, key)
            finally:
                await self._release(engine.name, token)

    async def forget(self, engine: Engine, name: str) -> None:
        """The engine does not hold `name` after all (it answered 404 for it)."""
        await self._redis.call("ZREM", loaded_key(engine.name), name)

    async def _load(self, engine: Engine, client: AsyncEngineClient, name: str, key: str) -> bool:
        if await self._redis.call("ZSCORE", key, name) is not None:  # loaded meanwhile
            await self._redis.call("ZADD", key, f"{time.time():.6f}", name)
            return False
        held: list[bytes] = await self._redis.call("ZRANGE", key, 0, -1)
        for victim in held[: max(0, len(held) - engine.max_loras + 1)]:  # oldest first
            status, body = await client.control(UNLOAD_PATH, {"lora_name": victim.decode()})
            if status != 404:  # 404: the engine did not hold it (restarted meanwhile)
                raise_for_status(status, body, client.base_url + UNLOAD_PATH)
            await self._redis.call("ZREM", key, victim)
            log.info("engine %s: adapter %s unloaded (least recently used)", engine.name,
                     victim.decode())  # fmt: skip
        folder = await self._local_dir(name)
        status, body = await client.control(
            LOAD_PATH, {"lora_name": name, "lora_path": str(folder)}
        )
        if status == 500:
            # vLLM could not read or apply the adapter (its files): the engine is well, and
            # the job would fail the same on any other, so it is answered, not requeued.
            message = f"The model '{name}' could not be loaded: {body[:500]}"
            raise EngineRequestError(
                message, status_code=500, body=wire.dumps({"message": message})
            )
        if not (status == 400 and "already been loaded" in body):
            raise_for_status(status, body, client.base_url + LOAD_PATH)
        await self._redis.call("ZADD", key, f"{time.time():.6f}", name)
        log.info("engine %s: adapter %s loaded", engine.name, name)
        return True

    async def _acquire(self, engine_name: str) -> str:
        token = uuid.uuid4().hex
        deadline = time.monotonic() + LOCK_S
        while not await self._redis.call(
            "SET", lock_key(engine_name), token, "NX", "PX", int(LOCK_S * 1000)
        ):
            if time.monotonic() > deadline:
                raise EngineUnavailable(f"engine {engine_name}: its adapters' lock is held")
            await asyncio.sleep(LOCK_POLL_S)
        return token

    async def _release(self, engine_name: str, token: str) -> None:
        key = lock_key(engine_name)
        if await self._redis.call("GET", key) == token.encode():
            await self._redis.call("DEL", key)


def loaded_on(client: redis.Redis, engine_name: str) -> list[str]:
    """The adapters `engine_name` holds, least recently used first."""
    names: list[bytes | str] = client.zrange(loaded_key(engine_name), 0, -1)  # type: ignore[assignment]
    return [n.decode() if isinstance(n, bytes) else n for n in names]


def forget_engine(client: redis.Redis, engine_name: str) -> None:
    """The engine holds nothing any more (it stopped, or is starting afresh)."""
    client.delete(loaded_key(engine_name))


def unload_everywhere(client: redis.Redis, engines: list[Engine], name: str) -> None:
    """Unloads adapter `name` from every engine of `engines` that holds it (its adapter was
    removed), synchronously: the staff's command, not the request path."""
    for engine in engines:
        if client.zscore(loaded_key(engine.name), name) is None:
            continue
        url = engine.base_url + UNLOAD_PATH
        try:
            response = httpx.post(
                url, json={"lora_name": name}, headers=engine_auth_headers(engine.base_url),
                timeout=10.0,
            )  # fmt: skip
            if response.status_code != 404:
                raise_for_status(response.status_code, response.text, url)
        except (httpx.HTTPError, EngineUnavailable, EngineRequestError) as exc:
            # Its engine may be gone; a running one forgets it at its next restart, and no
            # request can name it meanwhile (the adapter's row is gone).
            log.warning("engine %s: could not unload adapter %s: %s", engine.name, name, exc)
        client.zrem(loaded_key(engine.name), name)
