"""The scaler's decisions for one pool, as pure functions: no Django, no Redis, no clock.

Given the pool's policy, its engines and their states, the recent samples of its online
queue (interactive + standard: offline work waits for idle capacity by design, so a batch
backlog is no reason to start an engine), the schedule of expected peaks, the last decision
and the time, `decide` says start these engines, drain this one, or hold, and why.

Rules, first match wins:
1. in progress: an engine of the pool is starting, warming or draining, or the last start or
   drain is still being carried out -> hold (never two decisions at once for one pool).
2. floor: fewer live engines (starting, warming, ready) than the floor -> start the
   difference (after a failed start, only once `sustain_s` has passed). The floor is
   `hot_size`, raised by a scheduled peak's `extra` engines from `peak_lead_s` before the
   peak until its end, never above `hot_size + cold_max`.
3. sustained: every sample since the window opened (`sustain_s` ago, or the last start or
   drain if that is later) is over target (oldest online wait >= `target_wait_s` or waiting
   online jobs >= `target_depth`), and the samples cover the whole window -> start one,
   unless the pool is at `hot_size + cold_max`. A spike that does not last -> hold.
4. quiet: more live engines than the floor, and for the whole `quiet_period_s` (also counted
   from the last start or drain) nothing online waited and what ran would have fitted in the
   other ready engines at most half full (nothing ran, when it is the last engine: a hot
   size of 0 runs engines only for scheduled peaks) -> drain one (the ready engine with the
   fewest jobs in flight, the most recently started on a tie).
5. otherwise hold.

A start picks registered engines of the pool that are stopped (failed ones only when no
stopped one is left), by name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, time, timedelta
from zoneinfo import ZoneInfo

# A quiet sample's running jobs must fit the engines left after a drain at this fill.
QUIET_FILL = 0.5
# Samples are taken every tick; a window counts as covered when a sample was taken at most
# this long before it opened (a tick's jitter), so "for 60 s" means at least 60 s.
COVERAGE_SLACK_S = 15.0

STARTING_STATES = frozenset({"starting", "warming"})
LIVE_STATES = frozenset({"starting", "warming", "ready"})


class PeakError(ValueError):
    pass


@dataclass(frozen=True)
class Peak:
    """An expected peak: on `days` (0 = Monday), from `start` to `end` (local times; an end
    at or before the start means the peak runs past midnight), `extra` engines on top of
    the hot ones."""

    name: str
    days: tuple[int, ...]
    start: time
    end: time
    extra: int

    @classmethod
    def parse(cls, raw: dict[str, object]) -> Peak:
        try:
            name = str(raw.get("name") or "peak")
            days_raw = raw.get("days", list(range(7)))
            if not isinstance(days_raw, list | tuple):
                raise PeakError(f"peak {name!r}: days must be a list of 0..6")
            days = tuple(int(d) for d in days_raw)
            start = time.fromisoformat(str(raw["start"]))
            end = time.fromisoformat(str(raw["end"]))
            extra_raw = raw.get("extra", 1)
            extra = int(extra_raw) if isinstance(extra_raw, int | str) else -1
        except (KeyError, TypeError, ValueError) as exc:
            raise PeakError(f"bad peak {raw!r}: {exc}") from None
        if not days or any(d < 0 or d > 6 for d in days):
            raise PeakError(f"peak {name!r}: days must be 0 (Monday) .. 6 (Sunday)")
        if extra < 1:
            raise PeakError(f"peak {name!r}: extra must be a whole number of engines >= 1")
        return cls(name=name, days=days, start=start, end=end, extra=extra)


def parse_peaks(raw: Sequence[dict[str, object]]) -> list[Peak]:
    return [Peak.parse(item) for item in raw]


@dataclass(frozen=True)
class PoolPolicy:
    hot_size: int
    cold_max: int
    target_wait_s: float
    target_depth: int
    sustain_s: float
    quiet_period_s: float
    peak_lead_s: float
    peaks: tuple[Peak, ...] = ()
    timezone: str = "UTC"

    @property
    def max_engines(self) -> int:
        return self.hot_size + self.cold_max


@dataclass(frozen=True)
class EngineView:
    name: str
    status: str  # scheduler.models.EngineStatus values
    max_num_seqs: int
    in_flight: int = 0
    started_at: datetime | None = None


@dataclass(frozen=True)
class QueueSample:
    """The pool's online queue at one moment."""

    at: datetime
    waiting: int
    oldest_wait_s: float  # 0 when nothing waits
    running: int


@dataclass(frozen=True)
class LastAction:
    """The pool's latest start or drain."""

    action: str  # "start" or "drain"
    at: datetime
    pending: bool  # still being carried out
    failed: bool = False


@dataclass(frozen=True)
class Decision:
    action: str  # "start", "drain" or "hold"
    code: str
    reason: str
    engines: tuple[str, ...] = field(default=())

    @property
    def changes_something(self) -> bool:
        return self.action != "hold"


def _hold(code: str, reason: str) -> Decision:
    return Decision("hold", code, reason)


def _active_peaks(policy: PoolPolicy, now: datetime) -> list[tuple[Peak, datetime, datetime]]:
    """Peaks whose window (lead time included) holds `now`, with their local start/end."""
    local = now.astimezone(ZoneInfo(policy.timezone))
    lead = timedelta(seconds=policy.peak_lead_s)
    found = []
    for peak in policy.peaks:
        # Yesterday's (a peak past midnight), today's and tomorrow's (lead time before a
        # peak just after midnight).
        for offset in (-1, 0, 1):
            day = local.date() + timedelta(days=offset)
            if day.weekday() not in peak.days:
                continue
            begins = datetime.combine(day, peak.start, tzinfo=local.tzinfo)
            ends = datetime.combine(day, peak.end, tzinfo=local.tzinfo)
            if ends <= begins:
                ends += timedelta(days=1)
            if begins - lead <= local < ends:
                found.append((peak, begins, ends))
    return found


