"""The three request classes. Plain Python: the scheduler's pure modules use them too."""

from enum import StrEnum


class RequestClass(StrEnum):
    INTERACTIVE = "interactive"
    STANDARD = "standard"
    OFFLINE = "offline"


REQUEST_CLASSES: tuple[str, ...] = tuple(c.value for c in RequestClass)


def unknown_classes(names: list[str]) -> list[str]:
    """The names in `names` that are not request classes, in order, for error messages."""
    return [name for name in names if name not in REQUEST_CLASSES]
