"""Providers as people read them in the CLI's output: the name each one signs into its record next
to its 64-hex id, and a forward's outcome in one line (which holders, which codec, what the hedges
did), so a raced-out stall is not read as an error."""

from __future__ import annotations

from typing import Any

from cli.client import NodeError
from cli.context import CliContext


def provider_names(obj: CliContext) -> dict[str, str]:
    """Provider id -> name from the node's gossip view ({} from a node too old to say)."""
    try:
        providers = obj.client().call("tenzro_networkProviders")["providers"]
    except (NodeError, KeyError, TypeError):
        return {}
    return {p["provider_id"]: p["name"] for p in providers if p.get("name")}


def with_provider_names(value: Any, names: dict[str, str]) -> Any:
    """`value` with `provider_name` beside every `provider` / `provider_id` whose name is known."""
    if isinstance(value, list):
        return [with_provider_names(item, names) for item in value]
    if not isinstance(value, dict):
        return value
    named = {key: with_provider_names(item, names) for key, item in value.items()}
    for key in ("provider", "provider_id"):
        if isinstance(value.get(key), str) and value[key] in names:
            named["provider_name"] = names[value[key]]
    return named


def label(provider_id: str, names: dict[str, str]) -> str:
    name = names.get(provider_id)
    if not name:
        return f"{provider_id[:12]}…"
    return name if name.endswith(provider_id[:6]) else f"{name} ({provider_id[:6]})"


def forward_summary(result: dict[str, Any], names: dict[str, str]) -> str:
    """One line about a forward that answered: rows, time, holders, codecs, hedges, and what each
    failure it survived was (a stall a hedge raced out is the hedge working, not an error)."""
    stats = result.get("stats") or {}
    holders = ", ".join(f"{label(h['provider'], names)} {h['rows']} rows over {h['transport']}"
                        for h in stats.get("holders", []))
    codecs = ", ".join(stats.get("codecs") or []) or "–"
    line = (f"forward {str(stats.get('forward_id', ''))[:12]}: {result.get('tokens')} tokens in "
            f"{stats.get('elapsed_ms', 0):.1f} ms; holders: {holders or 'none'}; wire codecs: {codecs}; "
            f"hedges fired {stats.get('hedges_fired', 0)}, won {stats.get('hedges_won', 0)}")
    survived = []
    for failure in stats.get("failures", []):
        what = ("stalled, raced out by a hedge (the backup answered)" if failure["reason"] == "stalled"
                else f"failed ({failure['reason']}), retried on another holder")
        survived.append(f"{label(failure['provider'], names)} expert {failure['layer']}/{failure['expert']} {what}")
    if result.get("missing"):
        survived.append(f"{len(result['missing'])} (expert, token) pairs unanswered (allow_partial)")
    return line + ("; " + "; ".join(survived) if survived else "")
