"""`python -m bench.trace_cost`: the CPU the platform's spans cost per request.

Seven spans, as a traced request makes them (the server span, admit, wait and answer on the
web; run, dispatch and engine on the worker, with the carrier across), through the SDK with
a batch processor and an exporter that drops what it gets; against the same calls with
tracing off, and with 10 % of traces sampled."""

import time
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

from tracing import spans


class Drop(SpanExporter):
    def export(self, batch: Any) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def request() -> None:
    root = spans.start("POST /v1/chat/completions")
    ctx = spans.under(root)
    admit = spans.start(
        "gpushare.admit",
        parent=ctx,
        attributes={
            "gpushare.tenant": "acme",
            "gpushare.pool": "m",
            "gpushare.class": "standard",
            "gpushare.request_id": "x" * 32,
        },
    )
    spans.end(admit)
    wait = spans.start("gpushare.queue.wait", parent=ctx)
    carrier = spans.carrier(wait)
    run = spans.start(
        "gpushare.run",
        parent=spans.received(carrier),
        attributes={"gpushare.engine": "e1", "gpushare.attempt": 1},
    )
    dispatch = spans.start("gpushare.dispatch", parent=spans.under(run))
    spans.end(dispatch)
    engine = spans.start("gpushare.engine", parent=spans.under(run), kind=spans.CLIENT)
    spans.headers(engine)
    spans.end(engine, {"gen_ai.usage.input_tokens": 5, "gen_ai.usage.output_tokens": 2})
    spans.end(wait)
    answer = spans.start("gpushare.answer", parent=ctx)
    spans.end(answer)
    spans.end(run, {"gpushare.outcome": "success"})
    spans.end(root)


def cpu_per(n: int) -> float:
    t = time.process_time()
    for _ in range(n):
        request()
    return (time.process_time() - t) / n


N = 20000
spans.use(None)
off = cpu_per(N)


def traced(sampler: Any = None) -> float:
    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(BatchSpanProcessor(Drop(), max_queue_size=100000))
    spans.use(provider.get_tracer("gpushare"))
    try:
        return cpu_per(N)
    finally:
        provider.shutdown()
        spans.use(None)


on = traced()
tenth = traced(ParentBased(TraceIdRatioBased(0.1)))
print(
    f"CPU per request, 7 spans each: tracing off {off * 1e6:.2f} us; on, every trace sampled "
    f"{on * 1e6:.1f} us; on, 10 % sampled {tenth * 1e6:.1f} us"
)
