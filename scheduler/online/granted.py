"""A granted stream: the web streams a picked job's answer from its engine itself.

The fair queue decides when a request runs and on which engine; a worker picks it, holds its
reservation and lease, and releases it (workers/runner.py). For a stream, the worker then
grants the call to the web process that holds the client (a ``grant`` event: the engine's
address and the worker's inbox), and waits. The web calls the engine, sends each chunk on
as the engine wrote it, and reports the end to the worker (`Report`): the tokens used, or
that the engine refused the request or was lost. The worker ends the run as if it had made
the call: releases the job with the real tokens and its ledger row, answers a refusal, or
gives the job back to its queue. Tokens never cross Redis.

While the call lasts the web says it is alive every ALIVE_S (a worker whose web died gives
up after a silence, and its job is released). The report of a whole answer is also kept in
the job's hash (lua/answer.lua): a worker that died while the web streamed leaves the job to
the reaper, and the run that picks it again finds the answer given and only releases it.
Words about the job that come while the web streams (that requeue, the new run's grant)
change nothing for the client; the report goes to the last worker that granted it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, replace
from typing import Any

from django.conf import settings

from fairqueue.aio import AsyncFairQueue
from fairqueue.growth import Growth
from fairqueue.inbox import parse_event
from plumbing import wire
from scheduler.engines.aio_client import AnswerTooLarge, AsyncEngineClient
from scheduler.engines.auth import engine_api_key
from scheduler.engines.calls import (
    ResponseEvents,
    cached_tokens,
    client_data,
    engine_body,
    engine_path,
    usage_counts,
)
from scheduler.engines.client import EngineRequestError, EngineUnavailable
from tracing import spans

log = logging.getLogger(__name__)

# How often a web streaming a granted call tells its worker that it is still there.
ALIVE_S = 5.0
# How long a web tries to deliver a report while Redis does not answer.
REPORT_TRIES_S = 15.0


@dataclass(frozen=True)
class Report:
    """What the web tells the worker that granted it a call. `final` False: alive only.
    `outcome`: success, refused (the engine's 4xx: `status_code`, its body in `detail`),
    engine_lost (`detail` says how) or cancelled (the client left: the tokens so far, the
    streamed pieces standing for the engine's count where it gave none)."""

    final: bool = True
    outcome: str = "success"  # or "refused", "engine_lost", "cancelled" (its client left)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # of its prompt tokens, those the engine's prefix cache held
    first_token_at: float | None = None
    status_code: int = 200
    detail: str = ""
    # The call ended before its answer did (the client left, or the answer was too large):
    # its tokens are what was streamed, the prompt's reservation standing for the prompt
    # where the engine gave no count.
    cut_short: bool = False

    def dumps(self) -> str:
        return wire.dumps({"event": "report", **asdict(self)})

    @classmethod
    def parse(cls, raw: bytes | str) -> Report:
        fields = wire.loads(raw)
        fields.pop("event", None)
        return cls(**fields)


ALIVE = Report(final=False)

# Reports sent after their stream was cancelled, kept until heard (a task needs a reference).
_unheard: set[asyncio.Future[None]] = set()


def _keep(task: asyncio.Future[None]) -> None:
    _unheard.add(task)
    task.add_done_callback(_unheard.discard)


# The engines' clients of each event loop, by address (a client is bound to its loop).
_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, AsyncEngineClient]] = (
    weakref.WeakKeyDictionary()
)


def engine_span(parent: Any, url: str, attempt: int) -> Any:
    """The span of an engine call (a client's span; its context goes to vLLM in the call's
    `traceparent`), where tracing is on."""
    if not spans.enabled():
        return None
    attributes: spans.Attributes = {"server.address": url, "gpushare.attempt": attempt}
    return spans.start("gpushare.engine", parent=parent, attributes=attributes, kind=spans.CLIENT)


def end_engine_span(span: Any, report: Report) -> None:
    if span is None:
        return
    attributes: spans.Attributes = {
        "gpushare.outcome": report.outcome,
        "gen_ai.usage.input_tokens": report.prompt_tokens,
        "gen_ai.usage.output_tokens": report.completion_tokens,
    }
    error = "" if report.outcome == "success" else (report.detail or report.outcome)[:200]
    spans.end(span, attributes, error=error)


