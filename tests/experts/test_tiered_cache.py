"""Memory-tier LRU over the disk tier: byte bound at every step, spill and bit-identical
promotion, readahead, restart."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from core.experts.errors import CorruptPayload, ExpertNotLoaded, InsufficientMemory
from core.experts.runtime import ExpertRuntime
from core.experts.tiered_cache import FALLBACK_BUDGET, default_memory_budget, model_dir_name
from tests.experts.factories import MODEL, expert_payload, expert_weights

D_MODEL, D_FF = 64, 256
F32_BYTES = 3 * D_MODEL * D_FF * 4  # 196,608 bytes resident per dense expert


def _load(rt: ExpertRuntime, n: int, quant: str | None = None, seed: int = 30) -> dict[int, dict]:
    rng = np.random.default_rng(seed)
    weights = {e: expert_weights(rng, D_MODEL, D_FF) for e in range(n)}
    for e, w in weights.items():
        rt.expert_load(payload=expert_payload(w, expert=e, quant=quant))
        _check_bound(rt)
    return weights


def _check_bound(rt: ExpertRuntime) -> dict:
    status = rt.status()
    resident = sum(row["memory_bytes"] for row in status["experts"])
    assert resident == status["memory_used_bytes"] <= status["memory_budget_bytes"]
    return status


def _tiers(rt: ExpertRuntime) -> dict[int, str]:
    return {row["expert"]: row["tier"] for row in rt.status()["experts"]}


def test_lru_keeps_byte_bound_and_spills(tmp_path):
    rt = ExpertRuntime(data_dir=tmp_path, memory_budget_bytes=int(2.5 * F32_BYTES))
    _load(rt, 5)
    assert _tiers(rt) == {0: "disk", 1: "disk", 2: "disk", 3: "memory", 4: "memory"}
    status = _check_bound(rt)
    assert status["counts"] == {"warm": 2, "cold": 3, "gates": 0}
    assert {e["expert"]: e["residency"] for e in status["experts"]} == {
        0: "Cold", 1: "Cold", 2: "Cold", 3: "Warm", 4: "Warm"}
    # touching 3 makes 4 the LRU victim when 0 is promoted
    x = np.random.default_rng(1).standard_normal((4, D_MODEL)).astype(np.float32)
    rt.execute(model_id=MODEL, layer=0, expert=3, hidden=x)
    rt.execute(model_id=MODEL, layer=0, expert=0, hidden=x)
    _check_bound(rt)
    assert _tiers(rt) == {0: "memory", 1: "disk", 2: "disk", 3: "memory", 4: "disk"}


@pytest.mark.parametrize("quant", [None, "q8_0", "q4_k_m"])
def test_spilled_expert_comes_back_bit_identical(tmp_path, quant):
    rt = ExpertRuntime(data_dir=tmp_path, memory_budget_bytes=1)  # no expert fits: decoded per call
    _load(rt, 1, quant=quant)
    rt2 = ExpertRuntime(data_dir=tmp_path / "big", memory_budget_bytes=1 << 30)
    _load(rt2, 1, quant=quant)
    x = np.random.default_rng(2).standard_normal((9, D_MODEL)).astype(np.float32)
    warm = rt2.execute(model_id=MODEL, layer=0, expert=0, hidden=x)
    cold = rt.execute(model_id=MODEL, layer=0, expert=0, hidden=x)  # decoded per call, never resident
    assert rt.status()["memory_used_bytes"] == 0
    assert np.array_equal(warm, cold)


def test_round_trip_through_disk_tier_is_bit_identical(tmp_path):
    rt = ExpertRuntime(data_dir=tmp_path, memory_budget_bytes=F32_BYTES)  # one expert at a time
    _load(rt, 3, quant="q4_k_m")
    x = np.random.default_rng(3).standard_normal((5, D_MODEL)).astype(np.float32)
    first = {e: rt.execute(model_id=MODEL, layer=0, expert=e, hidden=x) for e in range(3)}
    for _ in range(2):  # every call below spills one expert and promotes another
        for e in range(3):
            assert np.array_equal(rt.execute(model_id=MODEL, layer=0, expert=e, hidden=x), first[e])
            _check_bound(rt)


def test_readahead_makes_selected_experts_warm(tmp_path):
    rt = ExpertRuntime(data_dir=tmp_path, memory_budget_bytes=3 * F32_BYTES)
    _load(rt, 6)
    assert [e for e, t in _tiers(rt).items() if t == "memory"] == [3, 4, 5]
    rt.readahead([(MODEL, 0, 0), (MODEL, 0, 1), (MODEL, 0, 99), ("other", 0, 0)])  # unknown keys skipped
    tiers = _tiers(rt)
    assert tiers[0] == tiers[1] == "memory"
    _check_bound(rt)


def test_needs_readahead_says_whether_readahead_would_load_a_held_expert(tmp_path):
    """What lets a router gate a decode step on its event loop: no held expert it chose is on disk."""
    rt = ExpertRuntime(data_dir=tmp_path, memory_budget_bytes=3 * F32_BYTES)
    _load(rt, 6)  # 0-2 on disk, 3-5 in memory
    assert not rt.needs_readahead([(MODEL, 0, 3), (MODEL, 0, 5), (MODEL, 0, 99), ("other", 0, 0)])
    assert rt.needs_readahead([(MODEL, 0, 3), (MODEL, 0, 1)])
    rt.readahead([(MODEL, 0, 1)])
    assert not rt.needs_readahead([(MODEL, 0, 1)])
    assert (MODEL, 0, 0) in rt._cache and (MODEL, 0, 99) not in rt._cache


def test_restart_keeps_disk_tier_experts(tmp_path):
    rt = ExpertRuntime(data_dir=tmp_path, memory_budget_bytes=2 * F32_BYTES)
    weights = _load(rt, 4, quant="q8_0")
    rt.expert_load(payload=expert_payload(weights[1], expert=1, quant="q8_0"), blob_uri="tenzro://blob/" + "ab" * 32)
    x = np.random.default_rng(4).standard_normal((3, D_MODEL)).astype(np.float32)
    before = {e: rt.execute(model_id=MODEL, layer=0, expert=e, hidden=x) for e in range(4)}
    del rt
    again = ExpertRuntime(data_dir=tmp_path, memory_budget_bytes=2 * F32_BYTES)
    status = again.status()
    assert [(r["expert"], r["tier"]) for r in status["experts"]] == [(e, "disk") for e in range(4)]
    assert status["experts"][1]["blob_uri"] == "tenzro://blob/" + "ab" * 32
    assert status["experts"][0]["formats"] == {"gate_proj": "Q8_0", "up_proj": "Q8_0", "down_proj": "Q8_0"}
    for e in range(4):
        assert np.array_equal(again.execute(model_id=MODEL, layer=0, expert=e, hidden=x), before[e])


def test_unload_removes_both_tiers(tmp_path):
    rt = ExpertRuntime(data_dir=tmp_path, memory_budget_bytes=F32_BYTES)
    _load(rt, 2)
    rt.expert_unload(model_id=MODEL, layer=0, expert=0)  # disk tier
    rt.expert_unload(model_id=MODEL, layer=0, expert=1)  # memory tier
    assert rt.status()["experts"] == [] and rt.status()["memory_used_bytes"] == 0
    with pytest.raises(ExpertNotLoaded, match="expert=1"):
        rt.expert_unload(model_id=MODEL, layer=0, expert=1)
    assert ExpertRuntime(data_dir=tmp_path).status()["experts"] == []


@pytest.mark.parametrize("damage", ["truncated", "one_bit_in_a_weight"])
def test_a_corrupt_disk_tier_file_is_forgotten_not_decoded(tmp_path, damage):
    rt = ExpertRuntime(data_dir=tmp_path, memory_budget_bytes=F32_BYTES)
    _load(rt, 2)
    path = next(tmp_path.rglob("expert0.safetensors"))
    data = bytearray(path.read_bytes())
    if damage == "truncated":
        data = data[:100]
    else:  # still a well-formed payload: without the hash it would decode and compute a wrong answer
        data[-5] ^= 0x01
    path.write_bytes(bytes(data))
    told: list[tuple] = []
    again = ExpertRuntime(data_dir=tmp_path, memory_budget_bytes=F32_BYTES,
                          on_corrupt=lambda key, uri: told.append((key, uri)))  # a restart: expert 0 is Cold
    with pytest.raises(CorruptPayload, match="does not match its hash"):
        again.execute(model_id=MODEL, layer=0, expert=0, hidden=np.zeros((1, D_MODEL), np.float32))
    assert told == [((MODEL, 0, 0), None)]
    assert [r["expert"] for r in again.status()["experts"]] == [1]
    assert not path.exists() and not path.with_suffix(".json").exists()
    with pytest.raises(ExpertNotLoaded):
        again.execute(model_id=MODEL, layer=0, expert=0, hidden=np.zeros((1, D_MODEL), np.float32))


def test_concurrent_execution_under_tiny_budget(tmp_path):
    rt = ExpertRuntime(data_dir=tmp_path, memory_budget_bytes=int(1.5 * F32_BYTES))
    _load(rt, 4, quant="q8_0")
    x = np.random.default_rng(5).standard_normal((6, D_MODEL)).astype(np.float32)
    expected = {e: rt.execute(model_id=MODEL, layer=0, expert=e, hidden=x) for e in range(4)}
    errors: list[BaseException] = []

    def worker(offset: int) -> None:
        try:
            for i in range(20):
                e = (i + offset) % 4
                assert np.array_equal(rt.execute(model_id=MODEL, layer=0, expert=e, hidden=x), expected[e])
                _check_bound(rt)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors


def test_a_reservation_moves_experts_to_disk_and_bounds_the_tier(tmp_path):
    rt = ExpertRuntime(data_dir=tmp_path, memory_budget_bytes=int(3.5 * F32_BYTES))
    weights = _load(rt, 3)
    assert set(_tiers(rt).values()) == {"memory"}
    rt.reserve_memory("dense weights of m", 2 * F32_BYTES)  # the LRU two make room
    assert _tiers(rt) == {0: "disk", 1: "disk", 2: "memory"}
    status = rt.status()
    assert status["memory_used_bytes"] == 3 * F32_BYTES <= status["memory_budget_bytes"]
    x = np.random.default_rng(2).standard_normal((2, D_MODEL)).astype(np.float32)
    rt.execute(model_id=MODEL, layer=0, expert=0, hidden=x)  # promoted: another goes, the bound holds
    assert sorted(_tiers(rt).values()) == ["disk", "disk", "memory"] and rt.status()["memory_used_bytes"] <= int(
        3.5 * F32_BYTES)
    with pytest.raises(InsufficientMemory, match="do not fit"):
        rt.reserve_memory("dense weights of n", 2 * F32_BYTES)  # with m's: over the budget
    assert rt.status()["memory_used_bytes"] == 3 * F32_BYTES  # refused: nothing changed
    rt.reserve_memory("dense weights of m", 0)  # released: experts may come back
    rt.execute(model_id=MODEL, layer=0, expert=1, hidden=x)
    assert sorted(_tiers(rt).values()) == ["disk", "memory", "memory"] and len(weights) == 3


def test_budget_defaults(monkeypatch):
    assert default_memory_budget() > 0
    import psutil

    def broken():
        raise OSError("no /proc")

    monkeypatch.setattr(psutil, "virtual_memory", broken)
    assert default_memory_budget() == FALLBACK_BUDGET


def test_model_dir_names_are_safe():
    assert "/" not in model_dir_name("Qwen/Qwen3-30B-A3B")
    assert model_dir_name("..") != ".." and not model_dir_name("..").startswith(".")
    assert model_dir_name("a/b") != model_dir_name("a_b")



def test_a_smaller_budget_moves_the_least_recently_used_experts_to_disk(tmp_path):
    """A node's host share can shrink while it runs: LRU experts go to disk, reservations stay."""
    rt = ExpertRuntime(data_dir=tmp_path, memory_budget_bytes=int(3.5 * F32_BYTES))
    _load(rt, 3)
    x = np.random.default_rng(3).standard_normal((2, D_MODEL)).astype(np.float32)
    rt.execute(model_id=MODEL, layer=0, expert=0, hidden=x)  # 1 is now the least recently used
    rt.set_memory_budget(int(2.5 * F32_BYTES))
    assert _tiers(rt) == {0: "memory", 1: "disk", 2: "memory"}
    _check_bound(rt)
    rt.reserve_memory("dense weights of m", F32_BYTES)
    rt.set_memory_budget(F32_BYTES // 2)  # below the reservation: every expert goes, the reservation stays
    status = rt.status()
    assert set(_tiers(rt).values()) == {"disk"} and status["memory_used_bytes"] == F32_BYTES
    with pytest.raises(ValueError):
        rt.set_memory_budget(-1)


def test_warm_brings_a_restarted_nodes_experts_back_without_evicting(tmp_path):
    rt = ExpertRuntime(data_dir=tmp_path, memory_budget_bytes=3 * F32_BYTES)
    _load(rt, 4)
    x = np.random.default_rng(5).standard_normal((3, D_MODEL)).astype(np.float32)
    before = {e: rt.execute(model_id=MODEL, layer=0, expert=e, hidden=x) for e in range(4)}
    del rt
    changes: list[int] = []
    again = ExpertRuntime(data_dir=tmp_path, memory_budget_bytes=3 * F32_BYTES, on_change=lambda: changes.append(1))
    assert set(_tiers(again).values()) == {"disk"}  # a restart: every payload Cold
    again.execute(model_id=MODEL, layer=0, expert=3, hidden=x)  # served (promoted) before the warm-up reached it
    assert again.warm() == 2  # 0 and 1 fit beside 3; 2 does not, and nothing is evicted for it
    assert _tiers(again) == {0: "memory", 1: "memory", 2: "disk", 3: "memory"}
    _check_bound(again)
    assert changes  # each promotion is announced (the worker publishes its holdings again)
    assert again.warm() == 0
    for e in range(4):
        assert np.array_equal(again.execute(model_id=MODEL, layer=0, expert=e, hidden=x), before[e])


def test_warm_skips_a_corrupt_payload(tmp_path):
    rt = ExpertRuntime(data_dir=tmp_path, memory_budget_bytes=4 * F32_BYTES)
    _load(rt, 2)
    path = next(tmp_path.rglob("expert0.safetensors"))
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x01
    path.write_bytes(bytes(data))
    told: list[tuple] = []
    again = ExpertRuntime(data_dir=tmp_path, memory_budget_bytes=4 * F32_BYTES,
                          on_corrupt=lambda key, uri: told.append(key))
    assert again.warm() == 1
    assert _tiers(again) == {1: "memory"} and told == [(MODEL, 0, 0)]
