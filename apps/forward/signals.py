"""Signals of the forward app: the dashboard lists forwards as they end, without forward knowing it."""

from django.dispatch import Signal

# Sent after a ForwardRecord commits; kwargs: forward (selectors.forward_record_to_dict's JSON-ready dict).
forward_recorded = Signal()
