"""How the worker reads the control plane: through selectors on a worker thread, cached for a TTL."""

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

from apps.governance import services
from apps.worker.control_plane import ControlPlaneView

# transaction: the view reads from its own thread; serialized_rollback: the seeded policy survives
pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)


def test_an_approved_policy_reaches_the_worker_within_the_ttl() -> None:
    executor = ThreadPoolExecutor(1)
    view = ControlPlaneView(executor=executor, ttl_s=0.3)

    async def scenario():
        first = await view.policy()
        proposal = await asyncio.get_running_loop().run_in_executor(
            executor, lambda: services.policy_propose(changes={"min_replication": 3}, proposed_by="test"))
        await asyncio.get_running_loop().run_in_executor(
            executor, lambda: services.policy_approve(policy_id=proposal.pk, approved_by="test"))
        cached = await view.policy()
        await asyncio.sleep(0.35)
        return first, cached, await view.policy()

    first, cached, fresh = asyncio.run(scenario())
    executor.shutdown()
    assert first["min_replication"] == 2 and first["status"] == "active"
    assert cached == first  # within the TTL: no query
    assert fresh["min_replication"] == 3 and fresh["id"] != first["id"]
