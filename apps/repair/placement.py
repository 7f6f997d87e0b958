"""Placing prepared experts on providers (`tenzro_moePlace`): each node loads its own share.

Every node given the same experts and the same provider list computes the same placement
(apps/repair/selection.placement: the first `replication` providers of each expert's rendezvous
order, the order repair uses), so an operator runs place on each of their nodes and each loads
only the rows naming itself; nothing crosses a node's operator door but its own. Rows naming a
provider that is not this node are reported, not loaded: its operator (or, once a copy is
announced, its repair pass) loads them. Idempotent: a held expert or gate is left as it is.
"""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import async_to_sync

from apps.catalog.selectors import prepare_job_get, prepare_job_to_dict
from apps.governance.selectors import policy_active
from apps.node.selectors import node_identity
from apps.providers.selectors import provider_views
from apps.repair.selection import placement
from apps.worker import client as worker
from apps.worker.selectors import worker_status_published
from core.errors import InvalidInput, TenzroError

logger = logging.getLogger("tenzro.repair")
# Loads that fail one after another (blobs nobody serves, a worker that does not answer) end the
# placement's loading: the rest of this node's rows are `skipped`, so a call with thousands of bad
# rows answers in seconds instead of trying each.
FAILURES_IN_A_ROW = 4


def job_pieces(job_ids: list[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(experts [{model_id, layer, expert, blob_uri}], gates [{model_id, layer, blob_uri}]) of finished
    prepare jobs of this node; InvalidInput naming a job that is not done."""
    experts, gates = [], []
    for job_id in job_ids:
        job = prepare_job_to_dict(prepare_job_get(job_id=job_id))
        if job["state"] != "done":
            raise InvalidInput(f"prepare job {job_id} is {job['state']}, not done: place it once it has finished "
                               "(tenzro moe prepare-status --wait)", reason="job_not_done")
        where = {"model_id": job["model_id"], "layer": job["layer"]}
        experts += [{**where, "expert": e["expert"], "blob_uri": e["blob_uri"]} for e in job["experts"]]
        if job.get("gate"):
            gates.append({**where, "blob_uri": job["gate"]["blob_uri"]})
    return experts, gates


def default_providers() -> list[str]:
    """This node and every provider of its gossip view that declares ExpertHolder."""
    me = node_identity().provider_id
    return sorted({me, *(p.provider_id for p in provider_views() if "ExpertHolder" in p.roles)})


def place(*, experts: list[dict[str, Any]], gates: list[dict[str, Any]], providers: list[str] | None,
          replication: int | None, load_gates: bool) -> dict[str, Any]:
    """Load this node's share of `experts` (and `gates` when `load_gates`); the whole placement as rows."""
    me = node_identity().provider_id
    chosen = sorted(set(providers)) if providers else default_providers()
    if me not in chosen:
        raise InvalidInput(f"this node ({me[:16]}…) is not among the providers to place on", reason="not_a_provider")
    wanted = replication or policy_active().min_replication
    copies = min(wanted, len(chosen))
    published = worker_status_published()
    held = {(e["model_id"], e["layer"], e["expert"]) for e in published["experts"]}
    held_gates = {(g["model_id"], g["layer"]) for g in published["gates"]}
    loader = _Loader()
    rows = []
    for piece in sorted(experts, key=lambda p: (p["model_id"], p["layer"], p["expert"])):
        key = (piece["model_id"], piece["layer"], piece["expert"])
        for rank, provider in enumerate(placement(*key, chosen, copies)):
            row = {**piece, "provider": provider, "rank": rank}
            if provider != me:
                rows.append({**row, "outcome": "elsewhere"})
            elif key in held:
                rows.append({**row, "outcome": "held"})
            else:
                rows.append({**row, **loader(worker.expert_load, piece, {"expert": piece["expert"]})})
    gate_rows = []
    for gate in sorted(gates, key=lambda g: (g["model_id"], g["layer"])) if load_gates else ():
        if (gate["model_id"], gate["layer"]) in held_gates:
            gate_rows.append({**gate, "outcome": "held"})
        else:
            gate_rows.append({**gate, **loader(worker.gate_load, gate, {})})
    return {"provider_id": me, "providers": chosen, "replication": copies, "requested_replication": wanted,
            "rows": rows, "gates": gate_rows, "idle": idle_providers(rows, chosen)}


def idle_providers(rows: list[dict[str, Any]], providers: list[str]) -> list[dict[str, Any]]:
    """Per model placed, the providers its placement gives no expert: [{model_id, providers}], only models
    that have some. Repair's candidates for a model are the providers holding some expert of it
    (docs/protocol.md, "Repair selection"), so until such a provider holds part of the model its repair
    never adds a copy there, however hot an expert runs (docs/operations.md, "Repair")."""
    given: dict[str, set[str]] = {}
    for row in rows:
        given.setdefault(row["model_id"], set()).add(row["provider"])
    return [{"model_id": model_id, "providers": left}
            for model_id, holding in sorted(given.items()) if (left := [p for p in providers if p not in holding])]


class _Loader:
    """Loads one piece through the worker; after FAILURES_IN_A_ROW failures in a row, skips the rest."""

    def __init__(self) -> None:
        self.in_a_row, self.last_why = 0, ""

    def __call__(self, call: Any, piece: dict[str, Any], ids: dict[str, Any]) -> dict[str, Any]:
        if self.in_a_row >= FAILURES_IN_A_ROW:
            return {"outcome": "skipped", "why": f"gave up after {FAILURES_IN_A_ROW} failed loads in a row "
                                                 f"(the last: {self.last_why})"}
        try:
            async_to_sync(call)(source={"blob_uri": piece["blob_uri"]},
                                expect={"model_id": piece["model_id"], "layer": piece["layer"], **ids})
        except TenzroError as exc:
            logger.warning("place: %s layer %s %s failed: %s", piece["model_id"], piece["layer"], ids, exc)
            self.in_a_row, self.last_why = self.in_a_row + 1, f"{exc.reason}: {exc.message}"
            return {"outcome": "failed", "why": self.last_why}
        self.in_a_row = 0
        return {"outcome": "loaded"}
