"""Signals of the node app: the dashboard shows the process list live, without the node app knowing it."""

from django.dispatch import Signal

# Sent on every processes tick (apps/node/services.py); kwargs: processes (node_processes()'s dict).
node_processes_read = Signal()
