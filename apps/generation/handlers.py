"""The expert worker's whole-model methods: `moe/load_dense` and `moe/generate`.

Both run in the expert worker, beside the distributed forward they drive: the router keeps a
model's dense weights (embeddings, attention, norms, dense FFN layers, LM head) and each
generation's KV cache in this process, and every MoE layer of every step goes through
`DistributedForward.forward_layer` exactly as a `moe/forward` would, so failover, hedging,
receipts, penalties and settlement apply to generation unchanged.

The model itself is the sans-I/O `apps.generation.model.WholeModel.run` generator: it yields
(layer, x) at each MoE layer and takes the layer's output back. Its numpy steps run on the
compute executor; the loop only awaits the network. A generation runs as a task of its own:
`moe/generate` answers with its id once its record exists (a streamed one as soon as it starts),
and each step is written to the record (and pushed to the dashboard) as it ends. Concurrent
generations of a model step together (apps/generation/batcher.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Generator
from typing import Any, Protocol

import numpy as np
from django.conf import settings

from apps.catalog.checkpoint import CheckpointReader
from apps.catalog.shapes import shape_from_config
from apps.catalog.slicing import gate_payload_for_layer
from apps.forward.handlers import distributed_forward
from apps.forward.ledger import ForwardWork
from apps.generation import selectors, services
from apps.generation.admission import Admission, Place
from apps.generation.batcher import StepBatcher
from apps.generation.model import KVCache, WholeModel
from apps.generation.records import RecordWriter, layer_stats
from apps.generation.requests import (
    GenerateRequest,
    deadline_of,
    max_new_of,
    options_of,
    prompt_ids_of,
    sampling_of,
    stop_of,
    token_ids_checked,
)
from apps.generation.runs import GenerationRun
from apps.generation.spec import spec_from_config
from apps.generation.text import TextCodec, TextError
from apps.generation.weights import load_dense_weights
from apps.worker.doors import CallContext, Door, WorkerParts
from apps.worker.params import str_param
from apps.worker.streams import EventStream
from core.errors import InvalidInput, NotFound, TenzroError, Unavailable

logger = logging.getLogger("tenzro.generation")
Result = tuple[dict[str, Any], bytes]
BATCHING_WINDOW_S = 10.0  # the live view's tokens per second: over this many seconds
BATCHING_PUSH_S = 0.5  # at most this often to the dashboards while generations run
RESTORE_LIST_WAIT_S = 10.0  # how long a generate waits for restore() to read what it will load again


class LayerForward(Protocol):
    """What generation drives: apps.forward.handlers.DistributedForward."""

    def forward_layer(self, model_id: str, layer: int, hidden: np.ndarray, ctx: CallContext, *,
                      allow_partial: bool = ..., allow_cold: bool = ..., min_gate_mass: float = ...,
                      codecs: tuple[str, ...] = ..., keep_record: bool = ..., work: ForwardWork | None = ...
                      ) -> Awaitable[tuple[dict[str, Any], np.ndarray]]: ...

    def record_work(self, *, model_id: str, forward_id: str, work: ForwardWork) -> None: ...


def generation_handlers(parts: WorkerParts) -> dict[str, Callable[..., Awaitable[Result]]]:
    """moe/load_dense, moe/model_forward and moe/generate, over the worker's distributed forward; at the
    worker's start, the generations it was running are closed and its dense parts loaded again."""
    handlers = WholeModelHandlers(parts, distributed_forward(parts))
    parts.on_start.append(handlers.restore)
    return handlers.table()


class LoadedModel:
    """A model whose dense part this router holds: the math, the token ids that end a generation, and its
    text codec (None, with the reason, when the checkpoint has no usable tokenizer: ids only)."""

    def __init__(self, model: WholeModel, dense_bytes: int, eos_ids: frozenset[int], checkpoint: str,
                 codec: TextCodec | None = None, no_text_reason: str = "") -> None:
        self.model, self.dense_bytes, self.eos_ids, self.checkpoint = model, dense_bytes, eos_ids, checkpoint
        self.codec, self.no_text_reason = codec, no_text_reason
        self.loaded_at = int(time.time())


