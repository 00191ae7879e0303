"""A run's spans on the worker (tracing/): `gpushare.run` from the pick to the release, in
the trace of the request whose payload carried its context (a job enqueued without one
starts a trace of its own); under it `gpushare.dispatch`, until the engine has the call or
the web its grant, and `gpushare.engine`, the call when this worker makes it."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from tracing import spans

if TYPE_CHECKING:
    from workers.runner import Run, RunResult


def begin(run: Run) -> None:
    """At the pick."""
    if not spans.enabled():
        return
    job = run.job
    attributes: dict[str, spans.AttributeValue] = {
        "gpushare.request_id": job.job_id,
        "gpushare.tenant": job.tenant,
        "gpushare.pool": job.pool,
        "gpushare.class": job.request_class,
        "gpushare.engine": job.engine_id,
        "gpushare.attempt": job.attempt,
        "gpushare.queue_wait_s": max(0.0, time.time() - job.enqueued_at),
    }
    if run.request.get("batch_id"):
        attributes["gpushare.batch_id"] = str(run.request["batch_id"])
    run.span = spans.start(
        "gpushare.run", parent=spans.received(run.request.get("trace")), attributes=attributes
    )
    run.dispatch_span = spans.start("gpushare.dispatch", parent=spans.under(run.span))


def dispatched(run: Run) -> None:
    """The engine has the call, or the web its grant (or the run ended before either)."""
    spans.end(run.dispatch_span)


def engine_call(run: Run, url: str) -> Any:
    """The span of the engine call this worker makes (its context goes to vLLM in the
    call's `traceparent`)."""
    if run.span is None:
        return None
    attributes: spans.Attributes = {"server.address": url, "gpushare.attempt": run.job.attempt}
    return spans.start(
        "gpushare.engine", parent=spans.under(run.span), attributes=attributes, kind=spans.CLIENT
    )


def engine_call_ended(span: Any, result: RunResult, error: str = "") -> None:
    if span is None:
        return
    if result.first_token_at is not None:
        span.add_event("first_token", timestamp=int(result.first_token_at * 1e9))
    usage = {
        "gen_ai.usage.input_tokens": result.prompt_tokens,
        "gen_ai.usage.output_tokens": result.completion_tokens,
    }
    spans.end(span, usage, error=error)


def end(run: Run, result: RunResult | None) -> None:
    """Once the job is released (or given back)."""
    if run.span is None:
        return
    dispatched(run)
    if result is None:
        spans.end(run.span, error="the run failed")
        return
    attributes: dict[str, spans.AttributeValue] = {
        "gpushare.outcome": result.outcome,
        "gen_ai.usage.input_tokens": result.prompt_tokens,
        "gen_ai.usage.output_tokens": result.completion_tokens,
    }
    error = "" if result.outcome in ("success", "requeued") else result.outcome
    if run.stopped:
        attributes["gpushare.stopped"] = run.stopped
    spans.end(run.span, attributes, error=error)
