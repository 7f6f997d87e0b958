"""How the expert worker reads what the control plane owns.

The control plane (the node's database, written by the web process, Celery and gossip) owns
the governance policy, and with the coming issues the provider records learned by gossip and
their QUIC certificate pins. The worker never reads those tables ad hoc: it goes through this
view, which calls the owning app's documented selectors on a worker thread (never on the
event loop) and keeps each answer for `ttl_s` seconds, so a forward that needs the policy a
hundred times costs one query. An approved policy proposal therefore reaches the worker within
`ttl_s` (TENZRO_WORKER_CONTROL_TTL_S), without a restart. docs/operations.md describes it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from apps.governance.selectors import policy_active, policy_to_dict
from apps.node.db_threads import with_kept_connections


class ControlPlaneView:
    def __init__(self, *, executor: Executor, ttl_s: float) -> None:
        self._executor = executor
        self._ttl_s = ttl_s
        self._cache: dict[str, tuple[float, Any]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def read(self, key: str, func: Callable[[], Any]) -> Any:
        """`func()` (a documented selector of the owning app) on the control thread, kept `ttl_s`
        under `key`."""
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:  # concurrent readers share one query
            hit = self._cache.get(key)
            if hit is not None and time.monotonic() - hit[0] < self._ttl_s:
                return hit[1]
            value = await asyncio.get_running_loop().run_in_executor(self._executor, with_kept_connections(func))
            self._cache[key] = (time.monotonic(), value)
            return value

    async def policy(self) -> dict[str, Any]:
        """The active governance policy (apps.governance.selectors), as tenzro_policyGet shows it."""
        return await self.read("policy", lambda: policy_to_dict(policy_active()))
