"""GpuBackend over a real device (the WGSL backend on Mesa's lavapipe, a Vulkan driver on the CPU):
the device-memory tier (eager upload, LRU eviction, experts over the budget, release when the host
tier drops an expert), fallback to the CPU without losing a request, and backend selection.

The device tier's logic is the same for CUDA; the kernels' own tests are in test_gpu_wgsl.py and
test_gpu_cuda.py.
"""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

from core.experts.backends import CpuBackend
from core.experts.ffn import build_expert
from core.experts.gpu.backend import GpuBackend, GpuExpert
from core.experts.runtime import ExpertRuntime
from core.experts.selection import BackendUnavailable, choose_backend
from testkit.gpu import wgsl_unavailable
from tests.experts.factories import expert_payload, expert_weights

pytestmark = pytest.mark.skipif(bool(wgsl_unavailable()), reason=wgsl_unavailable() or "")
D_MODEL, D_FF = 64, 32


def payloads(n: int, quant: str | None = None) -> list[bytes]:
    rng = np.random.default_rng(7)
    return [expert_payload(expert_weights(rng, D_MODEL, D_FF), expert=e, quant=quant) for e in range(n)]


def reference(payload: bytes, x: np.ndarray) -> np.ndarray:
    cpu = CpuBackend(use_numba=False)
    return cpu.forward(build_expert(payload, cpu).prepared, x)


def close_to(y: np.ndarray, ref: np.ndarray) -> bool:
    """f32 sums in another order: well inside 1e-5 of the output's scale at these widths."""
    return y.shape == ref.shape and float(np.abs(y - ref).max()) <= 1e-5 * max(1.0, float(np.abs(ref).max()))


@pytest.fixture
def gpu():
    from core.experts.gpu.wgsl import open_device

    backend = GpuBackend(open_device(allow_software=True), cpu=CpuBackend(use_numba=False),
                         device_budget_bytes=64 << 20)
    yield backend
    backend.close()


def one_expert_bytes(gpu: GpuBackend, payload: bytes) -> int:
    expert = build_expert(payload, gpu).prepared
    return gpu.ops.device_bytes(expert.host, expert.types)


def test_experts_are_uploaded_at_load_and_run_on_the_device(gpu):
    x = np.random.default_rng(1).standard_normal((5, D_MODEL)).astype(np.float32)
    for quant in (None, "Q8_0"):
        payload = payloads(1, quant)[0]
        expert = build_expert(payload, gpu)
        status = gpu.device_status()
        assert status["experts"] >= 1 and status["memory_used_bytes"] > 0
        assert close_to(gpu.forward(expert.prepared, x), reference(payload, x))
    counts = gpu.device_status()["counts"]
    assert counts["device_rows"] == 10 and counts["cpu_rows"] == 0 and counts["uploads"] == 2


def test_the_device_tier_evicts_least_recently_used_within_its_budget(gpu):
    ps = payloads(3)
    size = one_expert_bytes(gpu, ps[0])
    gc.collect()
    gpu.device_budget_bytes = 2 * size
    uploads = gpu.device_status()["counts"]["uploads"]
    experts = [build_expert(p, gpu).prepared for p in ps]
    status = gpu.device_status()
    # the third did not fit at load, and loading never evicts: it waits for its first forward
    assert status["experts"] == 2 and status["memory_used_bytes"] == 2 * size
    x = np.random.default_rng(2).standard_normal((3, D_MODEL)).astype(np.float32)
    assert close_to(gpu.forward(experts[1], x), reference(ps[1], x))  # 1 is now the most recent
    assert close_to(gpu.forward(experts[2], x), reference(ps[2], x))  # uploads 2, evicts 0
    assert close_to(gpu.forward(experts[1], x), reference(ps[1], x))  # still resident
    status = gpu.device_status()
    assert status["counts"]["evictions"] == 1 and status["counts"]["uploads"] == uploads + 3
    assert status["experts"] == 2 and status["memory_used_bytes"] <= gpu.device_budget_bytes
    assert close_to(gpu.forward(experts[0], x), reference(ps[0], x))  # back, evicting the LRU one (2)
    assert gpu.device_status()["counts"]["evictions"] == 2


def test_an_expert_larger_than_the_budget_runs_on_the_cpu(gpu):
    payload = payloads(1)[0]
    gpu.device_budget_bytes = one_expert_bytes(gpu, payload) - 1
    gc.collect()
    expert = build_expert(payload, gpu).prepared
    x = np.random.default_rng(3).standard_normal((4, D_MODEL)).astype(np.float32)
    assert close_to(gpu.forward(expert, x), reference(payload, x))
    counts = gpu.device_status()["counts"]
    assert counts["too_large"] == 1 and counts["cpu_rows"] == 4 and gpu.is_gpu


def test_an_mxfp4_expert_runs_on_the_cpu_without_a_device_error(gpu):
    """The device kernels read Q8_0/Q4_K/Q6_K: an MXFP4 expert (gpt-oss's checkpoints) stays on its host
    copy, answered by the CPU kernels, and the device reports it as such (not as an error)."""
    payload = payloads(1, quant="mxfp4")[0]
    expert = build_expert(payload, gpu).prepared
    x = np.random.default_rng(3).standard_normal((4, D_MODEL)).astype(np.float32)
    assert close_to(gpu.forward(expert, x), reference(payload, x))
    counts = gpu.device_status()["counts"]
    assert (counts["cpu_format"], counts["uploads"], counts["device_errors"], counts["cpu_rows"]) == (1, 0, 0, 4)
    assert gpu.is_gpu and gpu.last_error is None


