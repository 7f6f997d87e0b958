"""What a `moe/generate` call asks for, checked: the prompt as ids, how to choose tokens, when to stop.

Pure module (no Django). The prompt comes as token ids (`prompt_ids`), as text (`prompt`, encoded
with the model's tokenizer) or as chat messages (`messages`, rendered with its chat template);
`sampling` absent means greedy, as a plain generation has always been; `sampling.use_model_defaults`
fills what the caller left out from the checkpoint's generation_config.json, then OpenAI's defaults
(temperature 1, top_p 1). Every refusal is an InvalidInput naming the param (`details.param`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from apps.generation.sampling import SamplingError, SamplingParams
from apps.generation.text import TextCodec, TextError
from core.errors import InvalidInput
from core.formats.wire import WIRE_CODECS

MAX_STOP_STRINGS, MAX_STOP_CHARS = 4, 200
MAX_MESSAGES, MAX_PROMPT_CHARS = 512, 1_000_000
SAMPLING_FIELDS = tuple(f.name for f in fields(SamplingParams))


@dataclass(frozen=True)
class GenerateRequest:
    prompt_ids: list[int]
    max_new_tokens: int
    sampling: SamplingParams
    stop: list[str] = field(default_factory=list)
    stream: str | None = None  # the stream mailbox the web process reads this generation's events from
    options: dict[str, Any] = field(default_factory=dict)  # allow_partial, wire, stop_at_eos
    deadline_s: float = 600.0  # the longest it may take from the router's receipt, waiting for admission included


def _invalid(param: str, message: str, reason: str = "invalid_input") -> InvalidInput:
    return InvalidInput(message, reason=reason, param=param)


def prompt_ids_of(params: Mapping[str, Any], codec: TextCodec | None, *, vocab: int, limit: int,
                  no_text_reason: str, context: int | None = None) -> list[int]:
    """The prompt's token ids, from exactly one of prompt_ids, prompt and messages; shorter than the
    router's limit and than the model's context (room for one new token at least)."""
    given = [name for name in ("prompt_ids", "prompt", "messages") if params.get(name) is not None]
    if len(given) != 1:
        raise _invalid("prompt", "give exactly one of prompt_ids, prompt (text) and messages (chat)")
    name = given[0]
    if name != "prompt_ids" and codec is None:
        raise _invalid(name, f"this model serves token ids only: {no_text_reason}", reason="text_unavailable")
    if name == "prompt":
        text = params["prompt"]
        if not isinstance(text, str) or not text or len(text) > MAX_PROMPT_CHARS:
            raise _invalid("prompt", f"prompt must be a non-empty string of at most {MAX_PROMPT_CHARS} characters")
        ids = codec.encode(text)  # type: ignore[union-attr]
    elif name == "messages":
        ids = _chat_ids(params["messages"], codec)  # type: ignore[arg-type]
    else:
        ids = token_ids_checked(params["prompt_ids"], "prompt_ids", vocab=vocab)
    if not ids:
        raise _invalid(name, "the prompt is empty: it has no tokens")
    if len(ids) > limit:
        raise _invalid(name, f"the prompt has {len(ids)} tokens, more than this router takes "
                             f"(TENZRO_GENERATE_MAX_PROMPT_TOKENS = {limit})", reason="context_length_exceeded")
    if context is not None and len(ids) >= context:
        raise _invalid(name, f"the prompt has {len(ids)} tokens: it fills the model's context of {context} tokens "
                             "(max_position_embeddings)", reason="context_length_exceeded")
    return ids


def token_ids_checked(ids: Any, name: str, *, vocab: int) -> list[int]:
    """`ids` when it is a list of this model's token ids; InvalidInput naming the first that is not."""
    if not isinstance(ids, list):
        raise _invalid(name, f"param {name!r} must be a list of token ids")
    for i, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
            raise _invalid(name, f"{name}[{i}] = {t!r} is not a token id of this model (0 … {vocab - 1})",
                           reason="token_out_of_range")
    return ids


def _chat_ids(messages: Any, codec: TextCodec) -> list[int]:
    if not isinstance(messages, list) or not messages or len(messages) > MAX_MESSAGES:
        raise _invalid("messages", f"messages must be a list of 1 to {MAX_MESSAGES} messages")
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str) \
                or not isinstance(message.get("content"), str):
            raise _invalid(f"messages[{i}]", f"messages[{i}] must be an object with a string role and content")
    try:
        return codec.chat_ids(messages)
    except TextError as exc:
        raise _invalid("messages", str(exc), reason=exc.reason) from exc


