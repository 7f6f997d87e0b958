"""Quantization presets for an expert's three projections.

    None / "none" / "f32"   -> dense F32 everywhere
    "q4_k_m"                -> gate Q4_K, up Q4_K, down Q6_K  (llama.cpp's Q4_K_M recipe for FFNs)
    "q8_0" | "q4_k" | "q6_k" | "mxfp4" | "f16" | "bf16" -> that type everywhere (one preset per GGMLType)
    {"gate": "q4_k", "up": "q4_k", "down": "q6_k"}  -> per projection (all three required; any
                                                        GGMLType name, case-insensitive, e.g. "MXFP4")

The result is what was *requested*; `types.resolve_type` applies the per-row fallback.
Pure module, never Django.
"""

from __future__ import annotations

from collections.abc import Mapping

from .types import GGMLType, parse_type

PROJECTIONS = ("gate", "up", "down")
# each projection's tensor in an expert payload and in a Hugging Face checkpoint's expert MLP
TENSOR_NAMES = {p: f"{p}_proj.weight" for p in PROJECTIONS}

PRESETS: dict[str, dict[str, GGMLType]] = {
    "q4_k_m": {"gate": GGMLType.Q4_K, "up": GGMLType.Q4_K, "down": GGMLType.Q6_K},
    **{t.value.lower(): dict.fromkeys(PROJECTIONS, t) for t in GGMLType},
    "none": dict.fromkeys(PROJECTIONS, GGMLType.F32),
}


def resolve_quant(quant: str | Mapping[str, str] | None) -> dict[str, GGMLType]:
    """Map a preset name, a per-projection mapping, or None to {projection: GGMLType}.

    Raises ValueError naming the bad value (unknown preset, unknown type, missing or
    unknown projection key).
    """
    if quant is None:
        return dict(PRESETS["none"])
    if isinstance(quant, str):
        preset = PRESETS.get(quant.strip().lower())
        if preset is None:
            raise ValueError(f"unknown quant preset {quant!r} (known: {', '.join(sorted(PRESETS))})")
        return dict(preset)
    if isinstance(quant, Mapping):
        unknown = sorted(set(quant) - set(PROJECTIONS), key=str)
        if unknown:
            raise ValueError(f"unknown projection(s) {unknown} in quant {dict(quant)!r}; expected {PROJECTIONS}")
        missing = [p for p in PROJECTIONS if p not in quant]
        if missing:
            raise ValueError(f"quant {dict(quant)!r} is missing projection(s) {missing}")
        out = {}
        for proj in PROJECTIONS:
            try:
                out[proj] = parse_type(quant[proj])
            except ValueError as exc:
                raise ValueError(f"quant[{proj!r}]: {exc}") from None
        return out
    raise ValueError(f"quant must be a preset name, a mapping or None, got {type(quant).__name__} {quant!r}")
