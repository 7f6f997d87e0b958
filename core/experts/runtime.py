"""ExpertRuntime: the facade the expert worker calls (load, gate, route, execute, status).

Pure: no Django. Called from a thread pool, possibly from several threads at once:
`self._lock` guards the gate table and the load-time consistency checks; the tiered cache
has its own lock for tier state; matmuls run with no runtime lock held.

On-disk layout under ``data_dir/moe``::

    experts/<model>/layer<L>/expert<E>.safetensors (+ .json sidecar: header, blob_uri)
    gates/<model>/layer<L>.safetensors             (+ .json sidecar: core/experts/gate_store.py)

Both are written at load and re-registered at start, so holdings survive a restart (experts
come back Cold and are promoted on first use or by readahead).
"""

from __future__ import annotations

import logging
import pathlib
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from core.experts.backends import ComputeBackend
from core.experts.errors import (
    ExpertNotLoaded,
    GateNotLoaded,
    InsufficientMemory,
    InvalidPayload,
    ModelMismatch,
    ShapeMismatch,
)
from core.experts.ffn import (
    ExpertHeader,
    ResidentExpert,
    build_expert,
    build_expert_from,
    parse_payload,
    read_header,
)
from core.experts.gate_store import GateStore, check_pair, read_gate
from core.experts.gating import Routing, route
from core.experts.gpu.backend import GpuBackend
from core.experts.metering import WINDOW_S, DemandMeter, ThroughputMeter
from core.experts.selection import cpu_backend
from core.experts.tiered_cache import Key, TieredCache, default_memory_budget
from core.experts.validation import check_hidden
from core.formats.gate_payload import GateSpec

log = logging.getLogger(__name__)

__all__ = ["ExpertRuntime", "Routing"]


