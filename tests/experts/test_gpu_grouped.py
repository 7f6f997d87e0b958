"""GpuBackend.forward_many and the runtime's multi-expert execute over it: a holder's request of
several experts runs as one device call where the device can group them, and as forwards one
by one where it cannot, losing nothing either way.

The device is the WGSL backend on Mesa's lavapipe (as in test_gpu_backend.py), behind an adapter
that records its grouped forward's calls and can make them fail (the devices' own grouped
forwards are checked in test_gpu_wgsl.py and test_gpu_cuda.py): what is tested here is the
backend's side (residency of the whole group, eviction, counts, fallback) and the runtime's
(one call, compute time shared by rows, metering per expert)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from core.experts.backends import CpuBackend
from core.experts.ffn import build_expert
from core.experts.gpu.backend import GpuBackend
from core.experts.gpu.ops import DeviceError
from core.experts.runtime import ExpertRuntime
from testkit.gpu import wgsl_unavailable
from tests.experts.factories import MODEL
from tests.experts.test_gpu_backend import D_MODEL, close_to, one_expert_bytes, payloads, reference

pytestmark = pytest.mark.skipif(bool(wgsl_unavailable()), reason=wgsl_unavailable() or "")


class Grouping:
    """The wrapped device, its grouped forward recorded (and failing on demand)."""

    def __init__(self, ops: Any) -> None:
        self._ops = ops
        self.groups: list[int] = []  # experts in each forward_group call
        self.fail: DeviceError | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ops, name)

    def forward_group(self, handles: list[Any], xs: list[np.ndarray]) -> list[np.ndarray]:
        if self.fail is not None:
            raise self.fail
        self.groups.append(len(handles))
        return self._ops.forward_group(handles, xs)


def grouping_gpu(budget: int) -> GpuBackend:
    from core.experts.gpu.wgsl import open_device

    return GpuBackend(Grouping(open_device(allow_software=True)), cpu=CpuBackend(use_numba=False),
                      device_budget_bytes=budget)


@pytest.fixture
def gpu():
    backend = grouping_gpu(64 << 20)
    yield backend
    backend.close()


def rows(sizes: tuple[int, ...], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((t, D_MODEL)).astype(np.float32) for t in sizes]


def test_a_group_of_experts_on_the_device_is_one_device_call(gpu):
    ps = payloads(3, "Q8_0")
    experts = [build_expert(p, gpu).prepared for p in ps]
    xs = rows((1, 4, 2), seed=1)
    ys = gpu.forward_many(list(zip(experts, xs, strict=True)))
    assert all(close_to(y, reference(p, x)) for p, x, y in zip(ps, xs, ys, strict=True))
    assert gpu.ops.groups == [3]
    counts = gpu.device_status()["counts"]
    assert counts["device_rows"] == 7 and counts["cpu_rows"] == 0


def test_a_group_that_does_not_fit_on_the_device_runs_expert_by_expert():
    ps = payloads(3)
    probe = grouping_gpu(64 << 20)
    one = one_expert_bytes(probe, ps[0])
    probe.close()
    gpu = grouping_gpu(2 * one)  # two of the three fit: uploading the third would evict one of the group
    try:
        experts = [build_expert(p, gpu).prepared for p in ps]
        xs = rows((2, 1, 3), seed=2)
        ys = gpu.forward_many(list(zip(experts, xs, strict=True)))
        assert all(close_to(y, reference(p, x)) for p, x, y in zip(ps, xs, ys, strict=True))
        assert gpu.ops.groups == []  # never grouped
        assert gpu.device_status()["counts"]["device_rows"] == 6  # each on the device in its turn
    finally:
        gpu.close()


def test_a_grouped_call_that_fails_loses_no_request(gpu):
    ps = payloads(2, "Q8_0")
    experts = [build_expert(p, gpu).prepared for p in ps]
    xs = rows((3, 2), seed=3)
    gpu.ops.fail = DeviceError("launch failed", fatal=False)
    ys = gpu.forward_many(list(zip(experts, xs, strict=True)))
    assert all(close_to(y, reference(p, x)) for p, x, y in zip(ps, xs, ys, strict=True))
    status = gpu.device_status()
    assert status["state"] == "ok" and status["counts"]["device_errors"] == 1
    assert "launch failed" in status["last_error"]
    assert status["counts"]["device_rows"] == 5  # the fallback's forwards, on the device again


def test_the_runtime_runs_a_multi_expert_request_as_one_group(tmp_path, gpu):
    runtime = ExpertRuntime(data_dir=tmp_path, backend=gpu)
    ps = payloads(3, "Q8_0")
    for p in ps:
        runtime.expert_load(payload=p)
    xs = rows((2, 0, 3), seed=4)  # an expert with no rows is answered without computing
    out = runtime.execute_many(model_id=MODEL, layer=0, batches=list(zip(range(3), xs, strict=True)))
    assert gpu.ops.groups == [2]
    assert [y.shape for y, _ in out] == [(2, D_MODEL), (0, D_MODEL), (3, D_MODEL)]
    assert close_to(out[0][0], reference(ps[0], xs[0])) and close_to(out[2][0], reference(ps[2], xs[2]))
    seconds = [s for _, s in out]
    assert seconds[1] == 0.0 and seconds[0] > 0 and seconds[2] == pytest.approx(1.5 * seconds[0])  # shared by rows
    demand = runtime._demand.rates()  # each expert's own rows, per wall second of the window
    assert demand[(MODEL, 0, 2)] == pytest.approx(1.5 * demand[(MODEL, 0, 0)]) and (MODEL, 0, 1) not in demand
    assert runtime._meter.rows_per_second() > 0  # capacity: 5 rows in the group's compute time


class Ungrouped:
    """A device without a grouped forward."""

    def __init__(self, ops: Any) -> None:
        self._ops = ops

    def __getattr__(self, name: str) -> Any:
        if name == "forward_group":
            raise AttributeError(name)
        return getattr(self._ops, name)


def test_only_a_device_with_a_grouped_forward_groups_and_only_while_it_serves(gpu):
    from core.experts.gpu.wgsl import open_device

    plain = GpuBackend(Ungrouped(open_device(allow_software=True)), cpu=CpuBackend(use_numba=False),
                       device_budget_bytes=1 << 20)
    try:
        assert plain.groups_experts is False  # the runtime computes a frame's experts one by one
    finally:
        plain.close()
    assert gpu.groups_experts is True
    experts = [build_expert(p, gpu).prepared for p in payloads(2)]
    gpu.ops.fail = DeviceError("device lost", fatal=True)
    xs = rows((1, 1), seed=5)
    assert len(gpu.forward_many(list(zip(experts, xs, strict=True)))) == 2  # answered on the CPU
    assert gpu.groups_experts is False and gpu.device_status()["state"] == "failed"
