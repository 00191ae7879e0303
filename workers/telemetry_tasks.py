"""Celery tasks of telemetry: the sampler tick (run by the workers' ticker) and the history
rollup (sent by beat)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from celery import shared_task

from telemetry.history import telemetry_rollup
from telemetry.sampling import telemetry_sample


@shared_task(name="workers.telemetry_sample")
def sample() -> dict[str, Any]:
    """Every few seconds: GPUs, engines' /metrics and load, rejections, ledger
    counters (telemetry.sampling)."""
    report = telemetry_sample()
    return {
        "skipped": report.skipped,
        "gpus": len(report.gpus),
        "engines": {e.engine: round(e.load, 3) for e in report.engines},
        "rejections": report.rejections,
        "ledger_rows": report.ledger_rows,
    }


@shared_task(name="workers.telemetry_rollup")
def rollup() -> dict[str, int]:
    """Now and then: history downsampled as it ages, and dropped past the retention."""
    return asdict(telemetry_rollup())
