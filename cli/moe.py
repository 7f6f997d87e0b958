"""`tenzro moe …`: the operator commands (the README's quick start walks through them)."""

from __future__ import annotations

import base64
import ipaddress
import json
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click

from cli.client import NodeError
from cli.context import CliContext, fail, print_json
from cli.names import forward_summary, provider_names, with_provider_names


@click.group()
def moe() -> None:
    """Operate the node's Mixture-of-Experts runtime (the README's quick start)."""


@moe.command("catalog-shape")
@click.option("--model", required=True, help="Catalog model id, e.g. qwen3.5-397b-a17b.")
@click.option("--checkpoint", default=None, help="For a model not in the catalog: folder or URL with config.json.")
@click.pass_obj
def catalog_shape(obj: CliContext, model: str, checkpoint: str | None) -> None:
    """Experts, active per token and layer layout of a catalog model."""
    print_json(obj.call("tenzro_moeCatalogShape", {"model": model, "checkpoint": checkpoint}))


def _wait_for_job(obj: CliContext, job: dict[str, Any]) -> dict[str, Any]:
    """Poll a prepare job until it ends; a progress bar on stderr when attached to a terminal."""
    job_id, total = job["job_id"], job["progress"]["total"]
    show = sys.stderr.isatty()
    bar = click.progressbar(length=total, label=f"prepare {job_id[:8]}", file=sys.stderr) if show else None
    shown = 0
    try:
        while True:
            done = job["progress"]["done"]
            if bar is not None and done > shown:
                bar.update(done - shown)
                shown = done
            if job["state"] in ("done", "failed"):
                return job
            time.sleep(0.5)
            job = obj.call("tenzro_moePrepareStatus", {"job_id": job_id})
    finally:
        if bar is not None:
            bar.render_finish()


def _finish(job: dict[str, Any]) -> None:
    print_json(job)
    if job["state"] == "failed":
        click.echo(f"tenzro: prepare job {job['job_id']} failed: {job['error']['reason']}: {job['error']['message']}",
                   err=True)
        sys.exit(1)


@moe.command("prepare-experts")
@click.option("--model-id", required=True)
@click.option("--layer", required=True, type=click.IntRange(min=0))
@click.option("--experts", default=None,
              help="Comma-separated expert ids, e.g. 1,2,5 (with --dense-slices: slice ids, default all).")
@click.option("--dense-slices", type=click.IntRange(1, 1024), default=None,
              help="Cut a dense (non-MoE) layer into N d_ff slices, published as experts 0..N-1 with a dense gate.")
@click.option("--quant", default=None, help="Preset: q4_k_m, q8_0, q4_k, q6_k (omit both for dense f32). "
              "Experts the checkpoint stores as MXFP4 (gpt-oss) stay MXFP4 whatever is asked.")
@click.option("--quant-json", default=None, help='Per projection, e.g. {"gate":"q4_k","up":"q4_k","down":"q6_k"}.')
@click.option("--checkpoint", default=None, help="Checkpoint folder or http(s) URL (default: the catalog's).")
@click.option("--wait", is_flag=True, help="Wait for the job, with a progress bar on a terminal.")
@click.pass_obj
def prepare_experts(obj: CliContext, model_id: str, layer: int, experts: str | None, dense_slices: int | None,
                    quant: str | None, quant_json: str | None, checkpoint: str | None, wait: bool) -> None:
    """Slice a layer's experts (or a dense layer's d_ff slices) out of a checkpoint, block-quantize and publish
    them as blobs."""
    if quant and quant_json:
        raise click.UsageError("give --quant or --quant-json, not both")
    if experts is None and dense_slices is None:
        raise click.UsageError("give --experts (an MoE layer), --dense-slices (a dense layer), or both")
    expert_ids = None
    if experts is not None:
        try:
            expert_ids = [int(e) for e in experts.split(",") if e.strip()]
        except ValueError as exc:
            raise click.BadParameter(f"not a comma-separated list of integers: {experts!r}",
                                     param_hint="--experts") from exc
    quant_value: Any = quant
    if quant_json:
        try:
            quant_value = json.loads(quant_json)
        except json.JSONDecodeError as exc:
            raise click.BadParameter(f"not JSON: {exc}", param_hint="--quant-json") from exc
    # options left unset (None) are not sent (cli/client.py)
    job = obj.call("tenzro_moePrepareExperts", {"model_id": model_id, "layer": layer, "experts": expert_ids,
                                                "dense_slices": dense_slices, "quant": quant_value,
                                                "checkpoint": checkpoint})
    _finish(_wait_for_job(obj, job) if wait else job)


@moe.command("prepare-status")
@click.option("--job-id", required=True)
@click.option("--wait", is_flag=True, help="Wait for the job to end, with a progress bar on a terminal.")
@click.pass_obj
def prepare_status(obj: CliContext, job_id: str, wait: bool) -> None:
    """Progress of a prepare job and the tenzro://blob/ URIs it published."""
    job = obj.call("tenzro_moePrepareStatus", {"job_id": job_id})
    _finish(_wait_for_job(obj, job) if wait else job)


