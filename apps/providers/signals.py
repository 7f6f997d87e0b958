"""Signals of the providers app: the dashboard shows membership changes live, without gossip knowing it."""

from django.dispatch import Signal

# Sent after a merge that stored new records, or an expiry that dropped providers, commits;
# kwargs: changed (provider ids whose record was stored: new members or new seqs), removed
# (provider ids dropped). Heartbeat-only merges send nothing: they are the bulk of gossip traffic.
providers_changed = Signal()
