"""Memory-unit arithmetic. Every amount of GPU memory in gpushare is counted in units.

A unit is 256 MiB. Reservations round *up* (a request that needs one byte more than a unit
holds two), capacities round *down* (a GPU with 1.9 units of room offers one).
"""

UNIT_BYTES = 256 * 1024 * 1024
GIB = 1024**3


def units_to_bytes(units: int) -> int:
    return units * UNIT_BYTES


def units_to_gib(units: float) -> float:
    return units * UNIT_BYTES / GIB


def bytes_to_units_ceil(nbytes: int) -> int:
    """Units needed to hold `nbytes` (a reservation): rounds up."""
    if nbytes < 0:
        raise ValueError("a byte count cannot be negative")
    return -(-nbytes // UNIT_BYTES)


def bytes_to_units_floor(nbytes: int) -> int:
    """Whole units available in `nbytes` (a capacity): rounds down."""
    if nbytes < 0:
        raise ValueError("a byte count cannot be negative")
    return nbytes // UNIT_BYTES


def format_units(units: float) -> str:
    """'8 units = 2.0 GiB', '1 unit = 0.25 GiB', '0.5 units = 0.12 GiB'."""
    count = f"{units:g}"
    noun = "unit" if units == 1 else "units"
    gib = units_to_gib(units)
    gib_text = f"{gib:.1f}" if gib >= 1 or gib == 0 else f"{gib:.2f}"
    return f"{count} {noun} = {gib_text} GiB"
