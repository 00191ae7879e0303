"""`python -m plumbing.serve config.asgi:application --host ... --port ...`: uvicorn, ticking once
a second instead of ten times.

The same command line as `uvicorn` (every option is uvicorn's own), served by `CalmServer`.
uvicorn's server wakes every 100 ms to see whether it should stop and, every tenth wake, to
write the `date` header it sends: those wakes are nearly all an idle web process's CPU, and
one wake a second costs a tenth of it
(docs/decisions/0007-periodic-work-on-each-workers-ticker.md). Once a second keeps the `date`
header exact to the second; a signal to stop takes up to a second to be noticed.

It also keeps an idle client connection open for `KEEP_ALIVE_S` unless the command line
says otherwise (`--timeout-keep-alive`); see there why uvicorn's 5 s is not kept.
"""

from __future__ import annotations

import asyncio
import importlib
from typing import Any

import uvicorn
from uvicorn.supervisors import multiprocess

TICK_S = 1.0
# uvicorn's `on_tick` does its once-a-second work when the counter is a multiple of 10 (its
# ticks are 100 ms): each of ours counts as ten of its.
UVICORN_TICKS_PER_TICK = 10
_COUNTER_WRAP = 864_000

# How long an idle client connection stays open. uvicorn's 5 s is the keep-alive expiry of
# httpx (and so of the `openai` client) too: a client that reuses its connection just as the
# server closes it gets a connection reset for a request the server never read (the server's
# FIN crosses the client's next request, and the server's kernel answers it with RST;
# docs/decisions/0008-the-request-path-spends-cpu-once.md). The side that closes idle
# connections must be the client or the proxy in front (nginx's upstream keep-alive and cloud
# load balancers idle out at 60 s), so the web waits longer.
KEEP_ALIVE_S = 75


class CalmServer(uvicorn.Server):
    async def main_loop(self) -> None:
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + UVICORN_TICKS_PER_TICK) % _COUNTER_WRAP
            await asyncio.sleep(TICK_S)
            should_exit = await self.on_tick(counter)


class CalmWorkerProcess(multiprocess.Process):
    """A `--workers N` child: it is started by pickling this object's `target`, so the child
    builds its server from this class, wherever it was imported from."""

    @property
    def server(self) -> uvicorn.Server:
        if self._server is None:
            self._server = CalmServer(config=self.config)
        return self._server


def install() -> None:
    """uvicorn's command line builds its server, and its worker processes, from these module
    globals (the package's `uvicorn.main` attribute is the command, not the module)."""
    _command_line().Server = CalmServer
    multiprocess.Process = CalmWorkerProcess  # type: ignore[misc]


def _command_line() -> Any:
    return importlib.import_module("uvicorn.main")


def main() -> None:
    install()
    # Defaults for the command's own options: the command line still overrides them.
    _command_line().main(default_map={"timeout_keep_alive": KEEP_ALIVE_S})


if __name__ == "__main__":
    main()
