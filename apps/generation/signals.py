"""Signals of the generation app: the dashboard follows a generation without generation knowing it."""

from django.dispatch import Signal

# Sent after each step's record commits; kwargs: generation (selectors.generation_to_dict, JSON-ready,
# with the newest step only under "step").
generation_progressed = Signal()
