"""Generation registers its own worker methods, over the one distributed forward the worker keeps."""

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

from apps.forward.handlers import DistributedForward, forward_handlers
from apps.generation import selectors
from apps.worker.doors import CallContext, Door, WorkerParts, contributed_handlers
from core.errors import TenzroError
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


def _whole_model(parts: WorkerParts):
    return contributed_handlers(parts)["moe/generate"].__self__


@pytest.mark.parametrize(("remembered", "reason"), [(["m"], "dense_reloading"), (["other"], "dense_not_loaded")])
def test_a_generate_asked_while_a_restarted_worker_reads_what_to_load_again_waits_for_that_list(
        tmp_path, remembered, reason) -> None:
    """The doors open before restore() has read which dense parts the last worker had loaded: a generate asked
    then is answered once the list is known, "being loaded again" (503) for one on it, not "load them first"."""

    async def scenario() -> None:
        listed, loaded = asyncio.Event(), asyncio.Event()

        async def write(func, /, **kwargs):  # restore()'s two reads from the database, the second held back
            if func is selectors.dense_loaded_list:
                await listed.wait()
                return [{"model_id": m, "checkpoint": str(tmp_path / m)} for m in remembered]
            return []  # no generation of the last worker to close

        async def load_dense(params, body, ctx):  # reading the checkpoint again takes a while
            await loaded.wait()
            raise TenzroError(f"{params['checkpoint']} moved", reason="not_found")

        with ThreadPoolExecutor(1) as executor:
            whole = _whole_model(WorkerParts(ExpertRuntime(data_dir=tmp_path), executor, "ef" * 32,
                                             control_plane=None))
            whole._write, whole.load_dense = write, load_dense
            restoring = asyncio.ensure_future(whole.restore())
            await asyncio.sleep(0)
            asked = asyncio.ensure_future(whole.generate({"model_id": "m", "prompt_ids": [1, 2]}, b"",
                                                         CallContext(door=Door.OPERATOR)))
            await asyncio.sleep(0.05)
            assert not asked.done()  # waiting for the list, not refused yet
            listed.set()
            with pytest.raises(TenzroError) as refused:
                await asked
            assert refused.value.reason == reason
            loaded.set()
            await restoring  # the moved checkpoint is logged, not raised
            assert not whole.reloading

    asyncio.run(scenario())
