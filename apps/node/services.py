"""Writes and announcements of the node app."""

from __future__ import annotations

from django.db import transaction

from apps.node.selectors import node_processes
from apps.node.signals import node_processes_read


def node_processes_announce() -> dict:
    """Read what the supervisor last wrote about each process and announce it (node_processes_read),
    so open dashboards show process states without polling. Returns what was announced."""
    processes = node_processes()
    # Not inside a transaction here: on_commit runs at once; it keeps the rule in one place.
    transaction.on_commit(lambda: node_processes_read.send(sender=None, processes=processes))
    return processes
