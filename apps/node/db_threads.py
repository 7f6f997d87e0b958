"""Database connections of a worker's own long-lived threads (its record writers, its state
publisher, its control-plane reads): kept from one job to the next.

Django ties a connection's life to a request. With CONN_MAX_AGE 0 (the default, and what the web
process under ASGI must keep) close_old_connections() closes it before every job, so each job of
such a thread connected anew: 0.7 ms on SQLite and 2.9 ms on PostgreSQL, a server process forked
each time (2-core machine, loopback). A worker thread serves no request: its connection is kept,
and closed only where Django would close an unusable one (an error since the last job and a
failed check, autocommit left changed), when the operator's own CONN_MAX_AGE is longer and ran
out, or once it has been kept KEEP_S (a server may drop connections idle that long).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from django.db import connections

KEEP_S = 300.0

P = ParamSpec("P")
T = TypeVar("T")


def keep_or_renew_connections(*, keep_s: float = KEEP_S) -> None:
    """Before a job on a worker thread: keep this thread's connections, renew the unusable ones."""
    now = time.monotonic()
    for connection in connections.all(initialized_only=True):
        close_at = connection.close_at  # set by Django when it connected, from CONN_MAX_AGE (0: at once)
        if connection.connection is not None and close_at is not None \
                and close_at != getattr(connection, "_kept_close_at", None):  # not ours: connected since
            connection.close_at = connection._kept_close_at = max(close_at, now + keep_s)
        connection.close_if_unusable_or_obsolete()


def with_kept_connections(func: Callable[P, T]) -> Callable[P, T]:
    """`func` run after keep_or_renew_connections, for a job on a worker's own thread."""
    @functools.wraps(func)
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        keep_or_renew_connections()
        return func(*args, **kwargs)

    return run


def with_connections_closed_after(func: Callable[P, T]) -> Callable[P, T]:
    """`func` whose thread closes its connections when it returns: for a pool thread that reads the
    database only now and then (the compute threads, to find a blob's holders), so that none holds one
    idle between (a PostgreSQL server counts each against its max_connections)."""
    @functools.wraps(func)
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return func(*args, **kwargs)
        finally:
            connections.close_all()

    return run
