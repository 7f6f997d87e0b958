"""Backend selection on a default install (neither CuPy nor wgpu importable): the CPU backend, and
a reason for each GPU backend that names what to install. Runs everywhere, GPU or not."""

from __future__ import annotations

import sys

import pytest

from core.experts.backends import CpuBackend
from core.experts.selection import BackendUnavailable, choose_backend


@pytest.fixture
def default_install(monkeypatch):
    for name in ("cupy", "wgpu"):
        monkeypatch.setitem(sys.modules, name, None)  # `import cupy` raises ImportError, as without the package
    monkeypatch.delenv("TENZRO_EXPERT_BACKEND", raising=False)


def test_auto_on_a_default_install_is_the_cpu_with_reasons(default_install):
    choice = choose_backend()
    assert isinstance(choice.backend, CpuBackend) and not choice.backend.is_gpu
    by_name = {c["name"]: c for c in choice.candidates}
    assert by_name["cuda"]["available"] is False and "requirements-gpu-cuda.txt" in by_name["cuda"]["reason"]
    assert by_name["wgsl"]["available"] is False and "requirements-gpu-wgsl.txt" in by_name["wgsl"]["reason"]
    assert by_name["cpu"]["active"] and by_name["cpu"]["reason"].startswith("no GPU backend available; ")
    summary = choice.summary()
    assert summary.startswith("expert backend cpu (no GPU backend available; ")
    assert "cuda: cupy is not installed" in summary and "wgsl: wgpu is not installed" in summary


@pytest.mark.parametrize("kind", ["cuda", "wgsl"])
def test_forcing_a_backend_whose_package_is_missing_names_it(default_install, kind):
    with pytest.raises(BackendUnavailable, match=f"TENZRO_EXPERT_BACKEND={kind}, but .* is not installed"):
        choose_backend(choice=kind)


def test_the_environment_chooses_when_no_choice_is_passed(default_install, monkeypatch):
    monkeypatch.setenv("TENZRO_EXPERT_BACKEND", "cpu-numpy")
    assert choose_backend().backend.cpu_kernel == "numpy-tiled"
    monkeypatch.setenv("TENZRO_EXPERT_BACKEND", "wgsl")
    with pytest.raises(BackendUnavailable):
        choose_backend()
