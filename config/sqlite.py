"""How the platform opens a SQLite database (the default of a fresh checkout)."""

from __future__ import annotations


def sqlite_options(timeout_s: float) -> dict[str, object]:
    """Django's OPTIONS for SQLite, where the web, each worker's threads and its ticker share
    one file and SQLite takes one writer at a time:

    - a write waits its turn up to `timeout_s` (Django's default, 5 s, ran out on a starved
      machine);
    - a transaction takes the write lock when it begins (IMMEDIATE): one that read first and
      then wrote failed at once with "database is locked" while another wrote, without
      waiting (SQLite's rule against deadlocks; seen in `engine_start` under the scaler);
    - WAL lets readers go on while one writes.
    """
    return {
        "timeout": timeout_s,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL;",
    }
