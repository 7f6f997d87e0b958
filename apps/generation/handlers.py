"""The expert worker's whole-model methods: `moe/load_dense` and `moe/generate`.

Both run in the expert worker, beside the distributed forward they drive: the router keeps a
model's dense weights (embeddings, attention, norms, dense FFN layers, LM head) and each
generation's KV cache in this process, and every MoE layer of every step goes through
`DistributedForward.forward_layer` exactly as a `moe/forward` would, so failover, hedging,
receipts, penalties and settlement apply to generation unchanged.

The model itself is the sans-I/O `apps.generation.model.WholeModel.run` generator: it yields
(layer, x) at each MoE layer and takes the layer's output back. Its numpy steps run on the
compute executor; the loop only awaits the network. A generation runs as a task of its own:
`moe/generate` answers with its id once its record exists, and each step is written to the
record (and pushed to the dashboard) as it ends.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np
from django.conf import settings
from django.db import close_old_connections

from apps.catalog.checkpoint import CheckpointReader
from apps.catalog.shapes import shape_from_config
from apps.catalog.slicing import gate_payload_for_layer
from apps.forward.handlers import distributed_forward
from apps.forward.ledger import ForwardWork
from apps.generation import services
from apps.generation.model import WholeModel
from apps.generation.spec import spec_from_config
from apps.generation.weights import load_dense_weights
from apps.worker.doors import CallContext, Door, WorkerParts
from apps.worker.params import str_param
from core.errors import InvalidInput, NotFound, RateLimited, TenzroError
from core.formats.wire import WIRE_CODECS

logger = logging.getLogger("tenzro.generation")
Result = tuple[dict[str, Any], bytes]


class LayerForward(Protocol):
    """What generation drives: apps.forward.handlers.DistributedForward."""

    def forward_layer(self, model_id: str, layer: int, hidden: np.ndarray, ctx: CallContext, *,
                      allow_partial: bool = ..., allow_cold: bool = ..., min_gate_mass: float = ...,
                      codecs: tuple[str, ...] = ..., keep_record: bool = ..., work: ForwardWork | None = ...
                      ) -> Awaitable[tuple[dict[str, Any], np.ndarray]]: ...

    def record_work(self, *, model_id: str, forward_id: str, work: ForwardWork) -> None: ...


def generation_handlers(parts: WorkerParts) -> dict[str, Callable[..., Awaitable[Result]]]:
    """moe/load_dense, moe/model_forward and moe/generate, over the worker's distributed forward."""
    return WholeModelHandlers(parts, distributed_forward(parts)).table()


class LoadedModel:
    """A model whose dense part this router holds: the math, and the token ids that end a generation."""

    def __init__(self, model: WholeModel, dense_bytes: int, eos_ids: frozenset[int], checkpoint: str) -> None:
        self.model, self.dense_bytes, self.eos_ids, self.checkpoint = model, dense_bytes, eos_ids, checkpoint


def _eos_ids(config: dict[str, Any]) -> frozenset[int]:
    eos = config.get("eos_token_id")
    values = eos if isinstance(eos, list) else [eos]
    return frozenset(int(v) for v in values if isinstance(v, int) and not isinstance(v, bool))


def _advance(gen: Generator[tuple[int, np.ndarray], np.ndarray, np.ndarray],
             value: np.ndarray | None) -> tuple[bool, Any, float]:
    """One step of WholeModel.run on a compute thread: (False, (layer, x), s) or (True, logits, s),
    s the seconds it computed. StopIteration must not cross into a Future, so the end is returned."""
    started = time.perf_counter()
    try:
        return False, gen.send(value), time.perf_counter() - started  # type: ignore[arg-type]  # None starts it
    except StopIteration as stop:
        return True, stop.value, time.perf_counter() - started


