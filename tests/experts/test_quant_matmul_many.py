"""Several experts in one C call (_quant_matmul.experts, CpuBackend.forward_many): a holder's multi-expert
request computed with the pool's workers woken twice for all of its experts, and each expert's rows
bit for bit what a call of its own gives, whatever the formats, GLUs, biases, row counts and threads."""

from __future__ import annotations

import numpy as np
import pytest

from core.experts.backends import CpuBackend, quant_matmul_variants
from core.experts.runtime import ExpertRuntime
from testkit.blocks import random_blocks
from tests.experts.factories import MODEL, expert_payload, expert_weights

VARIANTS = quant_matmul_variants()
needs_c = pytest.mark.skipif(not VARIANTS, reason="the C kernels were not built")


def _item(rng: np.random.Generator, fmts: tuple[str, str], d_model: int, d_ff: int, t: int, *,
          clamped: bool = False) -> tuple:
    """An `experts` item (its y to be written) with random blocks, rows and, for the clamped GLU, biases."""
    gu, down = random_blocks(rng, fmts[0], 2 * d_ff, d_model), random_blocks(rng, fmts[1], d_model, d_ff)
    x = rng.standard_normal((t, d_model)).astype(np.float32)
    y = np.full((t, d_model), np.nan, np.float32)
    item = (fmts[0], gu, fmts[1], down, d_model, d_ff, x, t, y)
    if clamped:
        biases = (rng.standard_normal(2 * d_ff).astype(np.float32), rng.standard_normal(d_model).astype(np.float32))
        item += (1, 1.702, 7.0, *biases)
    return item


def _alone(item: tuple, variant: str, threads: int, min_macs: int) -> np.ndarray:
    from core.experts import _quant_matmul

    y = np.full_like(item[8], np.nan)
    _quant_matmul.expert(*item[:8], y, variant, threads, min_macs, *item[9:])
    return y


@needs_c
@pytest.mark.parametrize("variant", VARIANTS)
def test_several_experts_in_one_call_equal_a_call_each(variant):
    from core.experts import _quant_matmul

    rng = np.random.default_rng(61)
    items = [_item(rng, ("Q8_0", "Q8_0"), 800, 96, 1), _item(rng, ("Q4_K", "Q6_K"), 512, 256, 3),
             _item(rng, ("Q8_0", "Q8_0"), 800, 96, 0), _item(rng, ("Q6_K", "Q4_K"), 512, 256, 9, clamped=True),
             _item(rng, ("Q8_0", "Q8_0"), 800, 96, 2, clamped=True)]
    for threads, min_macs in ((1, 0), (2, 1), (2, 1 << 40)):  # one thread; the pool forced; too small to share
        _quant_matmul.experts(variant, threads, min_macs, items)
        for k, item in enumerate(items):
            assert np.array_equal(item[8], _alone(item, variant, threads, min_macs)), (variant, threads, k)
    _quant_matmul.experts(variant, 2, 1, [])  # nothing to do


@needs_c
def test_a_bad_expert_refuses_the_whole_call_and_writes_nothing():
    from core.experts import _quant_matmul

    rng = np.random.default_rng(62)
    good, short = _item(rng, ("Q8_0", "Q8_0"), 800, 96, 2), _item(rng, ("Q8_0", "Q8_0"), 800, 96, 2)
    short = (*short[:8], short[8][:1])
    with pytest.raises(ValueError, match="buffer sizes"):
        _quant_matmul.experts(VARIANTS[0], 2, 1, [good, short])
    assert np.isnan(good[8]).all()
    with pytest.raises(ValueError, match="unknown format"):
        _quant_matmul.experts(VARIANTS[0], 2, 1, [good, ("Q5_K", *good[1:])])
    with pytest.raises(TypeError, match="expert 1 is not a tuple"):
        _quant_matmul.experts(VARIANTS[0], 2, 1, [good, list(good)])
    with pytest.raises(TypeError):
        _quant_matmul.experts(VARIANTS[0], 2, 1, 5)
    with pytest.raises(ValueError, match="unsupported"):
        _quant_matmul.experts("neon", 2, 1, [good])
    with pytest.raises(ValueError, match="at most 4096"):
        _quant_matmul.experts(VARIANTS[0], 2, 1, [good] * 4097)