class ExpertRuntime:
    """Experts and gates of any number of (model_id, layer) pairs, in a tiered cache."""

    def __init__(
        self,
        *,
        data_dir: pathlib.Path,
        memory_budget_bytes: int | None = None,
        backend: ComputeBackend | None = None,
        backend_candidates: list[dict[str, Any]] | None = None,
        on_change: Callable[[], None] | None = None,
        on_corrupt: Callable[[tuple[str, int, int], str | None], None] | None = None,
        meter_window_s: float = WINDOW_S,
    ) -> None:
        """`on_change()` is called after anything a holder advertises changes: an expert or gate
        loaded or unloaded, promoted or evicted (see TieredCache). It must be cheap and
        thread-safe; the expert worker publishes its holdings to the control plane from it.
        `on_corrupt(key, blob_uri)`: an expert's disk-tier payload failed its hash and was forgotten.
        `backend_candidates`: how the backend was chosen (core/experts/selection.py), for status().
        `meter_window_s`: the rolling window of the demand and capacity meters (a minute)."""
        self.data_dir = pathlib.Path(data_dir)
        # no backend given: the CPU one; the expert worker chooses (and may open a GPU) itself
        self.backend = backend if backend is not None else cpu_backend()
        self._candidates = list(backend_candidates or [])
        if isinstance(self.backend, GpuBackend) and self.backend.on_state_change is None:
            self.backend.on_state_change = self._changed  # a failed device stops the node advertising moe_gpu
        budget = default_memory_budget() if memory_budget_bytes is None else int(memory_budget_bytes)
        self._root = self.data_dir / "moe"
        self._on_change = on_change
        # Bumped on every load, unload and backend state change: a reader that keeps something built
        # from the holdings (the forward's shard index) knows when to build it again.
        self.holdings_version = 0
        self._cache = TieredCache(root=self._root / "experts", budget_bytes=budget, decode=self._decode,
                                  on_change=on_change, on_corrupt=on_corrupt)
        self._gates = GateStore(self._root / "gates")
        self._lock = threading.RLock()
        self._meter = ThroughputMeter(window_s=meter_window_s)  # capacity: rows per second of compute, node-wide
        self._demand = DemandMeter(window_s=meter_window_s)  # demand: rows served per wall second, per expert
        self._cache.scan(lambda data: read_header(parse_payload(data))[0])
        self._gates.scan()

    # -- experts -----------------------------------------------------------------------------

    def _decode(self, payload: bytes) -> ResidentExpert:
        return build_expert(payload, self.backend)

    def expert_load(
        self, *, payload: bytes | bytearray, blob_uri: str | None = None, expect: dict[str, Any] | None = None,
        stored_at: pathlib.Path | None = None,
    ) -> dict[str, Any]:
        """Load one expert; (model_id, layer, expert) come from the payload metadata.

        `stored_at` is a file that already holds exactly `payload` (the blob it came from):
        the disk tier links to it rather than storing the bytes a second time.

        `expect` names ids the caller asked for ({"model_id", "layer", "expert"}, any subset):
        a payload carrying other ids is refused with ModelMismatch before anything is stored.
        Raises InvalidPayload, or ModelMismatch when the layer's gate or experts disagree.
        Reloading the same key replaces it. Returns the expert's status row.
        """
        header, tensors = read_header(parse_payload(payload))
        _check_expected("expert payload", {"model_id": header.model_id, "layer": header.layer,
                                           "expert": header.expert}, expect)
        expert = build_expert_from(header, tensors, self.backend)  # before the lock: it is the slow part
        with self._lock:
            self._check_expert_fits(header)
            self._cache.put(payload, expert, header, blob_uri, stored_at=stored_at)
        return self._expert_row(expert.key)

    def expert_unload(self, *, model_id: str, layer: int, expert: int) -> None:
        """Forget an expert in both tiers; ExpertNotLoaded if it is not held."""
        self._cache.remove((model_id, int(layer), int(expert)))

    def _check_expert_fits(self, header: ExpertHeader) -> None:
        gate = self._gates.get(header.model_id, header.layer)
        if gate is not None:
            check_pair(gate.spec, header)
        for key, record, _ in self._cache.records():
            if key[:2] == (header.model_id, header.layer) and key[2] != header.expert:
                if record.header.d_model != header.d_model:
                    raise ModelMismatch(
                        f"expert {header.expert} of {header.model_id!r} layer {header.layer} has d_model "
                        f"{header.d_model}, but expert {key[2]} of that layer has {record.header.d_model}"
                    )
                break  # every held expert of the layer already agrees with each other

    # -- gates -------------------------------------------------------------------------------

    def gate_load(
        self, *, payload: bytes | bytearray, blob_uri: str | None = None, expect: dict[str, Any] | None = None,
        stored_at: pathlib.Path | None = None,
    ) -> dict[str, Any]:
        """Load a layer's gate; replaces a previous one. InvalidPayload / ModelMismatch.

        `expect` ({"model_id", "layer"}, any subset) as for expert_load; it also names a
        payload whose metadata carries no model_id / layer. `stored_at` as for expert_load."""
        if not isinstance(payload, bytes | bytearray):
            raise InvalidPayload("gate payload must be bytes")
        expect = expect or {}
        spec = read_gate(payload, model_id=expect.get("model_id"), layer=expect.get("layer"))
        _check_expected("gate payload", {"model_id": spec.model_id, "layer": spec.layer}, expect)
        with self._lock:
            for key, record, _ in self._cache.records():
                if key[:2] == (spec.model_id, spec.layer):
                    check_pair(spec, record.header)
            row = self._gates.put(spec, payload, blob_uri=blob_uri, stored_at=stored_at).row()
        self._changed()
        return row

    def gate_unload(self, *, model_id: str, layer: int) -> None:
        with self._lock:
            gate = self._gates.pop(model_id, layer)
        if gate is None:
            raise GateNotLoaded(f"no gate loaded for model_id={model_id!r} layer={layer}")
        GateStore.delete_files(gate)
        self._changed()

    def _changed(self) -> None:
        self.holdings_version += 1
        if self._on_change is not None:
            try:
                self._on_change()
            except Exception:  # a listener's failure must never break a load
                log.exception("runtime change listener failed")

    def gate_spec(self, model_id: str, layer: int) -> GateSpec:
        """The loaded gate of (model_id, layer); raises GateNotLoaded."""
        return self._gate(model_id, layer)

    def _gate(self, model_id: str, layer: int) -> GateSpec:
        with self._lock:
            gate = self._gates.get(model_id, layer)
        if gate is None:
            raise GateNotLoaded(f"no gate loaded for model_id={model_id!r} layer={layer}")
        return gate.spec

    # -- compute -----------------------------------------------------------------------------

    def route(self, *, model_id: str, layer: int, hidden: np.ndarray) -> Routing:
        """Gate a batch f32 [t, d_model] -> Routing (experts int64 [t, k_total], weights f32)."""
        return route(self._gate(model_id, layer), hidden)

    def execute(self, *, model_id: str, layer: int, expert: int, hidden: np.ndarray) -> np.ndarray:
        """Run rows f32 [t, d_model] through one held expert -> f32 [t, d_model]."""
        key = (model_id, int(layer), int(expert))
        x = check_hidden(hidden, self._cache.record(key).header.d_model)
        return self._run(key, x)

    def execute_many(self, *, model_id: str, layer: int, batches: list[tuple[int, np.ndarray]]
                     ) -> list[tuple[np.ndarray, float]]:
        """Several held experts of one layer, each over its own rows: batches [(expert, f32 [t_i, d_model])]
        -> [(f32 [t_i, d_model], compute seconds)] in the same order.

        Every expert is checked before any runs: ExpertNotLoaded names all that are not held here
        (details `experts`), ShapeMismatch / NonFiniteInput the first bad batch."""
        keys = self._held(model_id, layer, [e for e, _ in batches])
        xs = [check_hidden(x, self._cache.record(key).header.d_model) for key, (_, x) in zip(keys, batches,
                                                                                               strict=True)]
        return self._execute_checked(keys, xs)

    def execute_carrier(self, *, model_id: str, layer: int, hidden: np.ndarray,
                        batches: list[tuple[int, list[int]]]) -> list[tuple[np.ndarray, float]]:
        """execute_many over one carrier of rows (a multi-expert request's body): hidden f32 [n, d_model],
        checked once, and batches [(expert, strictly ascending positions into it)]. A batch naming every
        row takes the carrier itself (a decode step's experts all share its one row); the others a copy
        of their rows. Raises as execute_many."""
        keys = self._held(model_id, layer, [e for e, _ in batches])
        if not keys:
            return []
        d_model = self._cache.record(keys[0]).header.d_model
        x = check_hidden(hidden, d_model)
        other = [key[2] for key in keys if self._cache.record(key).header.d_model != d_model]
        if other:
            raise ShapeMismatch(f"{model_id!r} layer {layer}: experts {other} are not d_model {d_model} as "
                                f"expert {keys[0][2]} is; one carrier cannot feed them all")
        return self._execute_checked(keys, [x if len(rows) == len(x) else x[rows] for _, rows in batches])

    def _held(self, model_id: str, layer: int, experts: list[int]) -> list[Key]:
        """The experts' keys; ExpertNotLoaded naming every one not held here."""
        keys = [(model_id, int(layer), int(e)) for e in experts]
        missing = [k[2] for k in keys if k not in self._cache]
        if missing:
            raise ExpertNotLoaded(f"{model_id!r} layer {layer}: experts {missing} are not held on this node",
                                  experts=missing)
        return keys

    def _execute_checked(self, keys: list[Key], xs: list[np.ndarray]) -> list[tuple[np.ndarray, float]]:
        if getattr(self.backend, "groups_experts", False) and sum(1 for x in xs if len(x)) > 1:
            return self._run_together(keys, xs)
        out = []
        for key, x in zip(keys, xs, strict=True):
            start = time.perf_counter()
            out.append((self._run(key, x), time.perf_counter() - start))
        return out

    def _run_together(self, keys: list[Key], xs: list[np.ndarray]) -> list[tuple[np.ndarray, float]]:
        """execute_many on a backend that computes several experts in one call (a GPU device's
        grouped forward): one call for the batches with rows, its time shared among them by rows
        (what each batch's compute_ms then says); the call metered once, each expert's demand by its own rows."""
        residents = [self._cache.get(key) for key in keys]  # promotes Cold experts; not metered
        busy = [i for i, x in enumerate(xs) if len(x)]
        start = time.perf_counter()
        ys = self.backend.forward_many([(residents[i].prepared, xs[i]) for i in busy])
        seconds = time.perf_counter() - start
        rows = sum(len(xs[i]) for i in busy)
        self._meter.record(rows, seconds)  # the call's rows in its time: the sum of the batches' shares
        self._demand.record_many([(keys[i], len(xs[i])) for i in busy])
        answered = dict(zip(busy, ys, strict=True))
        return [(answered[i], seconds * len(xs[i]) / rows) if i in answered
                else (np.zeros((0, r.d_model), dtype=np.float32), 0.0) for i, r in enumerate(residents)]

    def recompute(self, *, model_id: str, layer: int, expert: int, hidden: np.ndarray) -> np.ndarray:
        """One held expert over hidden f32 [t, d_model] -> f32 [t, d_model], unmetered: a dispute's
        re-execution is neither demand for the expert nor a measure of this node's rate."""
        key = (model_id, int(layer), int(expert))
        if key not in set(self._cache.keys()):
            raise ExpertNotLoaded(f"expert {key} is not held on this node", experts=[int(expert)])
        return self._run(key, check_hidden(hidden, self._cache.record(key).header.d_model), metered=False)

    def _run(self, key: Key, x: np.ndarray, *, metered: bool = True) -> np.ndarray:
        resident = self._cache.get(key)  # promotes a Cold expert; not metered (not compute)
        if x.shape[0] == 0:
            return np.zeros((0, resident.d_model), dtype=np.float32)
        start = time.perf_counter()
        y = self.backend.forward(resident.prepared, x)
        if metered:
            self._meter.record(x.shape[0], time.perf_counter() - start)
            self._demand.record(key, x.shape[0])
        return y

    def warm(self) -> int:
        """Promote the Cold experts held here that fit in the memory budget's free room (after a
        restart: every payload comes back Cold); returns how many (TieredCache.warm)."""
        return self._cache.warm()

    def readahead(self, keys: Iterable[tuple[str, int, int]]) -> None:
        """Promote the listed experts this node holds to the memory tier; others are skipped
        (a routing decision names remote experts too)."""
        self._cache.promote(k for k in ((m, int(ly), int(e)) for m, ly, e in keys) if k in self._cache)

    def needs_readahead(self, keys: Iterable[tuple[str, int, int]]) -> bool:
        """Whether readahead(keys) would load anything: a listed expert held here but not in memory."""
        return any(k in self._cache and self._cache.peek(k) is None
                   for k in ((m, int(ly), int(e)) for m, ly, e in keys))

    def forward_local(self, *, model_id: str, layer: int, hidden: np.ndarray) -> np.ndarray:
        """gate -> readahead -> execute each selected expert on its tokens -> weighted combine.

        hidden f32 [t, d_model] -> f32 [t, d_model]. Every selected expert (shared ones
        included) must be held here, else ExpertNotLoaded names the missing ids before any
        compute runs.
        """
        gate = self._gate(model_id, layer)
        x = check_hidden(hidden, gate.d_model)
        routing = route(gate, x)
        groups = routing.tokens_by_expert()
        held = set(self._cache.keys())
        missing = sorted(e for e in groups if (model_id, int(layer), e) not in held)
        if missing:
            raise ExpertNotLoaded(
                f"forward_local of {model_id!r} layer {layer} selected experts {missing} "
                "that are not loaded on this node"
            )
        self.readahead((model_id, int(layer), e) for e in groups)
        out = np.zeros_like(x)
        for e, (tokens, weights) in sorted(groups.items()):
            y = self._run((model_id, int(layer), e), x[tokens])
            out[tokens] += weights[:, None] * y  # tokens are unique within one expert
        return out

    # -- reporting ---------------------------------------------------------------------------

    def capacity_tps(self) -> int:
        """Expert-forward rows per second of compute over the last minute (see metering.py)."""
        return round(self._meter.rows_per_second())

    def demand_tps(self) -> dict[Key, int]:
        """{(model_id, layer, expert): rows served per wall second over the last minute}, experts
        that served at least one row in it (see metering.py), rounded to whole rows per second."""
        return {key: round(rate) for key, rate in self._demand.rates().items()}

    def status(self) -> dict[str, Any]:
        rows = self._cache.records()
        demand = self.demand_tps()
        experts = [{**self._row(k, r, warm), "committed_tps": demand.get(k, 0)} for k, r, warm in rows]
        with self._lock:
            gates = [g.row() for g in self._gates.all()]
        warm = sum(1 for *_, w in rows if w)
        return {
            "experts": experts,
            "gates": gates,
            "memory_budget_bytes": self._cache.budget_bytes,
            # the memory tier plus what is held outside it under the same budget (reserve_memory)
            "memory_used_bytes": self._cache.used_bytes + self._cache.reserved_bytes,
            "counts": {"warm": warm, "cold": len(rows) - warm, "gates": len(gates)},
            # demand: node-wide total and per expert ([model_id, layer, expert, rows/s]); capacity
            "committed_tps": sum(demand.values()),
            "demand": [[*key, tps] for key, tps in sorted(demand.items())],
            "capacity_tps": self.capacity_tps(),
            "gpu_backend_active": bool(self.backend.is_gpu),
            "backend": self.backend.name,
            "cpu_kernel": self.backend.cpu_kernel,
            "compute": self.compute_status(),
        }

    def compute_status(self) -> dict[str, Any]:
        """How the backend was chosen ({name, available, active, reason} per candidate) and, for a
        GPU backend, its device tier and health (core/experts/gpu/backend.py device_status)."""
        device_status = getattr(self.backend, "device_status", None)
        return {"candidates": self._candidates, "device": device_status() if device_status else None}

    @property
    def memory_budget_bytes(self) -> int:
        return self._cache.budget_bytes

    def set_memory_budget(self, nbytes: int) -> None:
        """A new memory budget (see TieredCache.set_budget)."""
        self._cache.set_budget(nbytes)

    def reserve_memory(self, name: str, nbytes: int) -> None:
        """Hold `nbytes` of the memory budget for something outside the expert tier (a router's
        dense weights), moving experts to the disk tier as needed; 0 releases it. Raises
        InsufficientMemory (over_budget) when the reservations would exceed the budget."""
        try:
            self._cache.reserve(name, nbytes)
        except ValueError as exc:
            raise InsufficientMemory(str(exc)) from None

    def held(self, model_id: str) -> list[tuple[int, int, bool, str | None]]:
        """(layer, expert, warm, blob_uri) of every expert of `model_id` held here, cheaply (no rows)."""
        return [(k[1], k[2], warm, record.blob_uri) for k, record, warm in self._cache.records() if k[0] == model_id]

    def _expert_row(self, key: Key) -> dict[str, Any]:
        for k, record, warm in self._cache.records():
            if k == key:
                return self._row(k, record, warm)
        raise ExpertNotLoaded(f"expert {key} is not loaded on this node")  # unloaded concurrently

    def _row(self, key: Key, record: Any, warm: bool) -> dict[str, Any]:
        resident = self._cache.peek(key) if warm else None
        return {
            "model_id": key[0], "layer": key[1], "expert": key[2],
            "tier": "memory" if warm else "disk", "residency": "Warm" if warm else "Cold",
            "memory_bytes": resident.nbytes if resident is not None else 0,
            "disk_bytes": record.disk_bytes,
            "d_model": record.header.d_model, "d_ff": record.header.d_ff,
            "formats": dict(record.header.formats),
            "blob_uri": record.blob_uri,
        }


def _check_expected(what: str, found: dict[str, Any], expect: dict[str, Any] | None) -> None:
    """ModelMismatch naming each id the caller expected that the payload does not carry."""
    wrong = {k: (v, found[k]) for k, v in (expect or {}).items() if v is not None and found[k] != v}
    if wrong:
        detail = ", ".join(f"{k} {want!r} but the payload says {got!r}" for k, (want, got) in wrong.items())
        raise ModelMismatch(f"{what} does not match the request: expected {detail}")
