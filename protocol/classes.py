"""The three request classes. Plain Python: the scheduler's pure modules use them too."""

from enum import StrEnum


class RequestClass(StrEnum):
    INTERACTIVE = "interactive"
    STANDARD = "standard"
    OFFLINE = "offline"


REQUEST_CLASSES: tuple[str, ...] = tuple(c.value for c in RequestClass)

# Each class's priority inside an engine (vLLM's `priority`: lower runs first). The fair
# queue decides which requests reach an engine; among those waiting there for a seat
# (EnginePolicy.queued), an interactive one takes the next seat before standard work.
ENGINE_PRIORITY: dict[str, int] = {
    RequestClass.INTERACTIVE: 0,
    RequestClass.STANDARD: 1,
    RequestClass.OFFLINE: 2,
}


def unknown_classes(names: list[str]) -> list[str]:
    """The names in `names` that are not request classes, in order, for error messages."""
    return [name for name in names if name not in REQUEST_CLASSES]
