"""Signals of the gossip view: the dashboard shows membership and holdings changes live, without
gossip knowing it."""

from django.dispatch import Signal

# Sent after a merge that stored new records or fresher heartbeats, or an expiry that dropped
# providers, commits; kwargs: changed (provider ids whose record was stored: new members or new
# seqs), removed (provider ids dropped), alive ({provider id: alive_ms} of the heartbeats that moved
# a known provider's liveness forward). One signal per merge, however many heartbeats it carried:
# heartbeats are the bulk of gossip traffic, and the network page's liveness is only true with them.
providers_changed = Signal()

# Sent after a merge that changed some holdings commits; kwargs: model_ids (sorted list of str),
# the models whose holders changed (added, replaced or removed).
holdings_changed = Signal()
