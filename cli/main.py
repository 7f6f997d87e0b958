"""The `tenzro` command: `tenzro node …` runs a node, `tenzro moe …` operates one over JSON-RPC."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from cli.client import DEFAULT_NODE
from cli.context import CliContext, print_json
from core.env import (
    DEFAULT_DATA_DIR,
    DEFAULT_HTTP,
    DEFAULT_QUIC,
    DEFAULT_REDIS_URL,
    DEFAULT_ROLES,
)
from core.experts.backend_names import CHOICES as BACKEND_CHOICES
from core.experts.backend_names import GPU_CHOICES

ROLES = ("Replica", "Router", "ExpertHolder", "PrefillDecode", "Prefill", "Decode")


@click.group()
@click.option("--node", envvar="TENZRO_NODE", default=DEFAULT_NODE, show_default=True,
              help="Node HTTP URL (or $TENZRO_NODE).")
@click.option("--token", envvar="TENZRO_OPERATOR_TOKEN", default=None,
              help="Operator token (or $TENZRO_OPERATOR_TOKEN; else read from the local data dir).")
@click.pass_context
def cli(ctx: click.Context, node: str, token: str | None) -> None:
    """Tenzro MoE node: run a node and operate it."""
    ctx.obj = CliContext(node, token)


@cli.group()
def node() -> None:
    """Run this node and read its state."""


def _csv(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


@node.command("run")
@click.option("--http", default=lambda: os.environ.get("TENZRO_HTTP", DEFAULT_HTTP), show_default=DEFAULT_HTTP,
              help="HTTP listen address HOST:PORT.")
@click.option("--quic", default=lambda: os.environ.get("TENZRO_QUIC", DEFAULT_QUIC), show_default=DEFAULT_QUIC,
              help="QUIC listen address HOST:PORT.")
@click.option("--data-dir", default=lambda: os.environ.get("TENZRO_DATA_DIR", DEFAULT_DATA_DIR),
              show_default=DEFAULT_DATA_DIR, help="Key, certificate, database, expert disk tier, blobs.")
@click.option("--peers", default=lambda: os.environ.get("TENZRO_PEERS", ""), help="Comma-separated peer HTTP URLs.")
@click.option("--redis-url", default=lambda: os.environ.get("REDIS_URL", DEFAULT_REDIS_URL),
              show_default=DEFAULT_REDIS_URL, help="Redis for Celery and Channels (one database per node).")
@click.option("--roles", default=lambda: os.environ.get("TENZRO_ROLES", DEFAULT_ROLES), show_default=DEFAULT_ROLES,
              help=f"Comma-separated roles: {', '.join(ROLES)}.")
@click.option("--celery-concurrency", default=1, show_default=True, type=click.IntRange(1, 64),
              help="Celery worker processes (prepare jobs are CPU-bound).")
@click.option("--expert-backend", default=lambda: os.environ.get("TENZRO_EXPERT_BACKEND", "auto"), show_default="auto",
              type=click.Choice(BACKEND_CHOICES, case_sensitive=False),
              help="Compute backend of the expert worker: auto-detect, or force one (a forced GPU backend that "
                   "cannot run stops the start with the reason).")
@click.option("--memory-budget", default=lambda: os.environ.get("TENZRO_MEMORY_BUDGET_BYTES", "0"),
              show_default="0: 60% of the host's memory shared by its nodes",
              help="Memory for experts and dense weights: bytes, or with a K/M/G/T suffix (binary), e.g. 8G. "
                   "More than the host has is refused.")
def node_run(http: str, quic: str, data_dir: str, peers: str, redis_url: str, roles: str,
             celery_concurrency: int, expert_backend: str, memory_budget: str) -> None:
    """Start every process of one node and supervise them until Ctrl-C / SIGTERM."""
    from apps.node.supervisor import NodeOptions, run_node

    role_list = _csv(roles)
    unknown = [r for r in role_list if r not in ROLES]
    if unknown:
        raise click.BadParameter(f"unknown role(s) {', '.join(unknown)}; choose from {', '.join(ROLES)}",
                                 param_hint="--roles")
    budget = _memory_budget(memory_budget)
    expert_backend = expert_backend.lower()
    if expert_backend in GPU_CHOICES:
        _check_device(expert_backend)
    # Children run from the project root, so hand them an absolute data dir.
    path = Path(data_dir).resolve()
    options = NodeOptions(http=http, quic=quic, data_dir=path, peers=_csv(peers), redis_url=redis_url,
                          roles=role_list, celery_concurrency=celery_concurrency, expert_backend=expert_backend,
                          memory_budget_bytes=budget)
    sys.exit(run_node(options))


_SIZE_SUFFIX = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _memory_budget(text: str) -> int:
    """--memory-budget in bytes (0: the default share), refused when malformed or above the host's memory."""
    from core.experts.host_share import check_explicit_budget

    value = text.strip().upper().removesuffix("B").removesuffix("I")
    suffix = value[-1:] if value[-1:] in ("K", "M", "G", "T") else ""
    try:
        budget = int(float(value.removesuffix(suffix)) * _SIZE_SUFFIX[suffix])
    except (ValueError, OverflowError):
        raise click.BadParameter(f"{text!r} is not a size (bytes, or a number with K, M, G or T)",
                                 param_hint="--memory-budget") from None
    if budget < 0:
        raise click.BadParameter(f"{text!r} is negative", param_hint="--memory-budget")
    try:
        check_explicit_budget(budget)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--memory-budget") from None
    return budget


def _check_device(kind: str) -> None:
    """Open and close the forced device before any process starts: a missing driver or library is
    one clear error here rather than an expert worker restarting in a loop."""
    from core.experts.selection import BackendUnavailable, choose_backend

    try:
        choice = choose_backend(choice=kind, device_budget_bytes=1)
    except BackendUnavailable as exc:
        raise click.BadParameter(str(exc), param_hint="--expert-backend") from exc
    choice.backend.close()


@node.command("info")
@click.pass_obj
def node_info(obj: CliContext) -> None:
    """Identity, roles, endpoints and version of the node at --node."""
    print_json(obj.call("tenzro_nodeInfo"))


@node.command("processes")
@click.pass_obj
def node_processes(obj: CliContext) -> None:
    """The node's processes as its supervisor sees them."""
    print_json(obj.call("tenzro_nodeProcesses"))


@node.command("blob-gc")
@click.option("--min-age-s", type=click.FloatRange(min=0), default=None,
              help="Keep blobs younger than this (default: the node's TENZRO_BLOB_GC_MIN_AGE_S).")
@click.pass_obj
def node_blob_gc(obj: CliContext, min_age_s: float | None) -> None:
    """Delete blobs that no holding and no prepare job references."""
    print_json(obj.call("tenzro_blobGc", {"min_age_s": min_age_s}))


@cli.command("rpc")
@click.argument("method")
@click.argument("params", required=False, default="{}")
@click.pass_obj
def rpc(obj: CliContext, method: str, params: str) -> None:
    """Call any JSON-RPC METHOD with PARAMS given as a JSON object."""
    try:
        parsed = json.loads(params)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="PARAMS") from exc
    print_json(obj.call(method, parsed))


from cli import generate as _generate  # noqa: E402  (registers load-dense and generate on moe; has `keys`)
from cli import place as _place  # noqa: E402, F401  (registers place on moe)
from cli.moe import moe  # noqa: E402  (the moe group registers its commands on import)

cli.add_command(moe)
cli.add_command(_generate.keys)


if __name__ == "__main__":
    cli()