# A payload from this host's disk: a node on this host reads the file itself (no copy through a
# request body, whose base64 grows it by a third and whose size TENZRO_RPC_MAX_BYTES caps: a 48 MiB
# f32 expert did not fit), any other node gets it inline.
_READ_BY_NODE = {"file_not_found", "unreadable_file", "not_a_file"}


def _node_on_this_host(node_url: str) -> bool:
    host = urlsplit(node_url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _inline(file_: Path) -> dict[str, str]:
    try:
        data = file_.read_bytes()
    except OSError as exc:
        raise click.BadParameter(f"cannot read {file_}: {exc.strerror}", param_hint="--file") from exc
    return {"payload": base64.b64encode(data).decode("ascii")}


def _load(obj: CliContext, method: str, ids: dict[str, Any], file_: str | None, path: str | None,
          blob: str | None) -> Any:
    """Call a load method with the payload the operator named: --file (read here), --path (read by
    the node, on its own disk) or --blob (fetched by the node)."""
    if sum(source is not None for source in (file_, path, blob)) != 1:
        raise click.UsageError("give exactly one of --file, --path or --blob")
    if file_ is None:
        return obj.call(method, {**ids, "path": path, "blob_uri": blob})
    local = Path(file_)
    if not local.is_file():
        raise click.BadParameter(f"{file_} is not a readable file", param_hint="--file")
    client = obj.client()
    try:
        if _node_on_this_host(obj.node):
            try:
                return client.call(method, {**ids, "path": str(local.resolve())})
            except NodeError as exc:
                if exc.reason not in _READ_BY_NODE:
                    raise
                # the node answers on loopback but sees another disk (a container, a tunnel): send it
        return client.call(method, {**ids, **_inline(local)})
    except NodeError as exc:
        if exc.reason == "payload_too_large":
            fail(f"{exc}; {file_} ({local.stat().st_size} bytes, a third more as base64) is too large to send "
                 "inline: copy it to the node's host and pass --path, or publish it as a blob (--blob)")
        fail(str(exc))


@moe.command("load-expert")
@click.option("--model", required=True)
@click.option("--layer", required=True, type=int)
@click.option("--expert", required=True, type=int)
@click.option("--file", "file_", type=click.Path(dir_okay=False),
              help="Expert payload (safetensors) on this host: a node on this host reads it from disk, another "
                   "gets it inline.")
@click.option("--path", help="Expert payload file on the node's own disk.")
@click.option("--blob", help="tenzro://blob/<hash> to fetch and load.")
@click.pass_obj
def load_expert(obj: CliContext, model: str, layer: int, expert: int, file_: str | None, path: str | None,
                blob: str | None) -> None:
    """Load one expert's FFN weights into the node's runtime (docs/formats.md: writing a payload)."""
    ids = {"model_id": model, "layer": layer, "expert": expert}
    print_json(_load(obj, "tenzro_moeExpertLoad", ids, file_, path, blob))


@moe.command("load-gate")
@click.option("--model", required=True)
@click.option("--layer", required=True, type=int)
@click.option("--file", "file_", type=click.Path(dir_okay=False),
              help="Gate payload (safetensors) on this host: a node on this host reads it from disk, another "
                   "gets it inline.")
@click.option("--path", help="Gate payload file on the node's own disk.")
@click.option("--blob", help="tenzro://blob/<hash> to fetch and load.")
@click.pass_obj
def load_gate(obj: CliContext, model: str, layer: int, file_: str | None, path: str | None,
              blob: str | None) -> None:
    """Load a layer's gating network."""
    print_json(_load(obj, "tenzro_moeGateLoad", {"model_id": model, "layer": layer}, file_, path, blob))


@moe.command("unload-expert")
@click.option("--model", required=True)
@click.option("--layer", required=True, type=int)
@click.option("--expert", required=True, type=int)
@click.pass_obj
def unload_expert(obj: CliContext, model: str, layer: int, expert: int) -> None:
    """Forget an expert (memory and disk tier)."""
    print_json(obj.call("tenzro_moeExpertUnload", {"model_id": model, "layer": layer, "expert": expert}))


@moe.command("unload-gate")
@click.option("--model", required=True)
@click.option("--layer", required=True, type=int)
@click.pass_obj
def unload_gate(obj: CliContext, model: str, layer: int) -> None:
    """Forget a layer's gate."""
    print_json(obj.call("tenzro_moeGateUnload", {"model_id": model, "layer": layer}))


@moe.command("status")
@click.pass_obj
def status(obj: CliContext) -> None:
    """Resident experts and gates: tier, bytes, memory budget, compute backend."""
    print_json(obj.call("tenzro_moeExpertStatus"))


@moe.command("shard-map")
@click.option("--model", required=True)
@click.pass_obj
def shard_map(obj: CliContext, model: str) -> None:
    """Network-wide coverage, replication, hot and under-replicated experts."""
    print_json(obj.call("tenzro_moeShardMap", {"model_id": model}))


@moe.command("plan-dispatch")
@click.option("--model", required=True)
@click.option("--routings", required=True, type=click.Path(dir_okay=False, exists=True),
              help="JSON file: [{token_index, experts: [{layer, expert}]}].")
@click.option("--allow-cold", is_flag=True, help="Plan on Cold (disk-tier) holders when no Warm one exists.")
@click.pass_obj
def plan_dispatch(obj: CliContext, model: str, routings: str, allow_cold: bool) -> None:
    """Per-holder batches the planner would dispatch for a routing."""
    try:
        decisions = json.loads(Path(routings).read_text())
    except (OSError, ValueError) as exc:
        click.echo(f"tenzro: cannot read routings from {routings}: {exc}", err=True)
        sys.exit(1)
    plan = obj.call("tenzro_moePlanDispatch", {"model_id": model, "routings": decisions, "allow_cold": allow_cold})
    print_json(with_provider_names(plan, provider_names(obj)))


@moe.command("forward")
@click.option("--model", required=True)
@click.option("--layer", default=0, show_default=True, type=int)
@click.option("--hidden", required=True, type=click.Path(dir_okay=False),
              help="Raw little-endian f32 [tokens, d_model].")
@click.option("--d-model", required=True, type=click.IntRange(min=1))
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Where to write the combined f32 output.")
@click.option("--allow-partial", is_flag=True,
              help="Accept a renormalized partial result (listed under missing) instead of failing closed.")
@click.option("--allow-cold", is_flag=True, help="Plan on Cold (disk-tier) holders when no Warm one is left.")
@click.option("--min-gate-mass", type=click.FloatRange(0.0, 1.0), default=None,
              help="With --allow-partial: a token keeping less than this share of its gate mass is an error.")
@click.option("--wire", type=click.Choice(["q8_0", "f32"]), default=None,
              help="Activation codec on the wire (default: the node's, Q8_0 first; f32 for exact rows).")
@click.pass_obj
def forward(obj: CliContext, model: str, layer: int, hidden: str, d_model: int, out: str, allow_partial: bool,
            allow_cold: bool, min_gate_mass: float | None, wire: str | None) -> None:
    """Distributed layer forward: gate here, dispatch to the holders, gate-weighted combine."""
    try:
        data = Path(hidden).read_bytes()
    except OSError as exc:
        raise click.BadParameter(f"cannot read {hidden}: {exc.strerror}", param_hint="--hidden") from exc
    if len(data) % (4 * d_model):
        raise click.BadParameter(
            f"{hidden} has {len(data)} bytes, not whole rows of {d_model} f32 ({4 * d_model} bytes each)",
            param_hint="--hidden")
    params = {"model_id": model, "layer": layer, "d_model": d_model, "allow_partial": allow_partial,
              "allow_cold": allow_cold, "hidden": base64.b64encode(data).decode("ascii")}
    if min_gate_mass is not None:
        params["min_gate_mass"] = min_gate_mass
    if wire is not None:
        params["wire"] = wire
    result = obj.call("tenzro_moeForward", params)
    output = base64.b64decode(result.pop("output"))
    Path(out).write_bytes(output)
    names = provider_names(obj)
    print_json(with_provider_names({**result, "out": out, "bytes": len(output)}, names))
    click.echo(forward_summary(result, names), err=True)


@moe.command("receipts")
@click.option("--model", default=None, help="Only this model's receipts.")
@click.option("--holder", default=None, help="Only receipts signed by this provider id.")
@click.option("--limit", default=50, show_default=True, type=int)
@click.pass_obj
def receipts(obj: CliContext, model: str | None, holder: str | None, limit: int) -> None:
    """Receipts this router kept in full (1 in N verified remote batches), newest first."""
    print_json(obj.call("tenzro_moeListReceipts", {"model_id": model, "provider_id": holder, "limit": limit}))


@moe.command("dispute")
@click.option("--receipt-id", required=True, type=int, help="An id from `tenzro moe receipts`.")
@click.option("--wait", is_flag=True, help="Wait for the verdict (the re-execution runs in the Celery worker).")
@click.pass_obj
def dispute(obj: CliContext, receipt_id: int, wait: bool) -> None:
    """Re-execute a kept receipt against a copy of the expert: dismissed, or upheld (the signer is penalized)."""
    answer = obj.call("tenzro_moeDisputeReceipt", {"receipt_id": receipt_id})
    while wait and answer["state"] == "pending":
        time.sleep(1.0)
        answer = obj.call("tenzro_moeDisputeReceipt", {"receipt_id": receipt_id})
    print_json(answer)


@moe.command("repair")
@click.option("--run", "run_now", is_flag=True, help="Queue a repair pass now (operator token), then list.")
@click.option("--limit", default=10, show_default=True, type=int)
@click.pass_obj
def repair(obj: CliContext, run_now: bool, limit: int) -> None:
    """Recent repair passes: what each considered, fetched, skipped and why; when the next is due."""
    if run_now:
        obj.call("tenzro_moeRepairRun")
    print_json(obj.call("tenzro_moeRepairPasses", {"limit": limit}))