@needs_c
def test_a_multi_expert_request_on_the_cpu_equals_its_experts_run_one_by_one(tmp_path):
    """ExpertRuntime.execute_many through CpuBackend.forward_many: fused Q8_0 and K-quant experts in one
    C call, beside an f32 expert and a batch past the fused size that run on their own; every batch's
    rows equal execute's, and its compute is a share of the call's."""
    rng = np.random.default_rng(63)
    d_model, d_ff = 256, 64
    backend = CpuBackend(fused_max_rows=4)
    runtime = ExpertRuntime(data_dir=tmp_path, memory_budget_bytes=1 << 28, backend=backend)
    quants = ["Q8_0", {"gate": "Q4_K", "up": "Q4_K", "down": "Q6_K"}, None, "Q8_0"]
    for e, quant in enumerate(quants):
        runtime.expert_load(payload=expert_payload(expert_weights(rng, d_model, d_ff), expert=e, quant=quant))
    batches = [(e, rng.standard_normal((t, d_model)).astype(np.float32)) for e, t in ((0, 1), (1, 3), (2, 2), (3, 6))]
    assert backend.groups_experts
    many = runtime.execute_many(model_id=MODEL, layer=0, batches=batches)
    for (expert, x), (y, seconds) in zip(batches, many, strict=True):
        assert np.array_equal(y, runtime.execute(model_id=MODEL, layer=0, expert=expert, hidden=x))
        assert seconds > 0


@needs_c
def test_a_frame_too_large_for_one_calls_scratch_runs_in_several(tmp_path, monkeypatch):
    """The calling thread keeps its scratch for the next call: a frame of many large batches is cut into
    calls of bounded scratch, which give the same rows."""
    from core.experts import backends

    rng = np.random.default_rng(64)
    backend = CpuBackend()
    runtime = ExpertRuntime(data_dir=tmp_path, memory_budget_bytes=1 << 28, backend=backend)
    for e in range(5):
        runtime.expert_load(payload=expert_payload(expert_weights(rng, 256, 64), expert=e, quant="Q8_0"))
    batches = [(e, rng.standard_normal((8, 256)).astype(np.float32)) for e in range(5)]
    whole = runtime.execute_many(model_id=MODEL, layer=0, batches=batches)
    calls: list[int] = []
    real = backends._quant_matmul

    class Counted:
        def __getattr__(self, name):
            return getattr(real, name)

        def experts(self, variant, threads, min_macs, items):
            calls.append(len(items))
            return real.experts(variant, threads, min_macs, items)

    monkeypatch.setattr(backends, "_quant_matmul", Counted())
    monkeypatch.setattr(backends, "_C_GROUP_SCRATCH_BYTES", 2 * 8 * (2 * 256 + 10 * 64) + 2048)  # two experts a call
    cut = runtime.execute_many(model_id=MODEL, layer=0, batches=batches)
    assert calls == [2, 2]  # the fifth expert alone runs through expert()
    assert all(np.array_equal(a, b) for (a, _), (b, _) in zip(whole, cut, strict=True))


def test_a_carrier_of_rows_gives_each_expert_its_rows_and_is_checked_once(tmp_path):
    """execute_carrier (a multi-expert request's body): each batch's rows are execute_many's for the same
    rows, a batch naming every row takes the carrier as it is, and a bad carrier or an expert not held is
    refused before anything runs."""
    from core.experts.errors import ExpertNotLoaded, NonFiniteInput

    rng = np.random.default_rng(65)
    runtime = ExpertRuntime(data_dir=tmp_path, memory_budget_bytes=1 << 28, backend=CpuBackend())
    for e in range(3):
        runtime.expert_load(payload=expert_payload(expert_weights(rng, 256, 64), expert=e, quant="Q8_0"))
    carrier = rng.standard_normal((4, 256)).astype(np.float32)
    batches = [(0, [0, 1, 2, 3]), (1, [1, 3]), (2, [2])]
    got = runtime.execute_carrier(model_id=MODEL, layer=0, hidden=carrier, batches=batches)
    want = runtime.execute_many(model_id=MODEL, layer=0, batches=[(e, carrier[rows]) for e, rows in batches])
    assert all(np.array_equal(a, b) for (a, _), (b, _) in zip(got, want, strict=True))
    bad = carrier.copy()
    bad[3, 7] = np.nan
    with pytest.raises(NonFiniteInput, match="rows 3"):
        runtime.execute_carrier(model_id=MODEL, layer=0, hidden=bad, batches=[(2, [2])])
    with pytest.raises(ExpertNotLoaded, match=r"\[7\]"):
        runtime.execute_carrier(model_id=MODEL, layer=0, hidden=carrier, batches=[(0, [0]), (7, [1])])
