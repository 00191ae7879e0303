"""The three request classes. Plain Python: the scheduler's pure modules use them too."""

from enum import StrEnum


class RequestClass(StrEnum):
    INTERACTIVE = "interactive"
    STANDARD = "standard"
    OFFLINE = "offline"


REQUEST_CLASSES: tuple[str, ...] = tuple(c.value for c in RequestClass)

# Each class's rank inside an engine (vLLM's `priority`: lower runs first): among the
# requests waiting there for a seat (EnginePolicy.queued), an interactive one takes the next
# seat before standard work, and standard before offline.
ENGINE_PRIORITY: dict[str, int] = {
    RequestClass.INTERACTIVE: 0,
    RequestClass.STANDARD: 1,
    RequestClass.OFFLINE: 2,
}
# Stamps (VTC counters) stay below this: a class's rank weighs more than any stamp.
STAMP_SPAN = 2**50


def engine_priority(request_class: str, stamp: float) -> int:
    """A job's priority in its engine: its class's rank, then its stamp (its tenant's VTC
    counter when it was picked), so the engine seats the requests waiting there in the fair
    queue's order (docs/decisions/0009-the-fair-queue-orders-the-seats.md)."""
    return ENGINE_PRIORITY[request_class] * STAMP_SPAN + min(int(max(stamp, 0.0)), STAMP_SPAN - 1)


def unknown_classes(names: list[str]) -> list[str]:
    """The names in `names` that are not request classes, in order, for error messages."""
    return [name for name in names if name not in REQUEST_CLASSES]
