"""`tenzro moe load-dense`, `tenzro moe generate` (a whole model over the network) and `tenzro keys`."""

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


def _print_text(obj: CliContext, generation: dict[str, Any]) -> dict[str, Any]:
    """Poll a generation until it ends, printing its text to stdout as the record grows."""
    shown = 0
    while True:
        text = generation.get("text") or ""
        if len(text) > shown:
            click.echo(text[shown:], nl=False)
            shown = len(text)
        if generation["state"] != "running":
            click.echo("")
            return generation
        time.sleep(POLL_S)
        generation = obj.call("tenzro_moeGeneration", {"generation_id": generation["generation_id"], "steps": False})


@moe.command("generate")
@click.option("--model", required=True)
@click.option("--prompt-ids", default=None, callback=lambda c, p, v: None if v is None else _token_ids(c, p, v),
              help="Comma-separated token ids, e.g. 1,2,3.")
@click.option("--prompt", default=None, help="The prompt as text (the model's tokenizer encodes it).")
@click.option("--chat", default=None, help="One user turn, through the model's chat template.")
@click.option("--max-new-tokens", default=16, show_default=True, type=click.IntRange(min=1))
@click.option("--temperature", type=click.FloatRange(0.0, 2.0), default=None,
              help="0 (the default without any sampling option) is greedy.")
@click.option("--top-p", type=click.FloatRange(0.0, 1.0, min_open=True), default=None)
@click.option("--top-k", type=click.IntRange(min=0), default=None)
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=None, help="The same seed repeats the tokens.")
@click.option("--stop", multiple=True, help="A string that ends the text (repeatable, up to 4).")
@click.option("--allow-partial", is_flag=True,
              help="Renormalize away the gate mass of experts no holder served, instead of failing.")
@click.option("--wire", type=click.Choice(["q8_0", "f32"]), default=None,
              help="Activation codec on the wire (default: the node's, Q8_0 first).")
@click.option("--no-stop-at-eos", is_flag=True, help="Generate all --max-new-tokens even past an end-of-sequence.")
@click.option("--steps", "show_steps", is_flag=True, help="Print each step's per-layer fan-out too.")
@click.option("--json", "as_json", is_flag=True, help="With --prompt or --chat: the record as JSON, not the text.")
@click.pass_obj
def generate(obj: CliContext, model: str, prompt_ids: list[int] | None, prompt: str | None, chat: str | None,
             max_new_tokens: int, temperature: float | None, top_p: float | None, top_k: int | None,
             seed: int | None, stop: tuple[str, ...], allow_partial: bool, wire: str | None, no_stop_at_eos: bool,
             show_steps: bool, as_json: bool) -> None:
    """Generate over the network: token ids or text in (--prompt-ids, --prompt, --chat), tokens and text out.

    Greedy unless a sampling option is given. With text in, the text is printed as it arrives."""
    given = [name for name, value in (("--prompt-ids", prompt_ids), ("--prompt", prompt), ("--chat", chat))
             if value is not None]
    if len(given) != 1:
        raise click.UsageError("give exactly one of --prompt-ids, --prompt and --chat")
    sampling = {k: v for k, v in (("temperature", temperature), ("top_p", top_p), ("top_k", top_k), ("seed", seed))
                if v is not None}
    params = {"model_id": model, "max_new_tokens": max_new_tokens, "allow_partial": allow_partial,
              "stop_at_eos": not no_stop_at_eos, "wait": False, **({"wire": wire} if wire else {}),
              **({"prompt_ids": prompt_ids} if prompt_ids is not None else {}),
              **({"prompt": prompt} if prompt is not None else {}),
              **({"messages": [{"role": "user", "content": chat}]} if chat is not None else {}),
              **({"sampling": sampling} if sampling else {}), **({"stop": list(stop)} if stop else {})}
    started = obj.call("tenzro_moeGenerate", params)
    text_mode = prompt_ids is None and not as_json
    generation = _print_text(obj, started) if text_mode else _follow(obj, started)
    if show_steps:  # polled without them
        generation = obj.call("tenzro_moeGeneration", {"generation_id": generation["generation_id"]})
    else:
        generation.pop("steps", None)
    if text_mode:
        rate = generation.get("decode_tokens_per_s")
        click.echo(f"[{len(generation['tokens'])} tokens, {generation.get('finish_reason')}, "
                   f"TTFT {generation.get('ttft_ms')} ms, {rate} tokens/s]", err=True)
    else:
        print_json(generation)
    if generation["state"] == "failed":
        error = generation["error"] or {}
        click.echo(f"tenzro: generation {generation['generation_id']} failed after {len(generation['tokens'])} "
                   f"tokens: {error.get('reason')}: {error.get('message')}", err=True)
        sys.exit(1)


@click.group()
def keys() -> None:
    """Client keys of the OpenAI-compatible API under /v1 (docs/openai.md)."""


@keys.command("create")
@click.option("--name", required=True, help="Who or what the key is for.")
@click.option("--requests-per-minute", type=click.IntRange(min=0), default=0, show_default=True,
              help="0: the node's TENZRO_API_KEY_REQUESTS_PER_MINUTE.")
@click.pass_obj
def keys_create(obj: CliContext, name: str, requests_per_minute: int) -> None:
    """Make a key; its secret is printed this once."""
    print_json(obj.call("tenzro_keysCreate", {"name": name, "requests_per_minute": requests_per_minute}))


@keys.command("list")
@click.pass_obj
def keys_list(obj: CliContext) -> None:
    """Every key (never its secret) and what it used."""
    print_json(obj.call("tenzro_keysList", {}))


@keys.command("revoke")
@click.argument("prefix")
@click.pass_obj
def keys_revoke(obj: CliContext, prefix: str) -> None:
    """Revoke the key with this prefix (as `keys list` shows it): its next request gets 401."""
    print_json(obj.call("tenzro_keysRevoke", {"prefix": prefix}))
