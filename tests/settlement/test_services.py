"""settlement_record: pay per holder at its price, the policy's split, the receipts digest, exactly once."""

from __future__ import annotations

import threading
from datetime import timedelta
from decimal import Decimal

import pytest
from blake3 import blake3
from django.utils import timezone

from apps.governance.services import policy_approve, policy_propose
from apps.reputation.models import ReputationEvent
from apps.reputation.selectors import reputation_scores
from apps.reputation.services import reputation_penalize
from apps.settlement import services
from apps.settlement.models import LedgerEntry, PendingSettlement, Settlement
from apps.settlement.services import settlement_enqueue, settlement_record
from apps.settlement.tasks import settle_forward, sweep_pending_settlements
from core.errors import InvalidInput

pytestmark = pytest.mark.django_db

ROUTER, A, B = "r" * 64, "a" * 64, "b" * 64
C1, C2, C3 = "11" * 32, "2f" * 32, "A0" * 32


def payload(forward_id: str = "fwd-1") -> dict:
    return {"forward_id": forward_id, "router_id": ROUTER, "model_id": "qwen3-30b-a3b", "holders": [
        {"provider_id": A, "tokens": 90, "price_per_input_token": "0.000002", "commitments": [C1, C2]},
        {"provider_id": B, "tokens": 7, "price_per_input_token": "0.0000031", "commitments": [C3]},
        {"provider_id": ROUTER, "tokens": 50, "price_per_input_token": "0.000001", "commitments": []},
    ]}


def entries(settlement: Settlement) -> list[tuple[str, str, Decimal, int, str]]:
    return [(e.account, e.kind, e.amount, e.tokens, e.price) for e in settlement.entries.order_by("id")]


def test_each_holder_is_paid_price_times_tokens_split_by_the_active_policy() -> None:
    policy_approve(policy_id=policy_propose(changes={"settlement_holder_share": 0.8, "settlement_router_share": 0.15},
                                            proposed_by="t").pk, approved_by="t")
    settlement = settlement_record(**payload())
    d = Decimal
    # A: 90 × 0.000002 = 0.00018 → 0.000144 / 0.000027 / 0.000009. B: 7 × 0.0000031 = 0.0000217 →
    # 0.00001736 / 0.000003255 / 0.000001085. The router's own 50 tokens are not paid.
    assert entries(settlement) == [
        (A, "holder", d("0.000144"), 90, "0.000002"), (ROUTER, "router", d("0.000027"), 90, "0.000002"),
        ("burn", "burn", d("0.000009"), 90, "0.000002"),
        (B, "holder", d("0.00001736"), 7, "0.0000031"), (ROUTER, "router", d("0.000003255"), 7, "0.0000031"),
        ("burn", "burn", d("0.000001085"), 7, "0.0000031"),
    ]
    assert settlement.total == d("0.0002017")
    assert sum(e.amount for e in settlement.entries.all()) == settlement.total


def test_the_settlement_binds_to_the_concatenated_commitment_hashes() -> None:
    settlement = settlement_record(**payload())
    assert settlement.commitments == [C1, C2, C3.lower()]
    assert settlement.receipts_digest == blake3(bytes.fromhex(C1) + bytes.fromhex(C2) + bytes.fromhex(C3)).hexdigest()


def test_reputation_rises_by_exactly_the_net_holder_amount() -> None:
    reputation_penalize(provider_id=A, amount=Decimal(1), reason="timeout", ref="penalty:1")
    assert reputation_scores() == {A: -1.0}
    settlement_record(**payload())
    scores = reputation_scores()
    net = {e.account: e.amount for e in LedgerEntry.objects.filter(kind="holder")}
    assert Decimal(str(scores[A])) == Decimal(-1) + net[A] == Decimal("-0.999838")
    assert Decimal(str(scores[B])) == net[B]
    assert ROUTER not in scores  # its own work earns it nothing, and its router share is not reputation
    assert set(ReputationEvent.objects.filter(kind="credit").values_list("provider_id", "ref")) == {
        (A, "fwd-1"), (B, "fwd-1")}


def test_two_batches_of_one_holder_are_two_entries_and_one_credit() -> None:
    body = payload()
    body["holders"] = [body["holders"][0], {**body["holders"][0], "tokens": 10, "commitments": [C3]}]
    settlement_record(**body)
    assert LedgerEntry.objects.filter(kind="holder", account=A).count() == 2
    assert ReputationEvent.objects.get(provider_id=A).amount == Decimal("0.000162") + Decimal("0.000018")


def test_the_task_applied_three_times_pays_once() -> None:
    results = [settle_forward.apply(args=[payload()]) for _ in range(3)]
    assert all(r.successful() for r in results), [r.traceback for r in results]
    assert len({r.result["settlement_id"] for r in results}) == 1
    assert Settlement.objects.count() == 1 and LedgerEntry.objects.count() == 6
    assert ReputationEvent.objects.filter(kind="credit").count() == 2
    assert reputation_scores()[A] == pytest.approx(0.000162)


def test_a_repeat_with_another_payload_returns_the_first_settlement_unchanged() -> None:
    first = settlement_record(**payload())
    again = payload()
    again["holders"][0]["tokens"] = 1_000_000
    assert settlement_record(**again).pk == first.pk
    assert Settlement.objects.get().total == first.total


