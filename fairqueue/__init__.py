"""The fair queue: hierarchical weighted fair queueing and memory admission in Redis.

Plain Python (no Django). `FairQueue` (queue.py) is the API; `keys.py` names every Redis
key; `lua/` holds the atomic steps; `model.py` is a pure reference of the pick rule.
`leases.py` leases a tenant's quota to pools, one hash slot per step, so that each pool's
decisions stay in its own slot on Redis Cluster (pure reference: `leases_model.py`).
"""

from fairqueue.domain import (
    CheckReport,
    EnginePolicy,
    FairQueueConfig,
    Job,
    JobRejected,
    JobState,
    QueueRow,
    Snapshot,
    TenantPolicy,
    config_from_settings,
)
from fairqueue.queue import FairQueue, LastWords

__all__ = [
    "CheckReport",
    "EnginePolicy",
    "FairQueue",
    "FairQueueConfig",
    "Job",
    "JobRejected",
    "JobState",
    "LastWords",
    "QueueRow",
    "Snapshot",
    "TenantPolicy",
    "config_from_settings",
]
