"""The GLU an expert payload declares between its projections (docs/formats.md, "Expert payload").

Pure module (no numpy, no codecs): the compute backends read it without loading the payload reader.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

ACTIVATIONS = ("silu", "clamped_swiglu")


@dataclass(frozen=True)
class ExpertActivation:
    """The GLU between an expert's projections (g = gate·x + b_g, u = up·x + b_u):

    ``silu``            silu(g) · u                                     (Qwen, DeepSeek, GLM)
    ``clamped_swiglu``  g' = min(g, limit), u' = clip(u, -limit, limit),
                        g' · sigmoid(alpha · g') · (u' + 1)              (gpt-oss: alpha 1.702, limit 7)
    """

    kind: str = "silu"
    alpha: float | None = None
    limit: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in ACTIVATIONS:
            raise ValueError(f"activation {self.kind!r} is not known (known: {', '.join(ACTIVATIONS)})")
        if self.kind == "silu":
            if self.alpha is not None or self.limit is not None:
                raise ValueError("activation silu takes no alpha or limit")
            return
        for name in ("alpha", "limit"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"activation {self.kind} needs a finite positive {name}, got {value!r}")

    def metadata(self) -> dict[str, str]:
        if self.kind == "silu":
            return {}  # absent means silu: payloads written before activations existed read the same
        return {"activation": self.kind, "activation.alpha": repr(float(self.alpha)),
                "activation.limit": repr(float(self.limit))}

    @classmethod
    def from_metadata(cls, meta: Mapping[str, str]) -> ExpertActivation:
        kind = meta.get("activation", "silu")
        if kind == "silu":
            return cls()

        def number(key: str) -> float:
            try:
                return float(meta[key])
            except (KeyError, ValueError):
                raise ValueError(f"metadata {key!r} must be a decimal number for activation {kind!r}, "
                                   f"got {meta.get(key)!r}") from None
        return cls(kind=kind, alpha=number("activation.alpha"), limit=number("activation.limit"))


SILU = ExpertActivation()


__all__ = ["ACTIVATIONS", "SILU", "ExpertActivation"]