def _layer_stats(layer: int, result: dict[str, Any]) -> dict[str, Any]:
    """What a step shows of one MoE layer: its fan-out per holder, its time and what it lost."""
    stats = result["stats"]
    return {"layer": layer, "ms": stats["elapsed_ms"], "dispatch_ms": stats["dispatch_ms"],
            "hedges_fired": stats["hedges_fired"], "hedges_won": stats["hedges_won"],
            "lost_gate_mass": stats["lost_gate_mass"],
            "missing": len(result["missing"]), "failures": len(stats["failures"]),
            "holders": [{"provider": h["provider"], "transport": h["transport"], "rows": h["rows"],
                         "batches": h["batches"], "latency_ms_max": h["latency_ms_max"],
                         "compute_ms": h.get("compute_ms")} for h in stats["holders"] if h["rows"]]}


def _log_failed_write(future: asyncio.Future) -> None:
    if not future.cancelled() and future.exception() is not None:
        logger.error("could not record a generation step: %s", future.exception())


class WholeModelHandlers:
    def __init__(self, parts: WorkerParts, forward: LayerForward) -> None:
        self.runtime, self.executor = parts.runtime, parts.executor
        self.forward = forward
        self.models: dict[str, LoadedModel] = {}
        self._running: dict[str, asyncio.Task] = {}
        self._db = ThreadPoolExecutor(1, thread_name_prefix="generation-db")

    def table(self) -> dict[str, Callable[..., Awaitable[Result]]]:
        return {"moe/load_dense": self.load_dense, "moe/generate": self.generate,
                "moe/model_forward": self.model_forward}

    def _write(self, func: Callable[..., Any], /, **kwargs: Any) -> asyncio.Future:
        """Run a service on the one database thread: writes land in the order they were asked for,
        so a step's write need not be awaited before the next step computes."""
        def run() -> Any:
            close_old_connections()
            return func(**kwargs)

        future = asyncio.get_running_loop().run_in_executor(self._db, run)
        future.add_done_callback(_log_failed_write)
        return future

    # -- moe/load_dense ------------------------------------------------------------------------

    def _free_bytes(self, model_id: str) -> int:
        """Memory budget the dense weights of `model_id` may take: the budget less what other
        models' dense weights hold. Experts in the memory tier make room (they move to the disk
        tier, LRU first, when the reservation is made), so they do not count against it."""
        others = sum(m.dense_bytes for mid, m in self.models.items() if mid != model_id)
        return max(0, self.runtime.memory_budget_bytes - others)

    async def load_dense(self, params: dict[str, Any], body: bytes | bytearray, ctx: CallContext) -> Result:
        model_id, checkpoint = str_param(params, "model_id"), str_param(params, "checkpoint")
        started = time.monotonic()

        def load() -> tuple[LoadedModel, list[bytes]]:
            with CheckpointReader.open(checkpoint) as reader:
                spec = spec_from_config(reader.config, model_id=model_id)
                weights = load_dense_weights(reader, spec, max_bytes=self._free_bytes(model_id))
                shape = shape_from_config(model_id, reader.config)
                gates = [gate_payload_for_layer(reader, shape, layer, model_id=model_id) for layer in spec.moe_layers]
                eos = _eos_ids(reader.config)
            return LoadedModel(WholeModel(weights), weights.nbytes, eos, checkpoint), gates

        loaded, gates = await ctx.run_blocking(self.executor, load)
        # held under the node's memory budget: experts move to the disk tier to make room
        self.runtime.reserve_memory(f"dense weights of {model_id}", loaded.dense_bytes)
        for payload in gates:  # the router gates every MoE layer itself
            await ctx.run_blocking(self.executor, self.runtime.gate_load, payload=payload)
        self.models[model_id] = loaded
        spec = loaded.model.spec
        logger.info("dense part of %s loaded from %s: %d bytes, %d gates", model_id, checkpoint,
                    loaded.dense_bytes, len(gates))
        return {"model_id": model_id, "family": spec.family, "checkpoint": checkpoint, "n_layers": spec.n_layers,
                "moe_layers": list(spec.moe_layers), "vocab_size": spec.vocab_size, "d_model": spec.d_model,
                "dense_bytes": loaded.dense_bytes, "gates_loaded": len(gates),
                "eos_token_ids": sorted(loaded.eos_ids),
                "elapsed_ms": round((time.monotonic() - started) * 1000.0, 3)}, b""

    # -- moe/generate --------------------------------------------------------------------------

    def _loaded(self, params: dict[str, Any]) -> tuple[str, LoadedModel]:
        model_id = str_param(params, "model_id")
        loaded = self.models.get(model_id)
        if loaded is None:
            raise NotFound(f"this router holds no dense weights of {model_id!r}: load them first "
                           "(tenzro moe load-dense / tenzro_moeLoadDense)", reason="dense_not_loaded")
        for layer in loaded.model.spec.moe_layers:
            self.runtime.gate_spec(model_id, layer)  # NotFound names a gate someone unloaded since
        return model_id, loaded

    @staticmethod
    def _token_ids(params: dict[str, Any], name: str, vocab: int) -> list[int]:
        ids = params.get(name)
        limit = settings.TENZRO_GENERATE_MAX_PROMPT_TOKENS
        if not isinstance(ids, list) or not ids or len(ids) > limit:
            raise InvalidInput(f"param {name!r} must be a list of 1 to {limit} token ids")
        for i, t in enumerate(ids):
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
                raise InvalidInput(f"{name}[{i}] = {t!r} is not a token id of this model (0 … {vocab - 1})",
                                   reason="token_out_of_range")
        return ids

    @staticmethod
    def _options(params: dict[str, Any]) -> dict[str, Any]:
        allow_partial, stop_at_eos = params.get("allow_partial", False), params.get("stop_at_eos", True)
        if not isinstance(allow_partial, bool) or not isinstance(stop_at_eos, bool):
            raise InvalidInput("params 'allow_partial' and 'stop_at_eos' must be true or false")
        wire = params.get("wire")
        if wire is not None and wire not in WIRE_CODECS:
            raise InvalidInput(f"param 'wire' must be one of {list(WIRE_CODECS)}, got {wire!r}",
                               reason="unsupported_encoding")
        return {"allow_partial": allow_partial, "wire": wire, "stop_at_eos": stop_at_eos}

    async def model_forward(self, params: dict[str, Any], body: bytes | bytearray, ctx: CallContext) -> Result:
        """One whole-model forward of token_ids from position 0 (no cache kept): logits f32 [t, vocab]."""
        model_id, loaded = self._loaded(params)
        spec = loaded.model.spec
        ids = np.asarray(self._token_ids(params, "token_ids", spec.vocab_size), dtype=np.int64)
        started = time.monotonic()
        work = ForwardWork()
        try:
            logits, layers, _ = await self._step(model_id, loaded.model, ids, loaded.model.new_cache(),
                                                 self._options(params), ctx, work, last_only=False)
        finally:  # the holders' work is paid, and their failures penalized, however the forward ended
            self.forward.record_work(model_id=model_id, forward_id=uuid.uuid4().hex, work=work)
        return {"model_id": model_id, "tokens": len(ids), "vocab_size": spec.vocab_size, "layers": layers,
                "elapsed_ms": round((time.monotonic() - started) * 1000.0, 3)}, \
            np.ascontiguousarray(logits, dtype="<f4").tobytes()

    async def generate(self, params: dict[str, Any], body: bytes | bytearray, ctx: CallContext) -> Result:
        model_id, loaded = self._loaded(params)
        spec = loaded.model.spec
        prompt = self._token_ids(params, "prompt_ids", spec.vocab_size)
        max_new = params.get("max_new_tokens", 16)
        limit = settings.TENZRO_GENERATE_MAX_NEW_TOKENS
        if isinstance(max_new, bool) or not isinstance(max_new, int) or not 1 <= max_new <= limit:
            raise InvalidInput(f"param 'max_new_tokens' must be an integer from 1 to {limit}, got {max_new!r}")
        options = self._options(params)
        if len(self._running) >= settings.TENZRO_GENERATE_MAX_CONCURRENT:
            raise RateLimited(f"{len(self._running)} generations are running on this router "
                              f"(TENZRO_GENERATE_MAX_CONCURRENT); try again when one ends", reason="busy")
        generation_id = uuid.uuid4().hex
        await self._write(services.generation_start, generation_id=generation_id, model_id=model_id,
                          prompt_ids=prompt, max_new_tokens=max_new, options=options, running=set(self._running))
        task = asyncio.create_task(self._run(generation_id, model_id, loaded, prompt, max_new, options))
        self._running[generation_id] = task
        task.add_done_callback(lambda _: self._running.pop(generation_id, None))
        return {"generation_id": generation_id, "state": "running", "model_id": model_id}, b""

    async def _step(self, model_id: str, model: WholeModel, ids: np.ndarray, cache: Any, options: dict[str, Any],
                    ctx: CallContext, work: ForwardWork, *, last_only: bool = True
                    ) -> tuple[np.ndarray, list[dict[str, Any]], float]:
        """One whole-model forward of `ids` (by default the last position's logits only), every MoE
        layer over the network, its penalties, latencies, kept batches and paid work into `work`;
        the layers' stats in order, and the seconds the dense part computed (on the compute thread)."""
        gen = model.run(ids, cache, last_only=last_only)
        layers: list[dict[str, Any]] = []
        done, value, dense_s = await ctx.run_blocking(self.executor, _advance, gen, None)
        while not done:
            layer, x = value
            # the step's record keeps this layer's stats: no ForwardRecord per layer and token
            result, out = await self.forward.forward_layer(
                model_id, layer, x, ctx, allow_partial=options["allow_partial"],
                codecs=(options["wire"],) if options["wire"] else (), keep_record=False, work=work)
            layers.append(_layer_stats(layer, result))
            done, value, seconds = await ctx.run_blocking(self.executor, _advance, gen, out)
            dense_s += seconds
        return value, layers, dense_s

    async def _run(self, generation_id: str, model_id: str, loaded: LoadedModel, prompt: list[int],
                   max_new: int, options: dict[str, Any]) -> None:
        ctx = CallContext(door=Door.OPERATOR)
        model, cache = loaded.model, loaded.model.new_cache()
        started = time.monotonic()
        decode_started, decoded = 0.0, 0
        ids = np.asarray(prompt, dtype=np.int64)
        work = ForwardWork()  # the whole generation's: one settlement per holder, written at the end
        pending: list[dict[str, Any]] = []  # steps not yet written to the record
        written_at = 0.0

        def flush(ttft_ms: float | None = None) -> None:
            nonlocal pending, written_at
            if pending:  # a new list each time: the database thread owns the one it was handed
                self._write(services.generation_steps, generation_id=generation_id, steps=pending, ttft_ms=ttft_ms)
            pending, written_at = [], time.monotonic()

        try:
            for index in range(max_new):
                step_started = time.monotonic()
                logits, layers, dense_s = await self._step(model_id, model, ids, cache, options, ctx, work)
                token = int(np.argmax(logits[-1]))  # greedy; a tie goes to the lower id, as torch.argmax
                now = time.monotonic()
                step = {"index": index, "phase": "prefill" if index == 0 else "decode", "tokens_in": len(ids),
                        "token": token, "ms": round((now - step_started) * 1000.0, 3),
                        "dense_ms": round(dense_s * 1000.0, 3), "layers": layers}
                if index == 0:
                    decode_started = now
                else:
                    decoded += 1
                pending.append(step)
                if index == 0:
                    flush(ttft_ms=round((now - started) * 1000.0, 3))
                elif now - written_at >= settings.TENZRO_GENERATION_RECORD_INTERVAL_S:
                    flush()
                if options["stop_at_eos"] and token in loaded.eos_ids:
                    break
                ids = np.array([token], dtype=np.int64)
            rate = decoded / (time.monotonic() - decode_started) if decoded else None
            flush()
            await self._write(services.generation_finish, generation_id=generation_id,
                              decode_tokens_per_s=None if rate is None else round(rate, 3))
        except TenzroError as exc:
            flush()
            await self._write(services.generation_finish, generation_id=generation_id, error_reason=exc.reason,
                              error_message=exc.message)
        except Exception as exc:  # a bug must still end the record, not leave it running
            logger.exception("generation %s failed", generation_id)
            flush()
            await self._write(services.generation_finish, generation_id=generation_id,
                              error_reason="internal_error", error_message=f"{type(exc).__name__}: {exc}")
        finally:  # one settlement per holder for the whole generation, its id the generation's
            self.forward.record_work(model_id=model_id, forward_id=generation_id, work=work)
