"""The gossip view the shard map and the planner read: providers, their holdings, the policy.

Pure module (no Django). The control plane turns its provider rows and the active
governance policy into these frozen values (apps/providers selectors); everything here and
in the planner reads only them, so both run without a database and are tested alone.

Each constructor checks what the rest of the package relies on (residency spelling,
non-negative integer ids, finite numbers) and raises ValueError naming the field, so a bad
row fails where it is built instead of as a wrong plan later.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ROLES = ("Replica", "Router", "ExpertHolder", "PrefillDecode", "Prefill", "Decode")
RESIDENCIES = ("Warm", "Cold")

# Layer and expert ids are packed as (layer << 32) | expert into one int64 key (core.shardmap.index),
# and token indices ride int64 sort keys beside them; 2**31 keeps every such key far from overflow
# and is far above any real model (Kimi K3: 61 layers, 898 experts).
MAX_ID = 2**31


def check_id(value: object, what: str) -> int:
    """`value` if it is an int in [0, 2**31) (bool is refused), else ValueError naming `what`."""
    if type(value) is not int or not 0 <= value < MAX_ID:
        raise ValueError(f"{what} must be an integer in [0, 2**31), got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class ProviderView:
    """One provider as the view knows it.

    ``quic_endpoint`` is "host:port"; ``quic_cert_sha256`` the pinned TLS certificate
    fingerprint from its signed record (None when it advertises no QUIC door, and then the
    forward uses ``http_endpoint``). ``latency_ms`` is the recent measured round trip to it,
    None when this node has not measured one. ``wire_ns_per_byte`` is the time its large answers
    took beyond that round trip and its compute, per byte of request and answer (its path's
    throughput, inverted; None when not measured). ``reputation`` is its score as this node sees it
    (apps.reputation: penalties down, settlement credits up; 0 for one never seen), and
    ``price_per_input_token`` the decimal string of its signed record.
    """

    provider_id: str
    roles: tuple[str, ...]
    http_endpoint: str | None
    quic_endpoint: str | None
    quic_cert_sha256: str | None
    moe_gpu: bool
    latency_ms: float | None = None
    activation_codecs: tuple[str, ...] = ("f32",)  # what its moe/execute accepts, preferred first
    reputation: float = 0.0
    price_per_input_token: str = "0"
    execute_batches: bool = False  # its moe/execute takes a multi-expert frame
    wire_ns_per_byte: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.provider_id, str) or not self.provider_id:
            raise ValueError(f"provider_id must be a non-empty string, got {self.provider_id!r}")
        if not isinstance(self.roles, tuple):
            raise ValueError(f"provider {self.provider_id}: roles must be a tuple, got {type(self.roles).__name__}")
        if type(self.moe_gpu) is not bool:
            raise ValueError(f"provider {self.provider_id}: moe_gpu must be a bool, got {self.moe_gpu!r}")
        latency = self.latency_ms
        if latency is not None and (
            type(latency) not in (int, float) or not math.isfinite(latency) or latency < 0
        ):
            raise ValueError(f"provider {self.provider_id}: latency_ms must be finite and >= 0, got {latency!r}")
        wire = self.wire_ns_per_byte
        if wire is not None and (type(wire) not in (int, float) or not math.isfinite(wire) or wire < 0):
            raise ValueError(f"provider {self.provider_id}: wire_ns_per_byte must be finite and >= 0, got {wire!r}")
        if type(self.reputation) not in (int, float) or not math.isfinite(self.reputation):
            raise ValueError(
                f"provider {self.provider_id}: reputation must be a finite number, got {self.reputation!r}")
        if not isinstance(self.price_per_input_token, str):
            raise ValueError(f"provider {self.provider_id}: price_per_input_token must be a decimal string, "
                             f"got {self.price_per_input_token!r}")


@dataclass(frozen=True, slots=True)
class HoldingView:
    """One advertised holding: ``provider_id`` holds expert (``layer``, ``expert``) of ``model_id``.

    ``residency`` is "Warm" (memory tier) or "Cold" (disk tier). ``committed_tps`` is demand:
    the rows (tokens) this holder served for the expert per wall second over a rolling minute
    (docs/specification.md, "Metering": hot and repair go by its sum over holders).
    ``capacity_tps`` is the holder's rows per second of compute (the planner ranks by it; 0:
    not measured yet). ``blob_uri`` is the tenzro://blob/ the weights came from, None for an
    expert admitted from an inline payload.
    """

    provider_id: str
    model_id: str
    layer: int
    expert: int
    residency: str
    committed_tps: int
    blob_uri: str | None = None
    capacity_tps: int = 0

    def __post_init__(self) -> None:
        where = f"holding of {self.provider_id} ({self.model_id} layer {self.layer} expert {self.expert})"
        check_id(self.layer, f"{where}: layer")
        check_id(self.expert, f"{where}: expert")
        if self.residency not in RESIDENCIES:
            raise ValueError(f"{where}: residency must be Warm or Cold, got {self.residency!r}")
        if type(self.committed_tps) is not int or self.committed_tps < 0:
            raise ValueError(f"{where}: committed_tps must be a non-negative integer, got {self.committed_tps!r}")
        if type(self.capacity_tps) is not int or self.capacity_tps < 0:
            raise ValueError(f"{where}: capacity_tps must be a non-negative integer, got {self.capacity_tps!r}")


@dataclass(frozen=True, slots=True)
class ReplicationPolicy:
    """The governance numbers the shard map and the planner apply (never hard-coded elsewhere).

    ``min_replication``: distinct providers every expert should have; ``max_replication``:
    most holders that may advertise a hot expert (reported, not enforced here);
    ``hot_threshold_tps``: an expert whose holders' committed_tps sum to at least this is hot;
    ``reputation_floor``: providers whose reputation is below it are never planned on (the
    default, -inf, bars nobody; the policy's may be negative). The checks are the governance
    model's own validators, no stricter, so every policy the admin can approve builds.
    """

    min_replication: int
    max_replication: int
    hot_threshold_tps: float
    reputation_floor: float = float("-inf")

    def __post_init__(self) -> None:
        for name in ("min_replication", "max_replication"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"policy {name} must be an integer >= 1, got {value!r}")
        tps = self.hot_threshold_tps
        if type(tps) not in (int, float) or not math.isfinite(tps) or tps < 0:
            raise ValueError(f"policy hot_threshold_tps must be finite and >= 0, got {tps!r}")
        floor = self.reputation_floor
        if type(floor) not in (int, float) or math.isnan(floor) or floor == math.inf:
            raise ValueError(f"policy reputation_floor must be a number below +inf, got {floor!r}")

    def to_dict(self) -> dict[str, int | float]:
        return {"min_replication": self.min_replication, "max_replication": self.max_replication,
                "hot_threshold_tps": self.hot_threshold_tps}
