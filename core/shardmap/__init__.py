"""Shard map and dispatch planner: pure functions over the gossip view (no Django)."""
