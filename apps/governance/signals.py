"""Signals of the governance app: other parts react to policy changes without governance
knowing them (the dashboard pushes the new policy to open pages; workers re-read it)."""

from django.dispatch import Signal

# Sent after the transaction that activated a policy commits; kwargs: policy (tenzro_policyGet's dict).
policy_activated = Signal()
