"""The order in which a node recovers lost experts (pure: no Django; apps/repair/recovery.py acts on it).

Every node that prepared a model can publish its lost experts again, and these nodes do not know
each other. Taken in (layer, expert) order, two of them would both recover the same few experts
first, pass after pass; taken in an order of their own (the expert's key hashed with the node's
id, as in the rendezvous hashing of apps.repair.selection), they mostly recover different ones,
and the copies one of them makes twice are trimmed by ordinary repair.
"""

from __future__ import annotations

from collections.abc import Iterable

from apps.repair.selection import expert_name, key64


def recovery_order(model_id: str, self_id: str, lost: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """`lost` (layer, expert) pairs in this node's order: key64(expert name + "@" + node id) ascending."""
    return sorted(lost, key=lambda k: (key64(f"{expert_name(model_id, *k)}@{self_id}"), k))
