"""A worker's own threads keep their database connection from one job to the next (apps/node/db_threads.py),
where close_old_connections() under CONN_MAX_AGE 0 connected anew for every job, and renew it once it
broke or was kept its time."""

from concurrent.futures import ThreadPoolExecutor

import pytest
from django.conf import settings
from django.db import close_old_connections, connection

from apps.node.db_threads import keep_or_renew_connections, with_connections_closed_after, with_kept_connections

pytestmark = pytest.mark.django_db  # queries of their own on other threads: SELECT 1 only


def _raw() -> object:
    """The DB-API connection a query of this thread ran on (kept alive by the caller: ids get reused)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return connection.connection


def _jobs(*funcs):
    with ThreadPoolExecutor(1) as thread:  # one long-lived thread, as a worker's record writer
        return [thread.submit(f).result() for f in funcs]


def test_a_worker_thread_keeps_its_connection_where_close_old_connections_reconnects() -> None:
    assert settings.DATABASES["default"]["CONN_MAX_AGE"] == 0  # the default the web process must keep

    def closing() -> object:
        close_old_connections()
        return _raw()

    kept = with_kept_connections(_raw)
    first, second, third = _jobs(kept, kept, kept)
    assert first is second is third
    before, after = _jobs(closing, closing)
    assert before is not after


def test_a_broken_connection_is_renewed_before_the_next_job() -> None:
    def break_it() -> object:
        before = _raw()
        connection.errors_occurred = True  # as Django marks it after a database error ...
        connection.is_usable = lambda: False  # ... and the server went away: its check fails
        return before

    broken, renewed = _jobs(with_kept_connections(break_it), with_kept_connections(_raw))
    assert broken is not renewed


def test_a_connection_kept_its_time_is_renewed() -> None:
    def job() -> object:
        keep_or_renew_connections(keep_s=0)
        return _raw()

    first, second = _jobs(job, job)
    assert first is not second


def test_a_pool_thread_that_reads_now_and_then_keeps_no_connection_idle() -> None:
    def read_then_look() -> bool:
        with_connections_closed_after(_raw)()
        return connection.connection is None

    assert _jobs(read_then_look, read_then_look) == [True, True]