def _text_codec(reader: CheckpointReader) -> tuple[TextCodec | None, str]:
    """The checkpoint's tokenizer, chat template and generation defaults, or why there are none."""
    tokenizer = reader.read_optional("tokenizer.json")
    if tokenizer is None:
        return None, f"its checkpoint ({reader.describe('')}) has no tokenizer.json"
    try:
        return TextCodec.from_files(tokenizer, reader.read_optional("tokenizer_config.json"),
                                    reader.read_optional("generation_config.json")), ""
    except TextError as exc:
        return None, str(exc)


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


class WholeModelHandlers:
    def __init__(self, parts: WorkerParts, forward: LayerForward) -> None:
        self.runtime, self.executor = parts.runtime, parts.executor
        self.forward = forward
        self.models: dict[str, LoadedModel] = {}
        self.reloading: set[str] = set()  # dense parts restore() is loading again after a worker restart
        self._listed = asyncio.Event()  # clear while restore() reads which dense parts to load again
        self._listed.set()
        self._running: dict[str, tuple[asyncio.Task, GenerationRun]] = {}  # by generation id
        # Concurrent generations of one model share each step's MoE round trips (apps/generation/batcher.py).
        self.batcher = StepBatcher(self._drive, self.forward.record_work,
                                   wait_s=settings.TENZRO_GENERATE_BATCH_WAIT_MS / 1000.0,
                                   max_rows=settings.TENZRO_GENERATE_MAX_BATCH_ROWS,
                                   on_iteration=self._batching_changed)
        # Who runs now: slots, and KV cache bytes under the memory budget (apps/generation/admission.py).
        self.admission = Admission(max_running=settings.TENZRO_GENERATE_MAX_CONCURRENT,
                                   max_queued=settings.TENZRO_GENERATE_QUEUE, kv_budget=self._kv_budget,
                                   on_change=self._running_changed)
        self._batching_pushed_at = 0.0
        self.records = RecordWriter()  # the one database thread: writes in the order asked for
        self._write = self.records.write

    def table(self) -> dict[str, Callable[..., Awaitable[Result]]]:
        return {"moe/load_dense": self.load_dense, "moe/generate": self.generate,
                "moe/generation_cancel": self.generation_cancel, "moe/model_forward": self.model_forward,
                "moe/models": self.loaded_models, "moe/batching": self.batching}

    # -- moe/load_dense ------------------------------------------------------------------------

    def _free_bytes(self, model_id: str) -> int:
        """Memory budget the dense weights of `model_id` may take: the budget less what other
        models' dense weights hold. Experts in the memory tier make room (they move to the disk
        tier, LRU first, when the reservation is made), so they do not count against it."""
        others = sum(m.dense_bytes for mid, m in self.models.items() if mid != model_id)
        return max(0, self.runtime.memory_budget_bytes - others)

    def _kv_budget(self) -> int:
        """Bytes the running generations' KV caches may hold: the memory budget less every model's dense
        weights (experts in the memory tier make room), at most TENZRO_GENERATE_KV_BUDGET_BYTES when set."""
        free = max(0, self.runtime.memory_budget_bytes - sum(m.dense_bytes for m in self.models.values()))
        configured = settings.TENZRO_GENERATE_KV_BUDGET_BYTES
        return min(free, configured) if configured else free

    def _running_changed(self, kv_bytes: int) -> None:
        try:  # held in the memory budget as the dense weights are: experts move to the disk tier to make room
            self.runtime.reserve_memory("KV caches of running generations", kv_bytes)
        except TenzroError as exc:  # admission kept it under the budget; a reservation made since may not
            logger.warning("could not reserve %d bytes of KV cache in the memory budget: %s", kv_bytes, exc)
        self._batching_changed()

    def batching_view(self) -> dict[str, Any]:
        """What the dashboard's live view shows: who runs and waits, the KV bytes, the recent iterations."""
        return {"running": len(self.admission.running), "queued": len(self.admission.queue),
                "max_concurrent": self.admission.max_running, "kv_bytes": self.admission.kv_bytes_running,
                "kv_budget_bytes": self._kv_budget(), **self.batcher.view(window_s=BATCHING_WINDOW_S, shown=60)}

    def _batching_changed(self) -> None:
        """Push the live view to the dashboards, at most every BATCHING_PUSH_S while generations run (and
        always once none does, so the page's last view is the idle one)."""
        now = time.monotonic()
        if self.admission.running and now - self._batching_pushed_at < BATCHING_PUSH_S:
            return
        self._batching_pushed_at = now
        self._write(services.generation_batching_publish, batching=self.batching_view())

    async def batching(self, params: dict[str, Any], body: bytes | bytearray, ctx: CallContext) -> Result:
        return self.batching_view(), b""

    async def load_dense(self, params: dict[str, Any], body: bytes | bytearray, ctx: CallContext) -> Result:
        model_id, checkpoint = str_param(params, "model_id"), str_param(params, "checkpoint")
        started = time.monotonic()

        def load() -> tuple[LoadedModel, list[bytes]]:
            with CheckpointReader.open(checkpoint) as reader:
                spec = spec_from_config(reader.config, model_id=model_id)
                weights = load_dense_weights(reader, spec, max_bytes=self._free_bytes(model_id))
                shape = shape_from_config(model_id, reader.config)
                gates = [gate_payload_for_layer(reader, shape, layer, model_id=model_id) for layer in spec.moe_layers]
                codec, no_text_reason = _text_codec(reader)
                eos = _eos_ids(reader.config) | (codec.eos_ids if codec is not None else frozenset())
            return LoadedModel(WholeModel(weights), weights.nbytes, eos, checkpoint, codec, no_text_reason), gates

        loaded, gates = await ctx.run_blocking(self.executor, load)
        # held under the node's memory budget: experts move to the disk tier to make room
        self.runtime.reserve_memory(f"dense weights of {model_id}", loaded.dense_bytes)
        for payload in gates:  # the router gates every MoE layer itself
            await ctx.run_blocking(self.executor, self.runtime.gate_load, payload=payload)
        self.models[model_id] = loaded
        self._write(services.dense_loaded, model_id=model_id, checkpoint=checkpoint,
                    dense_bytes=loaded.dense_bytes)  # loaded again when the worker restarts
        spec = loaded.model.spec
        logger.info("dense part of %s loaded from %s: %d bytes, %d gates", model_id, checkpoint,
                    loaded.dense_bytes, len(gates))
        return {"model_id": model_id, "family": spec.family, "checkpoint": checkpoint, "n_layers": spec.n_layers,
                "moe_layers": list(spec.moe_layers), "vocab_size": spec.vocab_size, "d_model": spec.d_model,
                "dense_bytes": loaded.dense_bytes, "gates_loaded": len(gates),
                "eos_token_ids": sorted(loaded.eos_ids), "context_length": spec.max_position_embeddings,
                "text": loaded.codec is not None, "chat_template": loaded.codec is not None
                and loaded.codec.chat_template is not None, "no_text_reason": loaded.no_text_reason or None,
                "elapsed_ms": round((time.monotonic() - started) * 1000.0, 3)}, b""

    async def restore(self) -> None:
        """At the worker's start: the generations the last worker was running are closed as interrupted
        (their clients get an answer), then every dense part it had loaded is loaded again from where it
        came, under the memory budget, so the router generates again with no operator step."""
        self._listed.clear()  # a generate asked meanwhile waits for the list, not told "load them first"
        try:  # a generation asked for since this worker opened its doors is its own: left running
            closed = await self._write(services.generations_interrupted, running=set(self._running))
            remembered = await self._write(selectors.dense_loaded_list)
        except Exception:  # the database is down: logged by the write; the operator loads them by hand
            return
        else:
            self.reloading.update(loaded["model_id"] for loaded in remembered)
        finally:
            self._listed.set()
        for gone in closed:  # a client still reading its stream hears the end now, not at its idle timeout
            if gone["stream"]:
                stream = EventStream(gone["stream"])
                await stream.put({"type": "end", "finish_reason": "error", "text": "", "usage": None,
                                  "error": {"reason": "interrupted", "message": services.INTERRUPTED}})
                await stream.close()
        if closed:
            logger.warning("%d generation(s) interrupted by the last expert worker's stop were closed", len(closed))
        ctx = CallContext(door=Door.OPERATOR)
        for loaded in remembered:
            try:
                await self.load_dense({"model_id": loaded["model_id"], "checkpoint": loaded["checkpoint"]}, b"", ctx)
            except Exception as exc:  # moved, unreadable, over the budget now: said, and the others still load
                logger.error("could not load the dense part of %s again from %s: %s", loaded["model_id"],
                             loaded["checkpoint"], exc)
            finally:
                self.reloading.discard(loaded["model_id"])

    # -- moe/generate --------------------------------------------------------------------------

    async def _loaded(self, params: dict[str, Any]) -> tuple[str, LoadedModel]:
        model_id = str_param(params, "model_id")
        if model_id not in self.models and not self._listed.is_set():
            with contextlib.suppress(TimeoutError):  # then answered as if nothing were being loaded again
                await asyncio.wait_for(self._listed.wait(), RESTORE_LIST_WAIT_S)
        loaded = self.models.get(model_id)
        if loaded is None and model_id in self.reloading:
            raise Unavailable(f"the dense weights of {model_id!r} are being loaded again (the expert worker "
                              "restarted); retry in a few seconds", reason="dense_reloading")
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
            raise InvalidInput(f"param {name!r} must be a list of 1 to {limit} token ids", param=name)
        return token_ids_checked(ids, name, vocab=vocab)

    async def model_forward(self, params: dict[str, Any], body: bytes | bytearray, ctx: CallContext) -> Result:
        """One whole-model forward of token_ids from position 0 (no cache kept): logits f32 [t, vocab]."""
        model_id, loaded = await self._loaded(params)
        spec = loaded.model.spec
        ids = np.asarray(self._token_ids(params, "token_ids", spec.vocab_size), dtype=np.int64)
        started = time.monotonic()
        work = ForwardWork()
        try:
            logits, layers, _ = await self._step(model_id, loaded.model, ids, loaded.model.new_cache(),
                                                 options_of(params), ctx, work, last_only=False)
        finally:  # the holders' work is paid, and their failures penalized, however the forward ended
            self.forward.record_work(model_id=model_id, forward_id=uuid.uuid4().hex, work=work)
        return {"model_id": model_id, "tokens": len(ids), "vocab_size": spec.vocab_size, "layers": layers,
                "elapsed_ms": round((time.monotonic() - started) * 1000.0, 3)}, \
            np.ascontiguousarray(logits, dtype="<f4").tobytes()

    def _request(self, params: dict[str, Any], loaded: LoadedModel) -> GenerateRequest:
        """The call's params checked, its prompt as ids (tokenized or rendered here: a long prompt takes a
        while, so this runs on the compute executor)."""
        spec = loaded.model.spec
        ids = prompt_ids_of(params, loaded.codec, vocab=spec.vocab_size,
                            limit=settings.TENZRO_GENERATE_MAX_PROMPT_TOKENS, no_text_reason=loaded.no_text_reason,
                            context=spec.max_position_embeddings)
        max_new = max_new_of(params, prompt_tokens=len(ids), limit=settings.TENZRO_GENERATE_MAX_NEW_TOKENS,
                             context=spec.max_position_embeddings)
        stream = params.get("stream")
        if stream is not None and (not isinstance(stream, str) or not 0 < len(stream) <= 200):
            raise InvalidInput("param 'stream' must be the name of a Channels channel", param="stream")
        defaults = loaded.codec.generation_defaults if loaded.codec is not None else {}
        return GenerateRequest(prompt_ids=ids, max_new_tokens=max_new, sampling=sampling_of(params.get("sampling"),
                                                                                              defaults),
                               stop=stop_of(params.get("stop")), stream=stream, options=options_of(params),
                               deadline_s=deadline_of(params, limit=settings.TENZRO_GENERATE_DEADLINE_S))

    async def generate(self, params: dict[str, Any], body: bytes | bytearray, ctx: CallContext) -> Result:
        received_at = time.monotonic()
        model_id, loaded = await self._loaded(params)
        request = await ctx.run_blocking(self.executor, self._request, params, loaded)
        positions = len(request.prompt_ids) + request.max_new_tokens
        # refused here (over the KV budget, or busy) before anything of it exists: no record, no seat
        place = Place(self.batcher, self.admission.ticket(KVCache.bytes_for(loaded.model.spec, positions)),
                       model_id, loaded.model, request.options)
        generation_id = uuid.uuid4().hex
        try:
            run = GenerationRun(generation_id=generation_id, model_id=model_id, model=loaded.model,
                                codec=loaded.codec, eos_ids=loaded.eos_ids, request=request, step=place.step,
                                write=self._write, write_steps=self.records.steps,
                                record_work=self.forward.record_work, received_at=received_at,
                                steps_done=place.leave, prefill_chunk=settings.TENZRO_GENERATE_PREFILL_CHUNK)
        except BaseException:
            place.leave()
            raise
        # the stream too: if this worker stops, the next one tells the client still reading it (restore)
        options = {**request.options, "sampling": {**run.sampler.params.__dict__}, "stop": request.stop,
                   "stream": request.stream}
        written = self._write(services.generation_start, generation_id=generation_id, model_id=model_id,
                              prompt_ids=request.prompt_ids, max_new_tokens=request.max_new_tokens, options=options,
                              running=set(self._running))
        # The prefill starts while the record is written: the one database thread writes the steps after it.
        task = asyncio.create_task(run.run())
        self._running[generation_id] = task, run

        def ended(_: asyncio.Task) -> None:
            self._running.pop(generation_id, None)
            place.leave()

        task.add_done_callback(ended)
        if request.stream is not None:  # its reader has the tokens from the stream: it need not wait for the record
            written.add_done_callback(lambda w: run.cancel(task) if w.cancelled() or w.exception() else None)
        else:
            try:
                await written  # the answer names a record that exists
            except Exception:
                run.cancel(task)
                raise
        return {"generation_id": generation_id, "state": "running", "model_id": model_id,
                "prompt_tokens": len(request.prompt_ids), "max_new_tokens": request.max_new_tokens,
                "seed": run.sampler.seed}, b""

    async def loaded_models(self, params: dict[str, Any], body: bytes | bytearray, ctx: CallContext) -> Result:
        """The models this router can generate: its dense part loaded, and what it serves (ids, text, chat)."""
        return {"models": [{"model_id": model_id, "family": m.model.spec.family, "checkpoint": m.checkpoint,
                            "text": m.codec is not None, "chat_template": m.codec is not None
                            and m.codec.chat_template is not None, "no_text_reason": m.no_text_reason or None,
                            "context_length": m.model.spec.max_position_embeddings, "loaded_at": m.loaded_at}
                           for model_id, m in sorted(self.models.items())]}, b""

    async def generation_cancel(self, params: dict[str, Any], body: bytes | bytearray, ctx: CallContext) -> Result:
        """Stop a running generation (its client left, or the operator asked): it ends within one step,
        its record `cancelled` with the tokens so far."""
        generation_id = str_param(params, "generation_id")
        running = self._running.get(generation_id)
        if running is not None:
            task, run = running
            run.cancel(task)
        return {"generation_id": generation_id, "cancelled": running is not None}, b""

    async def _step(self, model_id: str, model: WholeModel, ids: np.ndarray, cache: Any, options: dict[str, Any],
                    ctx: CallContext, work: ForwardWork, *, last_only: bool = True
                    ) -> tuple[np.ndarray, list[dict[str, Any]], float]:
        """One whole-model forward of `ids` (by default the last position's logits only), every MoE
        layer over the network, its penalties, latencies, kept batches and paid work into `work`;
        the layers' stats in order, and the seconds the dense part computed (on the compute thread)."""
        return await self._drive(model_id, model.run(ids, cache, last_only=last_only), options, ctx, work)

    async def _drive(self, model_id: str, gen: Generator[tuple[int, np.ndarray], np.ndarray, Any],
                     options: dict[str, Any], ctx: CallContext, work: ForwardWork
                     ) -> tuple[Any, list[dict[str, Any]], float]:
        """A sans-I/O run (WholeModel.run or run_batch) to its end: its dense steps on the
        compute executor, each MoE layer over the network. Its return value, the layers' stats, the
        seconds the dense part computed."""
        layers: list[dict[str, Any]] = []
        done, value, dense_s = await ctx.run_blocking(self.executor, _advance, gen, None)
        while not done:
            layer, x = value
            # the step's record keeps this layer's stats: no ForwardRecord per layer and token
            result, out = await self.forward.forward_layer(
                model_id, layer, x, ctx, allow_partial=options["allow_partial"],
                codecs=(options["wire"],) if options["wire"] else (), keep_record=False, work=work)
            layers.append(layer_stats(layer, result))
            done, value, seconds = await ctx.run_blocking(self.executor, _advance, gen, out)
            dense_s += seconds
        return value, layers, dense_s
