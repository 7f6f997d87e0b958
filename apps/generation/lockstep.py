"""Several sequences' steps of one model in lockstep: one MoE call per layer carries all their rows.

The core of continuous batching. Each sequence runs its own `WholeModel.run` (its own tokens, its own
KV cache, attention over its own past), so the dense part never mixes them; every run of one model
stops at the same MoE layers in the same order, where their rows are stacked into one call and the
output is split back by rows. Gates and experts are row-wise, so a sequence's logits are the ones it
would get stepped alone. `lockstep` speaks WholeModel.run's own sans-I/O protocol (yield
(layer, x), take the MoE output back, return at the end), so whatever drives one run (a test's
local experts, the router's distributed forward) drives a batch of them unchanged.

Pure module: no Django, no I/O.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence

import numpy as np

MoeStep = Generator[tuple[int, np.ndarray], np.ndarray, np.ndarray]


class LockstepError(ValueError):
    """The runs did not meet at one MoE layer, or the MoE output does not fit their rows."""


def _advance(run: MoeStep, value: np.ndarray | None) -> tuple[bool, object]:
    try:
        return False, run.send(value)  # type: ignore[arg-type]  # None starts it
    except StopIteration as done:
        return True, done.value


def lockstep(runs: Sequence[MoeStep]) -> Generator[tuple[int, np.ndarray], np.ndarray, list[np.ndarray]]:
    """Drive `runs` (each a WholeModel.run of the same model) together.

    Yields (layer, x f32 [Σ t_i, d_model]): each run's rows at that MoE layer, stacked in the order of
    `runs`; expects y of x's shape back, whose rows go back to their runs. Returns each run's logits,
    in order. Every run is closed when this one ends early (abandoned, or an error), so none commits
    its cache: a failed batch leaves every sequence as it was before the step.
    """
    if not runs:
        return []
    results: list[np.ndarray | None] = [None] * len(runs)
    try:
        pending = []  # (index, layer, x) of the runs waiting at a MoE layer
        for i, run in enumerate(runs):
            done, value = _advance(run, None)
            if done:
                results[i] = value  # type: ignore[assignment]
            else:
                pending.append((i, *value))  # type: ignore[misc]
        while pending:
            layers = {layer for _, layer, _ in pending}
            if len(layers) != 1 or len(pending) != len(runs):
                raise LockstepError(f"the runs must meet at one MoE layer; they are at {sorted(layers)} "
                                    f"({len(runs) - len(pending)} already done)")
            layer = layers.pop()
            sizes = [len(x) for _, _, x in pending]
            y = yield layer, np.concatenate([x for _, _, x in pending]) if len(pending) > 1 else pending[0][2]
            if not isinstance(y, np.ndarray) or y.ndim != 2 or len(y) != sum(sizes):
                raise LockstepError(f"layer {layer}'s MoE output must have {sum(sizes)} rows, one per input row")
            parts = np.split(y, np.cumsum(sizes)[:-1])
            waiting, pending = pending, []
            for (i, _, _), part in zip(waiting, parts, strict=True):
                done, value = _advance(runs[i], part)
                if done:
                    results[i] = value  # type: ignore[assignment]
                else:
                    pending.append((i, *value))  # type: ignore[misc]
        return results  # type: ignore[return-value]
    finally:
        for run in runs:
            run.close()  # a finished run ignores it; one mid-step drops its step, its cache unchanged
