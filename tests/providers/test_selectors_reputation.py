"""The shard view carries each provider's reputation, price and the policy's floor into the planner."""

from __future__ import annotations

from decimal import Decimal

import pytest

from apps.governance.services import policy_approve, policy_propose
from apps.providers import selectors, services
from apps.providers.records import Holding as RecordHolding
from apps.reputation.services import reputation_penalize
from core.shardmap.planner import plan_dispatch
from testkit.records import new_key, signed_record

pytestmark = pytest.mark.django_db
MODEL = "test/moe-tiny"


def test_views_carry_reputation_price_and_the_floor_and_the_planner_skips_below_it() -> None:
    now = services.now_ms()
    keys = [new_key(seed) for seed in (11, 12)]
    for key, price in zip(keys, ("0.000002", "0.000003"), strict=True):
        record = signed_record(key, seq=now, at_ms=now, price_per_input_token=price,
                               holdings=(RecordHolding(MODEL, 0, 0, "Warm", 800, None),))
        services.gossip_receive(records=[record.envelope()], heartbeats=[])
    low, good = (k.verify_key.encode().hex() for k in keys)
    reputation_penalize(provider_id=low, amount=Decimal(20), reason="timeout", ref="penalty:1")
    policy_approve(policy_id=policy_propose(changes={"reputation_floor": -10.0}, proposed_by="t").pk, approved_by="t")

    views = {v.provider_id: v for v in selectors.provider_views()}
    assert (views[low].reputation, views[low].price_per_input_token) == (-20.0, "0.000002")
    assert (views[good].reputation, views[good].price_per_input_token) == (0.0, "0.000003")
    index = selectors.shard_index(MODEL)
    assert index.policy.reputation_floor == -10.0
    plan = plan_dispatch([{"token_index": 0, "experts": [{"layer": 0, "expert": 0}]}], index)
    assert [(b["provider"], b["backups"]) for b in plan["batches"]] == [(good, [])]
