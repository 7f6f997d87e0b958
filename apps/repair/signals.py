"""Signals of the repair app: the dashboard shows each pass as it ends, without repair knowing it."""

from django.dispatch import Signal

# Sent after a pass's record commits; kwargs: repair_pass (a summary dict, JSON-ready).
repair_pass_done = Signal()
