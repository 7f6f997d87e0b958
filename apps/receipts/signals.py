"""Signals of the receipts app: other parts react without receipts knowing them (the dashboard
lists newly kept receipts live)."""

from django.dispatch import Signal

# Sent after the transaction that kept receipts commits; kwargs: receipts (tenzro_moeListReceipts'
# rows, times as ISO 8601 strings).
receipts_kept = Signal()

# Sent after the transaction that decided a dispute commits; kwargs: receipt_id, dispute_id, state
# ("upheld" or "dismissed"), difference and tolerance (floats, or None).
dispute_decided = Signal()
