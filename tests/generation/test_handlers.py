"""Generation registers its own worker methods, over the one distributed forward the worker keeps."""

from concurrent.futures import ThreadPoolExecutor

from apps.forward.handlers import DistributedForward, forward_handlers
from apps.worker.doors import WorkerParts, contributed_handlers
from core.experts.runtime import ExpertRuntime

WHOLE_MODEL = {"moe/load_dense", "moe/generate", "moe/model_forward", "moe/generation_cancel", "moe/models"}


def test_forward_and_generation_each_contribute_their_methods_sharing_one_forward(tmp_path) -> None:
    with ThreadPoolExecutor(1) as executor:
        parts = WorkerParts(ExpertRuntime(data_dir=tmp_path), executor, "ab" * 32, control_plane=None)
        handlers = contributed_handlers(parts)
    assert {"moe/forward", *WHOLE_MODEL} <= set(handlers)
    forward = parts.shared["forward"]
    assert isinstance(forward, DistributedForward)
    assert handlers["moe/forward"].__self__ is forward
    # every whole-model method drives that same forward (its pool, hedging book, cooldowns, ledger writes)
    assert {handlers[m].__self__.forward for m in WHOLE_MODEL} == {forward}


def test_the_forward_app_no_longer_serves_the_whole_model_methods(tmp_path) -> None:
    with ThreadPoolExecutor(1) as executor:
        parts = WorkerParts(ExpertRuntime(data_dir=tmp_path), executor, "cd" * 32, control_plane=None)
        assert set(forward_handlers(parts)) == {"moe/forward"}
