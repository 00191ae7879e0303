"""Traces of a request's path through the platform, with OpenTelemetry.

A request's trace starts at the web (OpenTelemetry's ASGI middleware: the HTTP server span)
and holds, in this order:

    gpushare.admit        the key, the route, the prompt's count, the limits, the enqueue
    gpushare.queue.wait   from the enqueue until a worker's run first speaks (grant or answer)
      gpushare.run        on the worker that picked it, from the pick to its release
        gpushare.dispatch   from the pick until the engine has the call (or the web its grant)
        gpushare.engine     the engine call, when the worker makes it (event: first_token)
    gpushare.answer       on the web, from the run's first word to the final event
      gpushare.engine     the engine call, when the web streams it itself (a granted stream)

The context crosses the fair queue inside the job's payload (`carrier`, W3C trace context),
so the worker's spans join the request's trace, and the engine call carries `traceparent` to
vLLM (whose own spans join it where it exports traces). A batch line's trace starts at its
enqueue (`gpushare.batch.line`).

Off unless the standard OpenTelemetry settings ask for it (`setup.tracing_wanted`); off, every
helper here returns at its first line and the payload carries nothing more.
"""
