"""Signals of the worker app: the dashboard shows the runtime live, without the worker knowing it."""

from django.dispatch import Signal

# Sent after a publish or a heartbeat of the worker state commits; kwargs: status
# (worker_status_published(): experts, gates, memory figures, kernel, committed_tps, stale).
worker_state_published = Signal()