def engine_client(base_url: str) -> AsyncEngineClient:
    clients = _clients.setdefault(asyncio.get_running_loop(), {})
    client = clients.get(base_url)
    if client is None:
        client = clients[base_url] = AsyncEngineClient(
            base_url,
            api_key=engine_api_key(base_url),
            connect_timeout_s=float(settings.GPUSHARE_ENGINE_HTTP_TIMEOUT_S),
            generate_timeout_s=float(settings.GPUSHARE_ENGINE_GENERATE_TIMEOUT_S),
            max_answer_bytes=int(settings.GPUSHARE_MAX_ANSWER_BYTES),
        )
    return client


class GrantedStream:
    """One granted call, as the web runs it: iterate for the events its waiter would have
    read from a relayed run (``chunk`` events, then ``done``); nothing more when the engine
    refused or was lost (the worker's word on it follows through the inbox)."""

    def __init__(
        self,
        queue: AsyncFairQueue,
        pool: str,
        job_id: str,
        request_class: str,
        call: dict[str, Any],
        grant: dict[str, Any],
        words: asyncio.Queue[bytes],
        trace_parent: Any = None,
    ) -> None:
        """`trace_parent`: the context the engine call's span goes under, where tracing is
        on (the request's answer span)."""
        self.queue, self.pool, self.job_id, self.call = queue, pool, job_id, call
        self.trace_parent = trace_parent
        self.span: Any = None
        self.request_class = request_class
        self.attempt = int(grant["attempt"])
        self.stamp = float(grant.get("stamp") or 0.0)  # its place in the engine (engine_body)
        self.url, self.reply = str(grant["url"]), str(grant["reply"])
        self.words = words  # the job's inbox queue: looked through for a newer grant
        self._report_of_events = Report()
        # What the call has used so far: the engine's counts where it gave them, and when
        # its first token came; the pieces streamed are `growth.tokens`.
        self._counts: tuple[int, int] = (0, 0)
        self._cached = 0
        self._first_token_at: float | None = None
        covered = grant.get("covered")
        self.growth = Growth(
            queue, pool, job_id, self.attempt, -1 if covered is None else int(covered)
        )

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        report = Report()
        alive = asyncio.ensure_future(self._say_alive())
        self.span = engine_span(self.trace_parent, self.url, self.attempt)
        try:
            if self.call.get("endpoint") == "responses":
                async for raw in self._response_events():
                    yield {"event": "chunk", "attempt": self.attempt, "raw": raw}
                report = self._report_of_events
            else:
                async for data, chunk in self._chunks():
                    if self._first_token_at is None and chunk.get("choices"):
                        self._first_token_at = time.time()
                        spans.event(self.span, "first_token")
                    self.growth.add(len(chunk.get("choices") or ()))
                    self._counts = usage_counts(chunk.get("usage")) or self._counts
                    self._cached = cached_tokens(chunk.get("usage")) or self._cached
                    passed_on = client_data(data, chunk, bool(self.call.get("include_usage")))
                    if passed_on is not None:
                        yield {"event": "chunk", "attempt": self.attempt, "raw": passed_on}
                report = Report(
                    prompt_tokens=self._counts[0], completion_tokens=self._counts[1],
                    cached_tokens=self._cached, first_token_at=self._first_token_at,
                )  # fmt: skip
        except AnswerTooLarge as exc:
            report = replace(self._cut_short(), outcome="refused", status_code=exc.status_code)
        except EngineRequestError as exc:
            report = Report(outcome="refused", status_code=exc.status_code, detail=exc.body)
        except EngineUnavailable as exc:
            report = Report(outcome="engine_lost", detail=str(exc))
        except (asyncio.CancelledError, GeneratorExit):
            # The client left: its worker charges what the engine did so far. The report is
            # a task of its own: this generator may not wait any more.
            cut_short = self._cut_short()
            _keep(asyncio.ensure_future(self._report_until_heard(cut_short)))
            end_engine_span(self.span, cut_short)
            raise
        finally:
            alive.cancel()
            self.growth.close()
        end_engine_span(self.span, report)
        await self._report(report)
        if report.outcome == "success":
            usage = {
                "prompt_tokens": report.prompt_tokens,
                "completion_tokens": report.completion_tokens,
                "total_tokens": report.prompt_tokens + report.completion_tokens,
            }
            yield {"event": "done", "usage": usage, "attempt": self.attempt}

    def _cut_short(self) -> Report:
        prompt_tokens, completion_tokens = self._counts
        return Report(
            outcome="cancelled", prompt_tokens=prompt_tokens,
            completion_tokens=max(completion_tokens, self.growth.tokens),
            first_token_at=self._first_token_at, cut_short=True,
        )  # fmt: skip

    async def _chunks(self) -> AsyncIterator[tuple[bytes, dict[str, Any]]]:
        client = engine_client(self.url)
        body = self._body()
        finished = False
        async for data in client.stream(engine_path(self.call), body, spans.headers(self.span)):
            chunk: dict[str, Any] = wire.loads(data)
            choices = chunk.get("choices") or []
            finished = finished or any(choice.get("finish_reason") for choice in choices)
            yield data, chunk
        if not finished:
            # An engine whose core died can still end the stream with [DONE]: without a
            # finish reason, the answer is cut short.
            raise EngineUnavailable("the engine's stream ended without a finish reason")

    async def _response_events(self) -> AsyncIterator[bytes]:
        """A Responses stream's events as the engine wrote them (`event:` line and all); its
        report (`_report_of_events`) is set once its last event came."""
        client = engine_client(self.url)
        reading = ResponseEvents()
        path, headers = engine_path(self.call), spans.headers(self.span)
        async for frame, data in client.events(path, self._body(), headers):
            self.growth.add(reading.is_delta(reading.read(data)))
            if self._first_token_at is None and reading.first_output:
                self._first_token_at = time.time()
                spans.event(self.span, "first_token")
            yield frame
        if not reading.ended:
            raise EngineUnavailable("the engine's stream ended before its last event")
        self._counts = reading.counts
        self._report_of_events = Report(
            prompt_tokens=self._counts[0], completion_tokens=self._counts[1],
            cached_tokens=reading.cached, first_token_at=self._first_token_at,
        )  # fmt: skip

    def _body(self) -> dict[str, Any]:
        return engine_body(self.call, self.request_class, self.stamp)

    async def _say_alive(self) -> None:
        while True:
            await asyncio.sleep(ALIVE_S)
            with contextlib.suppress(Exception):  # a missed word only shortens the patience
                await self.queue.answer(
                    self.pool, self.job_id, ALIVE.dumps(), self._reply(), keep=False
                )

    def _reply(self) -> str:
        """The inbox of the worker that granted the job last: a newer run (its first worker
        died, and the reaper gave the job back) waits for the report there. The job's other
        words stay in its queue, in order, for its waiter to read once this call is over."""
        kept: list[bytes] = []
        while not self.words.empty():
            raw = self.words.get_nowait()
            event = parse_event(raw)
            if event.get("event") == "grant":
                if int(event["attempt"]) > self.attempt:
                    self.attempt, self.reply = int(event["attempt"]), str(event["reply"])
            else:
                kept.append(raw)
        for raw in kept:  # no await since the first get: nothing came in between
            self.words.put_nowait(raw)
        return self.reply

    async def _report(self, report: Report) -> None:
        # A task of its own, shielded: a client that leaves now must not cut the report
        # short, which would leave the worker waiting for it.
        await asyncio.shield(asyncio.ensure_future(self._report_until_heard(report)))

    async def _report_until_heard(self, report: Report) -> None:
        """Tries again while Redis is away (a restart takes seconds), up to REPORT_TRIES_S:
        an unheard report leaves the job's seat taken until its worker gives up."""
        ends = time.monotonic() + REPORT_TRIES_S
        while True:
            whole = report.outcome == "success"
            try:
                await self.queue.answer(
                    self.pool, self.job_id, report.dumps(), self._reply(), keep=whole
                )
                return
            except Exception as exc:
                if time.monotonic() >= ends:
                    log.warning("job %s: could not report its stream: %s", self.job_id, exc)
                    return
            await asyncio.sleep(0.5)
