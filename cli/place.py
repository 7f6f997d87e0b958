"""`tenzro moe place`: put every expert of finished prepare jobs on the operator's nodes in one command.

The jobs are read from --node; each node in --nodes is asked (`tenzro_moePlace`, its own operator
door and token) to load its share of the same placement over the same providers, so the nodes
agree on who holds what without talking to each other (docs/protocol.md, "Placement").
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from cli.client import NodeClient, NodeError, operator_token
from cli.context import CliContext, print_json
from cli.moe import moe
from core.env import OPERATOR_TOKEN_FILE


def _node(obj: CliContext, spec: str) -> NodeClient:
    """URL or URL=DATA_DIR (the token is that data dir's); else the CLI's own token."""
    url, _, folder = spec.partition("=")
    if not folder:
        return NodeClient(url, token=operator_token(obj.token))
    token_file = Path(folder) / OPERATOR_TOKEN_FILE
    if not token_file.exists():
        raise click.BadParameter(f"{token_file} does not exist: is {folder} that node's data dir?",
                                 param_hint="--nodes")
    return NodeClient(url, token=token_file.read_text().strip())


def _call(client: NodeClient, method: str, params: dict[str, Any] | None = None) -> Any:
    try:
        return client.call(method, params)
    except NodeError as exc:
        click.echo(f"tenzro: {client.node_url}: {exc}", err=True)
        sys.exit(1)


def _pieces(client: NodeClient, job_ids: list[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    experts, gates = [], []
    for job_id in job_ids:
        job = _call(client, "tenzro_moePrepareStatus", {"job_id": job_id})
        if job["state"] != "done":
            raise click.ClickException(f"prepare job {job_id} is {job['state']}: wait for it "
                                       f"(tenzro moe prepare-status --job-id {job_id} --wait)")
        where = {"model_id": job["model_id"], "layer": job["layer"]}
        experts += [{**where, "expert": e["expert"], "blob_uri": e["blob_uri"]} for e in job["experts"]]
        if job.get("gate"):
            gates.append({**where, "blob_uri": job["gate"]["blob_uri"]})
    return experts, gates


@moe.command("place")
@click.option("--job", "jobs", multiple=True, required=True, help="A finished prepare job of --node (repeatable).")
@click.option("--replication", type=click.IntRange(1, 64), default=None,
              help="Holders per expert (default: the policy's min_replication).")
@click.option("--nodes", default=None, help="Comma-separated nodes to place on, each URL or URL=DATA_DIR (whose "
                                            "operator token to use); default: --node alone.")
@click.option("--routers", default=None, help="Comma-separated node URLs that load the gates (default: --node).")
@click.option("--json", "as_json", is_flag=True, help="Print every node's answer as JSON instead of a table.")
@click.pass_obj
def place(obj: CliContext, jobs: tuple[str, ...], replication: int | None, nodes: str | None, routers: str | None,
          as_json: bool) -> None:
    """Load every expert of finished prepare jobs onto the nodes by repair's rendezvous rule (idempotent)."""
    home = obj.client()
    experts, gates = _pieces(home, list(jobs))
    clients = [_node(obj, spec.strip()) for spec in (nodes or obj.node).split(",") if spec.strip()]
    router_urls = {u.strip().rstrip("/") for u in (routers or obj.node).split(",") if u.strip()}
    ids = {c.node_url: _call(c, "tenzro_nodeInfo")["provider_id"] for c in clients}
    answers = [
        _call(c, "tenzro_moePlace", {"experts": experts, "gates": gates, "providers": sorted(ids.values()),
                                     "replication": replication, "load_gates": c.node_url in router_urls})
        for c in clients
    ]
    if as_json:
        print_json(answers)
    else:
        urls = {pid: url for url, pid in ids.items()}
        _print_table(answers, urls)
        for idle in answers[0].get("idle", []):  # a node of an older version does not say
            named = ", ".join(urls.get(p, p[:16]) for p in idle["providers"])
            click.echo(f"tenzro: this placement puts no expert of {idle['model_id']} on {named}; its repair adds "
                       "copies only on providers holding part of it (docs/operations.md, \"Repair\")", err=True)
    failed = [r for a in answers for r in (*a["rows"], *a["gates"]) if r["outcome"] in ("failed", "skipped")]
    if failed:
        click.echo(f"tenzro: {len(failed)} loads failed: {failed[0].get('why')}", err=True)
        sys.exit(1)


def _print_table(answers: list[dict[str, Any]], urls: dict[str, str]) -> None:
    """One line per expert: its holders (node URL and what happened there), then the gates."""
    outcome: dict[tuple[str, int, int, str], str] = {}
    for answer in answers:
        for row in answer["rows"]:
            key = (row["model_id"], row["layer"], row["expert"], row["provider"])
            if row["outcome"] != "elsewhere" or key not in outcome:
                outcome[key] = row["outcome"]
    first = answers[0]
    click.echo(f"replication {first['replication']} over {len(first['providers'])} providers "
               f"(asked {first['requested_replication']})")
    click.echo(f"{'model':<24} {'layer':>5} {'expert':>6}  holders")
    for row in first["rows"]:
        if row["rank"] != 0:
            continue
        holders = [f"{urls.get(p, p[:16])} ({o})" for (m, la, e, p), o in outcome.items()
                   if (m, la, e) == (row["model_id"], row["layer"], row["expert"])]
        click.echo(f"{row['model_id']:<24} {row['layer']:>5} {row['expert']:>6}  {', '.join(holders)}")
    for answer in answers:
        for gate in answer["gates"]:
            click.echo(f"{gate['model_id']:<24} {gate['layer']:>5} {'gate':>6}  {urls.get(answer['provider_id'])} "
                       f"({gate['outcome']})")
