"""SQLite as the platform opens it: a transaction that reads and then writes, while another
process's transaction writes, waits for it instead of failing with "database is locked"
(engine_start's row read-then-write under the scaler did, and the engine stayed "starting")."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import DatabaseError, transaction
from django.db.utils import ConnectionHandler

from config.sqlite import sqlite_options


@pytest.fixture
def connections_to(
    monkeypatch: pytest.MonkeyPatch, django_db_blocker: Any
) -> Iterator[Callable[..., ConnectionHandler]]:
    """Two connections ("a", "b") to a SQLite file of the test's own with the given OPTIONS,
    which `transaction.atomic(using=...)` uses (not the test run's database)."""

    def make(path: Path, options: dict[str, object]) -> ConnectionHandler:
        settings = {"ENGINE": "django.db.backends.sqlite3", "NAME": str(path), "OPTIONS": options}
        handler = ConnectionHandler({"default": settings, "a": dict(settings), "b": dict(settings)})
        monkeypatch.setattr(transaction, "get_connection", lambda using=None: handler[using])
        return handler

    with django_db_blocker.unblock():  # pytest-django blocks every connection by default
        yield make


def read_then_write_while_another_writes(handler: ConnectionHandler) -> tuple[int, list[str]]:
    """B reads; A writes and holds its transaction 0.5 s; B then writes. Returns the final
    value (12 when both writes went in) and the errors either met."""
    b = handler["b"]  # connections are per thread: A's is made in its own
    with b.cursor() as cursor:
        cursor.execute("CREATE TABLE t (x INTEGER)")
        cursor.execute("INSERT INTO t VALUES (1)")
    b_has_read, errors = threading.Event(), []

    def a_writes() -> None:
        b_has_read.wait(5)
        a = handler["a"]
        try:
            with transaction.atomic(using="a"), a.cursor() as cursor:
                cursor.execute("UPDATE t SET x = x + 1")
                time.sleep(0.5)
        except DatabaseError as exc:
            errors.append(f"A: {exc}")
        finally:
            a.close()

    writer = threading.Thread(target=a_writes)
    writer.start()
    try:
        with transaction.atomic(using="b"), b.cursor() as cursor:
            cursor.execute("SELECT x FROM t")
            b_has_read.set()
            time.sleep(0.1)  # A's write comes in between
            cursor.execute("UPDATE t SET x = x + 10")
    except DatabaseError as exc:
        errors.append(f"B: {exc}")
    finally:
        b_has_read.set()
        writer.join()
    with b.cursor() as cursor:
        cursor.execute("SELECT x FROM t")
        final = int(cursor.fetchone()[0])
    b.close()
    return final, errors


def test_a_read_then_write_waits_for_the_other_writer(tmp_path: Path, connections_to):
    handler = connections_to(tmp_path / "db.sqlite3", sqlite_options(5.0))
    assert read_then_write_while_another_writes(handler) == (12, [])


def test_without_the_options_it_fails_at_once(tmp_path: Path, connections_to):
    """The same steps with Django's defaults: the failure the options exist for."""
    handler = connections_to(tmp_path / "db.sqlite3", {"timeout": 5.0})
    final, errors = read_then_write_while_another_writes(handler)
    assert final != 12
    assert any("database is locked" in error for error in errors), errors


def test_the_file_runs_in_wal_mode(tmp_path: Path, connections_to):
    connection = connections_to(tmp_path / "db.sqlite3", sqlite_options(5.0))["a"]
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA journal_mode")
        assert cursor.fetchone()[0] == "wal"
    connection.close()
