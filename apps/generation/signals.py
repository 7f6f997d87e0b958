"""Signals of the generation app: the dashboard follows a generation without generation knowing it."""

from django.dispatch import Signal

# Sent after each batch of steps commits; kwargs: generation (selectors.generation_to_dict, JSON-ready,
# with the steps just written under "steps" and the newest of them under "step").
generation_progressed = Signal()
# Sent while generations run, at most twice a second, and once when none does; kwargs: batching (the
# router's running and waiting generations, KV bytes, recent iterations and tokens per second).
generation_batching = Signal()