@pytest.mark.django_db(transaction=True, serialized_rollback=True)  # real commits; keeps the genesis policy
def test_two_concurrent_retries_pay_once(monkeypatch) -> None:
    """Both threads find no settlement before either inserts: the unique forward_id makes one of them
    hit IntegrityError, and it returns the settlement the other wrote."""
    barrier = threading.Barrier(2, timeout=10)
    looked = services._settled
    first_looks: set[int] = set()
    looks: list[bool] = []

    def racing_look(forward_id: str):
        found = looked(forward_id)
        looks.append(found is not None)
        me = threading.get_ident()
        if me not in first_looks:  # only the first look of each thread races; the look after the error does not
            first_looks.add(me)
            barrier.wait()
        return found

    monkeypatch.setattr(services, "_settled", racing_look)
    results: list[int] = []
    errors: list[BaseException] = []

    def settle() -> None:
        from django.db import connection
        try:
            results.append(settlement_record(**payload("fwd-race")).pk)
        except BaseException as exc:  # a thread's exception would vanish: report it below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=settle) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(results) == 2 and len(set(results)) == 1
    # Two first looks found nothing; the third is the loser's, after its IntegrityError, and finds the winner's.
    assert looks == [False, False, True]
    assert Settlement.objects.count() == 1 and LedgerEntry.objects.count() == 6
    assert ReputationEvent.objects.filter(kind="credit").count() == 2


@pytest.mark.parametrize(("change", "field"), [
    ({"tokens": -1}, r"holders\[0\]\.tokens"),
    ({"tokens": 1.0}, r"holders\[0\]\.tokens"),
    ({"price_per_input_token": "two"}, r"holders\[0\]\.price_per_input_token"),
    ({"price_per_input_token": 0.000002}, r"holders\[0\]\.price_per_input_token"),
    ({"price_per_input_token": "-1"}, r"holders\[0\]\.price_per_input_token"),
    ({"price_per_input_token": "NaN"}, r"holders\[0\]\.price_per_input_token"),
    ({"commitments": ["ab" * 31]}, r"holders\[0\]\.commitments\[0\]"),
    ({"commitments": [C1, "zz" * 32]}, r"holders\[0\]\.commitments\[1\]"),
    ({"provider_id": ""}, r"holders\[0\]\.provider_id"),
    ({"extra": 1}, "exactly the keys"),
])
def test_bad_input_names_the_field_and_writes_nothing(change, field) -> None:
    body = payload()
    body["holders"][0] = {**body["holders"][0], **change}
    with pytest.raises(InvalidInput, match=field):
        settlement_record(**body)
    with pytest.raises(InvalidInput, match="forward_id"):
        settlement_record(**{**payload(), "forward_id": ""})
    assert not Settlement.objects.exists() and not ReputationEvent.objects.exists()


def test_enqueue_sends_the_task_only_after_commit(django_capture_on_commit_callbacks, monkeypatch) -> None:
    sent: list[tuple] = []
    monkeypatch.setattr(services.current_app, "send_task", lambda name, args: sent.append((name, args)))
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        settlement_enqueue(**payload())
    assert sent == [] and len(callbacks) == 1
    callbacks[0]()
    assert sent == [("tenzro.settlement.settle_forward", [payload()])]
    with pytest.raises(InvalidInput, match="tokens"):
        settlement_enqueue(**{**payload(), "holders": [{**payload()["holders"][0], "tokens": -5}]})


def test_a_queued_settlement_stays_in_the_outbox_until_recorded_and_a_worker_start_requeues_it(
        django_capture_on_commit_callbacks, monkeypatch) -> None:
    sent: list[tuple] = []
    monkeypatch.setattr(services.current_app, "send_task", lambda name, args: sent.append((name, args)))
    with django_capture_on_commit_callbacks(execute=True):
        settlement_enqueue(**payload("fwd-1"))
        settlement_enqueue(**payload("fwd-2"))
    assert [p.forward_id for p in PendingSettlement.objects.order_by("created_at")] == ["fwd-1", "fwd-2"]
    settlement_record(**payload("fwd-1"))
    assert list(PendingSettlement.objects.values_list("forward_id", flat=True)) == ["fwd-2"]
    sent.clear()
    # the Celery worker starts again (its predecessor was killed holding fwd-2's message)
    assert services.settlements_resume() == ["fwd-2"]
    assert sent == [("tenzro.settlement.settle_forward", [payload("fwd-2")])]
    settle_forward.apply(args=[payload("fwd-2")]).get()
    settle_forward.apply(args=[payload("fwd-2")]).get()  # the broker's own copy, redelivered late
    assert not PendingSettlement.objects.exists() and Settlement.objects.count() == 2
    assert services.settlements_resume() == []


def test_the_periodic_sweep_requeues_only_settlements_pending_longer_than_its_interval(
        django_capture_on_commit_callbacks, monkeypatch, settings) -> None:
    sent: list[str] = []
    monkeypatch.setattr(services.current_app, "send_task", lambda name, args: sent.append(args[0]["forward_id"]))
    with django_capture_on_commit_callbacks(execute=True):
        settlement_enqueue(**payload("old"))
        settlement_enqueue(**payload("fresh"))
    PendingSettlement.objects.filter(forward_id="old").update(created_at=timezone.now() - timedelta(seconds=120))
    sent.clear()
    settings.TENZRO_SETTLEMENT_SWEEP_S = 60
    assert sweep_pending_settlements.apply().get() == ["old"]  # the fresh one's message is still in flight
    assert sent == ["old"]