def test_an_expert_the_host_tier_drops_leaves_the_device_too(gpu):
    expert = build_expert(payloads(1)[0], gpu).prepared
    assert gpu.device_status()["experts"] == 1
    del expert
    gc.collect()
    status = gpu.device_status()
    assert status["experts"] == 0 and status["memory_used_bytes"] == 0


def test_a_lost_device_loses_no_request_and_stops_the_gpu_flag(gpu):
    payload = payloads(1, "Q8_0")[0]
    changes = []
    gpu.on_state_change = lambda: changes.append(gpu.is_gpu)
    expert = build_expert(payload, gpu).prepared
    x = np.random.default_rng(4).standard_normal((6, D_MODEL)).astype(np.float32)
    assert close_to(gpu.forward(expert, x), reference(payload, x))
    gpu.ops._device.destroy()  # a real device loss, as a driver reset or unplugged eGPU gives
    assert close_to(gpu.forward(expert, x), reference(payload, x))  # answered, on the CPU
    status = gpu.device_status()
    assert status["state"] == "failed" and status["failed"] and not gpu.is_gpu
    assert status["counts"]["device_errors"] == 1 and status["counts"]["cpu_rows"] == 6
    assert changes == [False]
    assert close_to(gpu.forward(expert, x), reference(payload, x))  # and later ones, without retrying
    assert gpu.device_status()["counts"]["device_errors"] == 1


def test_an_unexpected_device_module_error_costs_the_request_nothing(gpu):
    payload = payloads(1)[0]
    dense = build_expert(payload, gpu).prepared
    # the same host form labelled with a block type: the device module's upload refuses it (ValueError)
    mislabelled = GpuExpert(host=dense.host, types=("Q8_0", "Q8_0", "Q8_0"))
    x = np.random.default_rng(8).standard_normal((3, D_MODEL)).astype(np.float32)
    assert close_to(gpu.forward(mislabelled, x), reference(payload, x))
    status = gpu.device_status()
    assert status["state"] == "ok" and "ValueError" in status["last_error"] and status["counts"]["cpu_rows"] == 3
    assert close_to(gpu.forward(dense, x), reference(payload, x))  # the device still serves
    assert gpu.device_status()["counts"]["device_rows"] == 3


def test_concurrent_forwards_from_many_threads_all_come_back_right(gpu):
    ps = payloads(4, "Q8_0")
    experts = [build_expert(p, gpu).prepared for p in ps]
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal((int(rng.integers(1, 40)), D_MODEL)).astype(np.float32) for _ in range(24)]
    refs = [reference(ps[i % 4], x) for i, x in enumerate(xs)]
    wrong: list[int] = []

    def run(i: int) -> None:
        if not close_to(gpu.forward(experts[i % 4], xs[i]), refs[i]):
            wrong.append(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == [] and gpu.device_status()["counts"]["cpu_rows"] == 0


def test_the_runtime_reports_the_device_and_publishes_its_failure(tmp_path, gpu):
    changes = []
    runtime = ExpertRuntime(data_dir=tmp_path, backend=gpu, on_change=lambda: changes.append(1),
                            backend_candidates=[{"name": "wgsl", "available": True, "active": True, "reason": "test"}])
    runtime.expert_load(payload=payloads(1)[0])
    status = runtime.status()
    assert status["gpu_backend_active"] is True and status["backend"] == "wgsl"
    assert status["compute"]["device"]["experts"] == 1 and status["compute"]["candidates"][0]["name"] == "wgsl"
    before = len(changes)
    gpu.ops._device.destroy()
    x = np.ones((2, D_MODEL), dtype=np.float32)
    runtime.execute(model_id="test/moe-tiny", layer=0, expert=0, hidden=x)
    assert runtime.status()["gpu_backend_active"] is False and len(changes) == before + 1


def test_selection_forced_auto_and_cpu(monkeypatch):
    monkeypatch.delenv("TENZRO_EXPERT_BACKEND", raising=False)
    forced = choose_backend(choice="wgsl", device_budget_bytes=1 << 20)
    try:
        assert isinstance(forced.backend, GpuBackend) and forced.backend.is_gpu
        by_name = {c["name"]: c for c in forced.candidates}
        assert by_name["wgsl"]["active"] and by_name["wgsl"]["reason"].startswith("forced: ")
        assert "fallback" in by_name["cpu"]["reason"] and "wgsl" in forced.summary()
    finally:
        forced.backend.close()
    auto = choose_backend(choice="auto")
    by_name = {c["name"]: c for c in auto.candidates}
    if forced.backend.ops.software:  # CI: lavapipe only, which auto never picks
        assert auto.backend.name == "cpu" and by_name["cpu"]["active"]
        assert by_name["wgsl"]["available"] is False and "software" in by_name["wgsl"]["reason"]
    cpu = choose_backend(choice="cpu-numpy")
    assert cpu.backend.cpu_kernel == "numpy-tiled"
    assert all("not probed" in c["reason"] for c in cpu.candidates if c["name"] != "cpu")
    with pytest.raises(ValueError, match="unknown expert backend 'tpu'"):
        choose_backend(choice="tpu")


def test_a_forced_backend_that_cannot_run_says_why():
    from testkit.gpu import cuda_unavailable

    if cuda_unavailable() is None:  # a machine with an NVIDIA device: forcing cuda opens it
        choice = choose_backend(choice="cuda", device_budget_bytes=1 << 20)
        assert choice.backend.name == "cuda" and choice.backend.is_gpu
        choice.backend.close()
        return
    with pytest.raises(BackendUnavailable, match="TENZRO_EXPERT_BACKEND=cuda, but "):
        choose_backend(choice="cuda")
