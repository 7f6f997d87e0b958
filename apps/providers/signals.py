"""Signals of the gossip view: the dashboard redraws a shard map without providers knowing it."""

from django.dispatch import Signal

# Sent after a merge that changed some holdings commits; kwargs: model_ids (sorted list of str),
# the models whose holders changed (added, replaced or removed).
holdings_changed = Signal()
