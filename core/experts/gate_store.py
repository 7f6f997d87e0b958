"""The gates an ExpertRuntime holds: one per (model_id, layer), kept on disk beside its experts.

Pure: no Django. On disk, under the runtime's ``moe`` folder::

    gates/<model>/layer<L>.safetensors  (+ .json sidecar: blob_uri, model_id, layer, blake3)

The sidecar keeps the ids (the payload itself may not carry them) and the payload's BLAKE3, checked
when the file is read back at the next start. Not locked by itself: the runtime calls it under its
own lock, where a gate and the layer's experts are checked against each other.
"""

from __future__ import annotations

import json
import logging
import pathlib
from dataclasses import dataclass
from typing import Any

from blake3 import blake3

from core.durable_files import link_or_write_atomic, write_atomic
from core.experts.errors import InvalidPayload, ModelMismatch
from core.experts.ffn import ExpertHeader
from core.experts.tiered_cache import model_dir_name
from core.formats import errors as format_errors
from core.formats.gate_payload import GateSpec, read_gate_payload

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoredGate:
    spec: GateSpec
    blob_uri: str | None
    path: pathlib.Path

    def row(self) -> dict[str, Any]:
        """The gate's status row (ExpertRuntime.status()'s `gates`)."""
        s = self.spec
        return {
            "model_id": s.model_id, "layer": s.layer, "router": s.router, "n_routed": s.n_routed,
            "n_shared_experts": s.n_shared_experts, "top_k": s.top_k, "d_model": s.d_model,
            "memory_bytes": s.nbytes, "blob_uri": self.blob_uri,
        }


class GateStore:
    """{(model_id, layer): StoredGate}, written through to `root` (the runtime's ``moe/gates``)."""

    def __init__(self, root: pathlib.Path) -> None:
        self._root = root
        self._gates: dict[tuple[str, int], StoredGate] = {}

    def get(self, model_id: str, layer: int) -> StoredGate | None:
        return self._gates.get((model_id, int(layer)))

    def all(self) -> list[StoredGate]:
        """Every gate, in (model_id, layer) order."""
        return [gate for _, gate in sorted(self._gates.items())]

    def put(self, spec: GateSpec, payload: bytes | bytearray, *, blob_uri: str | None,
            stored_at: pathlib.Path | None) -> StoredGate:
        """Store `payload` (linked from `stored_at` when that file already holds it) and its sidecar;
        replaces the layer's previous gate."""
        path = self._root / model_dir_name(spec.model_id) / f"layer{spec.layer}.safetensors"
        link_or_write_atomic(path, payload, existing=stored_at)
        sidecar = {"blob_uri": blob_uri, "model_id": spec.model_id, "layer": spec.layer,
                   "blake3": blake3(payload).hexdigest()}
        write_atomic(path.with_suffix(".json"), json.dumps(sidecar).encode())
        gate = self._gates[(spec.model_id, spec.layer)] = StoredGate(spec, blob_uri, path)
        return gate

    def pop(self, model_id: str, layer: int) -> StoredGate | None:
        """Forget the layer's gate (its files stay until `delete_files`); None if none was held."""
        return self._gates.pop((model_id, int(layer)), None)

    @staticmethod
    def delete_files(gate: StoredGate) -> None:
        for p in (gate.path, gate.path.with_suffix(".json")):
            p.unlink(missing_ok=True)

    def scan(self) -> None:
        """Register the gates on disk; one whose bytes no longer match the hash its sidecar recorded
        (disk corruption, tampering) is forgotten, files and all, rather than routed with."""
        for path in sorted(self._root.glob("*/layer*.safetensors")):
            try:
                sidecar = path.with_suffix(".json")
                meta = json.loads(sidecar.read_text()) if sidecar.exists() else {}
                data = path.read_bytes()
                blob_uri = meta.get("blob_uri")
                if meta.get("blake3") and blake3(data).hexdigest() != meta["blake3"]:
                    log.warning("gate payload %s does not match its hash; forgotten (load it again%s)", path,
                                f": tenzro moe load-gate --blob {blob_uri}" if blob_uri else "")
                    for stale in (path, sidecar):
                        stale.unlink(missing_ok=True)
                    continue
                spec = read_gate(data, model_id=meta.get("model_id"), layer=meta.get("layer"))
            except (OSError, ValueError, InvalidPayload) as exc:
                log.warning("skipping unreadable gate payload %s: %s", path, exc)
                continue
            self._gates[(spec.model_id, spec.layer)] = StoredGate(spec, blob_uri, path)


def read_gate(data: bytes | bytearray, *, model_id: str | None, layer: int | None) -> GateSpec:
    """read_gate_payload, its format error raised as the runtime's InvalidPayload (same message)."""
    try:
        return read_gate_payload(data, model_id=model_id, layer=layer)
    except format_errors.InvalidPayload as exc:
        raise InvalidPayload(exc.message, reason=exc.reason, **exc.details) from exc


def check_pair(gate: GateSpec, header: ExpertHeader) -> None:
    """A gate and an expert of the same (model_id, layer) must agree on width and id range (and,
    for a dense gate, on the slice's d_ff width)."""
    if gate.d_model != header.d_model:
        raise ModelMismatch(
            f"{header.model_id!r} layer {header.layer}: gate has d_model {gate.d_model}, "
            f"expert {header.expert} has d_model {header.d_model}"
        )
    n_total = gate.n_routed + gate.n_shared_experts
    if header.expert >= n_total:
        raise ModelMismatch(
            f"{header.model_id!r} layer {header.layer}: expert {header.expert} is out of range for a gate "
            f"with {gate.n_routed} routed + {gate.n_shared_experts} shared experts (ids 0..{n_total - 1})"
        )
    if gate.is_dense:  # a slice cut for another slice count or alignment would sum to the wrong layer
        start, end = gate.slice_bounds(header.expert)
        if header.d_ff != end - start:
            raise ModelMismatch(
                f"{header.model_id!r} layer {header.layer}: slice {header.expert} has d_ff {header.d_ff}, but the "
                f"dense gate ({gate.n_shared_experts} slices of d_ff {gate.dense_d_ff}, slice_align "
                f"{gate.slice_align}) gives it rows [{start}, {end}) ({end - start} wide)"
            )
