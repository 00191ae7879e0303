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


def bytes_to_units_exact(nbytes: int) -> float:
    """`nbytes` as a fraction of units, for reports (a 0.5-unit reservation shows as 0.5)."""
    if nbytes < 0:
        raise ValueError("a byte count cannot be negative")
    return nbytes / UNIT_BYTES


def gib_to_bytes(gib: float) -> int:
    if gib < 0:
        raise ValueError("a size cannot be negative")
    return int(gib * GIB)


def device_capacity_units(memory_bytes: int) -> int:
    """What a device offers to engines: its whole units of memory (a capacity, so floored)."""
    return bytes_to_units_floor(memory_bytes)


def gpu_memory_utilization(*, footprint_units: int, gpu_memory_bytes: int) -> float:
    """vLLM's `--gpu-memory-utilization` for an engine holding `footprint_units` of a GPU.

    vLLM takes a fraction of the card's total memory; rounded down to 4 decimals so the engine
    never claims more than its units (a fraction rounded up could overlap a neighbour).
    """
    if gpu_memory_bytes <= 0:
        raise ValueError("a GPU's memory must be positive")
    if footprint_units <= 0:
        raise ValueError("an engine's footprint must be at least one unit")
    needed = units_to_bytes(footprint_units)
    if needed > gpu_memory_bytes:
        raise ValueError(
            f"{format_units(footprint_units)} does not fit in a GPU of "
            f"{gpu_memory_bytes / GIB:.1f} GiB"
        )
    return int(needed * 10_000 // gpu_memory_bytes) / 10_000