def sampling_of(raw: Any, model_defaults: Mapping[str, Any]) -> SamplingParams:
    """SamplingParams from the call's `sampling` (absent: greedy)."""
    if raw is None:
        return SamplingParams(temperature=0.0)
    if not isinstance(raw, Mapping):
        raise _invalid("sampling", "sampling must be an object")
    unknown = set(raw) - {*SAMPLING_FIELDS, "use_model_defaults"}
    if unknown:
        raise _invalid(sorted(unknown)[0], f"unknown sampling parameter(s): {sorted(unknown)}")
    given = {k: v for k, v in raw.items() if k in SAMPLING_FIELDS and v is not None}
    if raw.get("use_model_defaults"):
        given = {**{k: v for k, v in model_defaults.items() if k in SAMPLING_FIELDS}, **given}
    try:
        return SamplingParams(**given)
    except SamplingError as exc:
        raise _invalid(exc.param, str(exc)) from exc


def stop_of(raw: Any) -> list[str]:
    if raw is None:
        return []
    stops = [raw] if isinstance(raw, str) else raw
    if not isinstance(stops, list) or len(stops) > MAX_STOP_STRINGS \
            or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in stops):
        raise _invalid("stop", f"stop must be a string or a list of at most {MAX_STOP_STRINGS} non-empty strings "
                               f"of at most {MAX_STOP_CHARS} characters")
    return stops


def options_of(params: Mapping[str, Any]) -> dict[str, Any]:
    allow_partial, stop_at_eos = params.get("allow_partial", False), params.get("stop_at_eos", True)
    if not isinstance(allow_partial, bool) or not isinstance(stop_at_eos, bool):
        raise _invalid("allow_partial", "params 'allow_partial' and 'stop_at_eos' must be true or false")
    wire = params.get("wire")
    if wire is not None and wire not in WIRE_CODECS:
        raise InvalidInput(f"param 'wire' must be one of {list(WIRE_CODECS)}, got {wire!r}",
                           reason="unsupported_encoding", param="wire")
    return {"allow_partial": allow_partial, "wire": wire, "stop_at_eos": stop_at_eos}


def max_new_of(params: Mapping[str, Any], *, prompt_tokens: int, limit: int, context: int | None) -> int:
    """max_new_tokens (default 16), within the router's limit and, with the prompt, the model's context;
    `fill_context` without max_new_tokens: as many as both allow (a chat without max_tokens)."""
    if params.get("fill_context") is True and params.get("max_new_tokens") is None:
        room = limit if context is None else min(limit, context - prompt_tokens)
        if room < 1:
            raise _invalid("messages", f"the prompt's {prompt_tokens} tokens fill the model's context of {context} "
                                       "tokens", reason="context_length_exceeded")
        return room
    max_new = params.get("max_new_tokens", 16)
    if isinstance(max_new, bool) or not isinstance(max_new, int) or not 1 <= max_new <= limit:
        raise _invalid("max_new_tokens", f"param 'max_new_tokens' must be an integer from 1 to {limit}, "
                                         f"got {max_new!r}")
    if context is not None and prompt_tokens + max_new > context:
        raise _invalid("max_new_tokens", f"the prompt's {prompt_tokens} tokens and {max_new} new ones exceed the "
                                         f"model's context of {context} tokens (max_position_embeddings)",
                       reason="context_length_exceeded")
    return max_new


def deadline_of(params: Mapping[str, Any], *, limit: float) -> float:
    """deadline_s (default and at most the router's TENZRO_GENERATE_DEADLINE_S): seconds from the request
    until the generation must have ended; past it, it ends with deadline_exceeded and the tokens so far."""
    deadline = params.get("deadline_s", limit)
    if isinstance(deadline, bool) or not isinstance(deadline, int | float) or not 0 < deadline <= limit:
        raise _invalid("deadline_s", f"param 'deadline_s' must be a number of seconds above 0 and at most {limit:g} "
                                     f"(TENZRO_GENERATE_DEADLINE_S), got {deadline!r}")
    return float(deadline)
