"""Routing decisions as JSON (docs/specification.md) turned into flat pair arrays, checked.

Pure module (no Django). Input: ``[{token_index, experts: [{layer, expert}, ...]}, ...]``.
Output: one row per (token, layer, expert) pair, tokens ascending and, within a token, its
experts in the order given (the order its gate weights come in)::

    tokens   (n_pairs,) int64   non-decreasing
    layers   (n_pairs,) int64
    experts  (n_pairs,) int64
    listed   (n_tokens,) int64  every token_index, ascending, including tokens with no experts

Rules: token_index, layer and expert are ints in [0, 2**31) (bool and 3.0 are refused, as
the JSON-RPC schema refuses them); a token_index appears once; keys other than those named
are ignored. Duplicate (layer, expert) within one token are refused by the planner, which
sees the pairs anyway. Every refusal is a PlanInputError (a ValueError, reason
invalid_input) naming the routing entry and token.

The common case is checked in bulk (a type set over each column, C-level loops); only when
that fails does a slow walk find the first bad entry to name it.
"""

from __future__ import annotations

from itertools import chain
from operator import itemgetter
from typing import Any

import numpy as np

from core.errors import InvalidInput
from core.shardmap.gossip_view import MAX_ID


class PlanInputError(InvalidInput, ValueError):
    """Routings (or pair arrays) the planner refuses; the message names the token."""

    reason = "invalid_input"


_LAYER, _EXPERT, _TOKEN, _EXPERTS = (itemgetter(k) for k in ("layer", "expert", "token_index", "experts"))


def parse_routings(routings: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(tokens, layers, experts, listed) from the routings of docs/specification.md (see the module docstring)."""
    if not isinstance(routings, list | tuple):
        raise PlanInputError(f"routings must be a list, got {type(routings).__name__}")
    try:
        token_list = list(map(_TOKEN, routings))
        expert_lists = list(map(_EXPERTS, routings))
        if not _all_ints(token_list) or not set(map(type, expert_lists)) <= {list, tuple}:
            raise TypeError
        tokens = _ints(token_list)
        order = np.argsort(tokens, kind="stable")
        listed = tokens[order]
        expert_lists = [expert_lists[i] for i in order.tolist()]
        counts = np.fromiter(map(len, expert_lists), dtype=np.int64, count=len(expert_lists))
        flat = list(chain.from_iterable(expert_lists))
        layer_list, expert_list = list(map(_LAYER, flat)), list(map(_EXPERT, flat))
        if not _all_ints(layer_list) or not _all_ints(expert_list):
            raise TypeError
        layers, experts = _ints(layer_list), _ints(expert_list)
    except (KeyError, TypeError, ValueError, OverflowError):
        _explain(routings)
        raise PlanInputError("routings are malformed") from None  # _explain names the entry; not reached

    if len(listed) > 1 and (same := np.flatnonzero(listed[1:] == listed[:-1])).size:
        raise PlanInputError(f"token_index {int(listed[same[0]])} appears in more than one routing entry")
    return np.repeat(listed, counts), layers, experts, listed


def _all_ints(values: list[Any]) -> bool:
    return set(map(type, values)) <= {int}  # exact type: bool (a subclass of int) is refused


def _ints(values: list[int]) -> np.ndarray:
    """int64 array of already type-checked ints; ValueError when one is out of [0, 2**31)."""
    array = np.array(values, dtype=np.int64)  # OverflowError beyond int64, handled by the caller
    if array.size and (array.min() < 0 or array.max() >= MAX_ID):
        raise ValueError  # _explain names it
    return array


def _explain(routings: list[Any] | tuple[Any, ...]) -> None:
    """Raise a PlanInputError naming the first malformed entry (the slow path)."""
    for n, entry in enumerate(routings):
        if not isinstance(entry, dict):
            raise PlanInputError(f"routings[{n}] must be an object, got {type(entry).__name__}")
        if "token_index" not in entry:
            raise PlanInputError(f"routings[{n}] has no token_index")
        token = entry["token_index"]
        _check(token, f"routings[{n}].token_index")
        experts = entry.get("experts")
        if not isinstance(experts, list | tuple):
            raise PlanInputError(f"token {token} (routings[{n}]): experts must be a list, got {type(experts).__name__}")
        for m, item in enumerate(experts):
            where = f"token {token} (routings[{n}]) experts[{m}]"
            if not isinstance(item, dict):
                raise PlanInputError(f"{where} must be an object with layer and expert, got {type(item).__name__}")
            for key in ("layer", "expert"):
                if key not in item:
                    raise PlanInputError(f"{where} has no {key}")
                _check(item[key], f"{where}.{key}")


def _check(value: Any, where: str) -> None:
    if type(value) is not int or not 0 <= value < MAX_ID:
        raise PlanInputError(f"{where} must be an integer in [0, 2**31), got {value!r}")
