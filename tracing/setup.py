"""Turning tracing on in a process, from OpenTelemetry's own settings.

Tracing is on where the environment names an exporter: `OTEL_TRACES_EXPORTER` (`otlp`,
`console`; `none` keeps it off), or an OTLP endpoint (`OTEL_EXPORTER_OTLP_ENDPOINT`,
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), which means `otlp`. `OTEL_SDK_DISABLED=true` keeps it
off whatever else is set. The rest is the SDK's as documented by OpenTelemetry: the sampler
(`OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG`), the batch processor's sizes
(`OTEL_BSP_*`), the exporter's endpoint, headers and timeout (`OTEL_EXPORTER_OTLP_*`), the
service's name (`OTEL_SERVICE_NAME`, else the process's role) and resource
(`OTEL_RESOURCE_ATTRIBUTES`). OTLP goes over HTTP (protobuf), the exporter the platform
installs; `grpc` needs opentelemetry-exporter-otlp-proto-grpc installed beside it.

What OpenTelemetry instruments itself: the web's HTTP server spans (its ASGI middleware, in
`config.asgi`), Django's views (`instrument_django`) and Celery's messages, sent and run
(`instrument_celery`). The engine calls, the fair queue's Redis scripts and the waits
between them are the platform's own code, and get its own spans (`tracing.spans`).
"""

from __future__ import annotations

import os
from typing import Any, Literal

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)

from tracing import spans

TRACER_NAME = "gpushare"
EXPORTERS = ("otlp", "console", "none")
# The sends and receives of an HTTP exchange (each chunk of a stream) get no span of their
# own: the platform's spans say when the answer started and ended.
ASGI_EXCLUDED_SPANS: list[Literal["receive", "send"]] = ["receive", "send"]


class TracingMisconfigured(ValueError):
    """The OTEL_* settings ask for something this installation cannot do."""


def _env(name: str) -> str:
    return os.environ.get(name, "").strip()


def exporter_names() -> list[str]:
    """The exporters the environment asks for; empty when tracing stays off."""
    if _env("OTEL_SDK_DISABLED").lower() == "true":
        return []
    named = [n.strip().lower() for n in _env("OTEL_TRACES_EXPORTER").split(",") if n.strip()]
    if not named and (
        _env("OTEL_EXPORTER_OTLP_ENDPOINT") or _env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    ):
        named = ["otlp"]
    unknown = [n for n in named if n not in EXPORTERS]
    if unknown:
        raise TracingMisconfigured(
            f"OTEL_TRACES_EXPORTER={_env('OTEL_TRACES_EXPORTER')!r}: {', '.join(unknown)} "
            f"is not one of {', '.join(EXPORTERS)}."
        )
    return [n for n in named if n != "none"]


def tracing_wanted() -> bool:
    return bool(exporter_names())


def _otlp_exporter() -> SpanExporter:
    protocol = (
        _env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or _env("OTEL_EXPORTER_OTLP_PROTOCOL")
    ).lower() or "http/protobuf"
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcExporter,
            )
        except ImportError as exc:
            raise TracingMisconfigured(
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs the package "
                "opentelemetry-exporter-otlp-proto-grpc; the platform installs OTLP over HTTP "
                "(http/protobuf, port 4318)."
            ) from exc
        return GrpcExporter()
    raise TracingMisconfigured(
        f"OTLP protocol {protocol!r} is not supported: use http/protobuf (or grpc)."
    )


def _exporter(name: str) -> SpanExporter:
    return _otlp_exporter() if name == "otlp" else ConsoleSpanExporter()


def provider_for(role: str) -> TracerProvider:
    """A provider named for the process (`OTEL_SERVICE_NAME` first, else gpushare-<role>)."""
    name = _env("OTEL_SERVICE_NAME") or f"gpushare-{role}"
    return TracerProvider(resource=Resource.create({SERVICE_NAME: name}))


_provider: TracerProvider | None = None


def configure(role: str) -> bool:
    """Turns tracing on in this process where the environment asks for it (once; later
    calls change nothing); whether it is on. `role`: web, worker, agent or beat."""
    global _provider
    if _provider is not None:
        return True
    names = exporter_names()
    if not names:
        return False
    provider = provider_for(role)
    for name in names:
        provider.add_span_processor(BatchSpanProcessor(_exporter(name)))
    install(provider)
    return True


def install(provider: TracerProvider, exporter: SpanExporter | None = None) -> None:
    """Sends the platform's spans and OpenTelemetry's instrumentations' to `provider`
    (with `exporter` as it ends each span: tests use the SDK's in-memory exporter)."""
    global _provider
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    _provider = provider
    trace.set_tracer_provider(provider)
    spans.use(provider.get_tracer(TRACER_NAME))
    instrument_celery(provider)


def provider() -> TracerProvider | None:
    return _provider


def instrument_django() -> None:
    """Django's views get server spans (under the web's ASGI span, with their route);
    before Django loads its middleware, so in `config.asgi` before the application."""
    if _provider is None:
        return
    from opentelemetry.instrumentation.django import DjangoInstrumentor

    instrumentor = DjangoInstrumentor()
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument(tracer_provider=_provider)


def instrument_celery(provider: TracerProvider) -> None:
    """Celery's messages carry the context of the span that sent them, and the task that
    runs one continues its trace (a batch's tasks, the web's reports, the agent's orders)."""
    from opentelemetry.instrumentation.celery import CeleryInstrumentor

    instrumentor = CeleryInstrumentor()
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument(tracer_provider=provider)


def asgi_traced(app: Any) -> Any:
    """`app` under OpenTelemetry's ASGI middleware (one server span per HTTP request, its
    context from the client's `traceparent`), on the installed provider."""
    from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware

    return OpenTelemetryMiddleware(
        app, tracer_provider=_provider, exclude_spans=ASGI_EXCLUDED_SPANS
    )