def floor_for(policy: PoolPolicy, now: datetime) -> tuple[int, str]:
    """How many engines must be live now, and why."""
    peaks = _active_peaks(policy, now)
    if not peaks:
        return policy.hot_size, f"hot size {policy.hot_size}"
    peak, begins, ends = max(peaks, key=lambda p: p[0].extra)
    wanted = min(policy.max_engines, policy.hot_size + peak.extra)
    window = f"{begins:%a %H:%M}-{ends:%H:%M} {policy.timezone}"
    return wanted, f"scheduled peak '{peak.name}' ({window}): hot {policy.hot_size} + {peak.extra}"


def _over_target(policy: PoolPolicy, sample: QueueSample) -> bool:
    return sample.oldest_wait_s >= policy.target_wait_s or sample.waiting >= policy.target_depth


def _window(
    samples: Sequence[QueueSample], length_s: float, now: datetime, last: LastAction | None
) -> tuple[list[QueueSample], bool]:
    """The samples of the last `length_s` seconds after the last action, and whether they
    cover the whole window (a window cut short by a recent action is not covered)."""
    opens = now - timedelta(seconds=length_s)
    if last is not None and last.at > opens:
        return [s for s in samples if s.at > last.at], False
    # The window's first sample is the last one taken at or just before it opened: then
    # the samples speak for the whole window.
    before = [s for s in samples if opens - timedelta(seconds=COVERAGE_SLACK_S) <= s.at <= opens]
    first = before[-1].at if before else opens
    return [s for s in samples if first <= s.at <= now], bool(before)


def _startable(engines: Sequence[EngineView], count: int) -> list[str]:
    stopped = sorted(e.name for e in engines if e.status == "stopped")
    failed = sorted(e.name for e in engines if e.status == "failed")
    return (stopped + failed)[:count]


def _start(engines: Sequence[EngineView], count: int, code: str, reason: str) -> Decision:
    chosen = _startable(engines, count)
    if not chosen:
        return _hold(
            "no_engine_to_start",
            f"{reason}, but no stopped engine of the pool is registered "
            "(manage.py pool add-engines)",
        )
    short = f" (only {len(chosen)} registered and stopped)" if len(chosen) < count else ""
    return Decision("start", code, f"{reason}: start {', '.join(chosen)}{short}", tuple(chosen))


def decide(
    *,
    policy: PoolPolicy,
    engines: Sequence[EngineView],
    samples: Sequence[QueueSample],
    now: datetime,
    last: LastAction | None = None,
) -> Decision:
    """The one decision for the pool now (rules in the module docstring)."""
    samples = sorted(samples, key=lambda s: s.at)
    moving = sorted(e.name for e in engines if e.status in STARTING_STATES | {"draining"})
    if moving:
        states = ", ".join(f"{e.name} {e.status}" for e in engines if e.name in moving)
        return _hold("in_progress", f"waiting for {states}")
    if last is not None and last.pending:
        return _hold("in_progress", f"the {last.action} decided at {last.at:%H:%M:%S} runs")

    live = [e for e in engines if e.status in LIVE_STATES]
    ready = [e for e in engines if e.status == "ready"]
    floor, why_floor = floor_for(policy, now)
    if len(live) < floor:
        if last is not None and last.failed and now - last.at < timedelta(seconds=policy.sustain_s):
            return _hold(
                "retry_wait",
                f"{len(live)} live < {why_floor}, but the last {last.action} failed at "
                f"{last.at:%H:%M:%S}; retrying {policy.sustain_s:g} s after it",
            )
        return _start(engines, floor - len(live), "floor", f"{len(live)} live < {why_floor}")

    window, covered = _window(samples, policy.sustain_s, now, last)
    pressed = [s for s in window if _over_target(policy, s)]
    if pressed:
        latest = pressed[-1]
        state = (
            f"online queue {latest.waiting} waiting, oldest {latest.oldest_wait_s:.1f} s "
            f"(targets {policy.target_depth} / {policy.target_wait_s:g} s)"
        )
        if len(pressed) < len(window) or not covered:
            return _hold("spike", f"{state}, not yet for {policy.sustain_s:g} s")
        if len(live) >= policy.max_engines:
            return _hold(
                "at_max",
                f"{state} for {policy.sustain_s:g} s, but {len(live)} engines is the "
                f"pool's maximum (hot {policy.hot_size} + cold {policy.cold_max})",
            )
        return _start(engines, 1, "sustained", f"{state} for {policy.sustain_s:g} s")

    if len(live) > floor and ready:
        quiet, covered = _window(samples, policy.quiet_period_s, now, last)
        victim = min(
            ready,
            key=lambda e: (
                e.in_flight,
                -(e.started_at.timestamp() if e.started_at else 0.0),
                e.name,
            ),
        )
        room_after = sum(e.max_num_seqs for e in ready) - victim.max_num_seqs
        # With no engine left after the drain (hot size 0), quiet means nothing ran at all.
        if covered and all(s.waiting == 0 and s.running <= QUIET_FILL * room_after for s in quiet):
            peak_running = max(s.running for s in quiet)
            return Decision(
                "drain",
                "quiet",
                f"quiet for {policy.quiet_period_s:g} s (nothing waited, at most "
                f"{peak_running} running, fits {room_after} slots left); {len(live)} live > "
                f"{why_floor}: drain {victim.name}",
                (victim.name,),
            )
    return _hold("steady", f"{len(live)} live, floor {floor}; queue within target")
