"""A request's spans on the web (tracing/): after admission, its wait in the fair queue, then
its answer from the run's first word to the final event. Started by `admission.admit`, moved
on by the events the waiter reads (`saw`), ended once it is over (`close`)."""

from __future__ import annotations

from opentelemetry.context import Context
from opentelemetry.trace import Span

from tracing import spans

# What a run says, and how a request ends (admission.RUN_WORDS, admission.FINAL_EVENTS).
_RUN_WORDS = frozenset({"chunk", "done", "error", "grant"})
_FINAL = frozenset({"done", "error", "expired", "cancelled"})


class RequestTrace:
    """`root`: the request's server span, which the wait and the answer are children of.
    `wait`: the span of its wait in the queue, begun as it was enqueued; its context went
    into the job's payload, so the worker's run is its child."""

    def __init__(self, root: Context | None, wait: Span) -> None:
        self.root, self.wait = root, wait
        self.answer: Span | None = None

    def saw(self, event: dict[str, object]) -> None:
        kind = str(event.get("event"))
        if kind == "requeued":
            spans.event(self.answer or self.wait, "requeued", {"reason": str(event.get("reason"))})
            return
        if self.answer is None and (kind in _RUN_WORDS or kind in _FINAL):
            attempt = int(str(event.get("attempt") or 0))
            spans.end(self.wait, {"gpushare.attempt": attempt} if attempt else None)
            self.answer = spans.start("gpushare.answer", parent=self.root)
        if kind in _FINAL:
            self.close(kind)

    def engine_parent(self) -> Context | None:
        """Where a granted stream's engine call goes: under the answer."""
        return spans.under(self.answer)

    def close(self, outcome: str = "cancelled") -> None:
        """Ends what is still open: `outcome` done, error, expired, or cancelled (the client
        left, or the follow ended otherwise)."""
        error = "" if outcome == "done" else outcome
        if self.answer is None:
            spans.end(self.wait, {"gpushare.outcome": outcome}, error=error)
            return
        spans.end(self.answer, {"gpushare.outcome": outcome}, error=error)
