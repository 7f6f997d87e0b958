"""`tenzro moe load-dense` and `tenzro moe generate`: a whole model over the network."""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from cli.context import CliContext, print_json
from cli.moe import moe

POLL_S = 0.2


def _token_ids(_ctx: click.Context, _param: click.Parameter, value: str) -> list[int]:
    try:
        ids = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of token ids, e.g. 1,2,3") from None
    if not ids or any(i < 0 for i in ids):
        raise click.BadParameter("give at least one token id, none negative")
    return ids


@moe.command("load-dense")
@click.option("--model", required=True)
@click.option("--checkpoint", default=None, help="Checkpoint folder or http(s) URL (default: the catalog's).")
@click.pass_obj
def load_dense(obj: CliContext, model: str, checkpoint: str | None) -> None:
    """Load a model's non-expert tensors and its gates into this router (ranged reads)."""
    print_json(obj.call("tenzro_moeLoadDense", {"model_id": model, "checkpoint": checkpoint}))


def _follow(obj: CliContext, generation: dict[str, Any]) -> dict[str, Any]:
    """Poll a generation until it ends; a progress bar of new tokens on stderr on a terminal."""
    bar = (click.progressbar(length=generation["max_new_tokens"], label=f"generate {generation['generation_id'][:8]}",
                             file=sys.stderr, show_pos=True) if sys.stderr.isatty() else None)
    shown = 0
    try:
        while True:
            done = len(generation["tokens"])
            if bar is not None and done > shown:
                bar.label = f"generate {generation['generation_id'][:8]} ({generation['tokens'][-1]})"
                bar.update(done - shown)
                shown = done
            if generation["state"] != "running":
                return generation
            time.sleep(POLL_S)
            generation = obj.call("tenzro_moeGeneration", {"generation_id": generation["generation_id"],
                                                           "steps": False})
    finally:
        if bar is not None:
            bar.render_finish()


@moe.command("generate")
@click.option("--model", required=True)
@click.option("--prompt-ids", required=True, callback=_token_ids, help="Comma-separated token ids, e.g. 1,2,3.")
@click.option("--max-new-tokens", default=16, show_default=True, type=click.IntRange(min=1))
@click.option("--allow-partial", is_flag=True,
              help="Renormalize away the gate mass of experts no holder served, instead of failing.")
@click.option("--wire", type=click.Choice(["q8_0", "f32"]), default=None,
              help="Activation codec on the wire (default: the node's, Q8_0 first).")
@click.option("--no-stop-at-eos", is_flag=True, help="Generate all --max-new-tokens even past an end-of-sequence.")
@click.option("--steps", "show_steps", is_flag=True, help="Print each step's per-layer fan-out too.")
@click.pass_obj
def generate(obj: CliContext, model: str, prompt_ids: list[int], max_new_tokens: int, allow_partial: bool,
             wire: str | None, no_stop_at_eos: bool, show_steps: bool) -> None:
    """Greedy generation: token ids in, token ids out (the tokenizer is yours)."""
    params = {"model_id": model, "prompt_ids": prompt_ids, "max_new_tokens": max_new_tokens,
              "allow_partial": allow_partial, "stop_at_eos": not no_stop_at_eos, "wait": False,
              **({"wire": wire} if wire else {})}
    generation = _follow(obj, obj.call("tenzro_moeGenerate", params))
    if show_steps:  # polled without them
        generation = obj.call("tenzro_moeGeneration", {"generation_id": generation["generation_id"]})
    else:
        generation.pop("steps", None)
    print_json(generation)
    if generation["state"] == "failed":
        error = generation["error"] or {}
        click.echo(f"tenzro: generation {generation['generation_id']} failed after {len(generation['tokens'])} "
                   f"tokens: {error.get('reason')}: {error.get('message')}", err=True)
        sys.exit(1)
