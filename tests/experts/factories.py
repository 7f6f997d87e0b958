"""Seeded factories for expert and gate payloads, and numpy references of the MoE blocks."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
from gguf import GGMLQuantizationType, quants

from core.formats.expert_payload import encode_expert_payload
from core.formats.gate_payload import dense_slice_bounds, encode_dense_gate_payload, encode_gate_payload

MODEL = "test/moe-tiny"
def reference_weights(fmt: str, blocks: np.ndarray) -> np.ndarray:
    """f32 [rows, n]: u8 blocks [rows, row_bytes] as gguf-py decodes them (the layouts' reference)."""
    return quants.dequantize(blocks, getattr(GGMLQuantizationType, fmt)).astype(np.float32)


def bit_report(ours: np.ndarray, ref: np.ndarray) -> str:
    """'k of n values differ in their bits' for two same-shape f32 arrays."""
    diff = ours.view(np.uint32) != ref.view(np.uint32)
    return f"{int(diff.sum())} of {diff.size} values differ in their bits"


def expert_weights(rng: np.random.Generator, d_model: int, d_ff: int) -> dict[str, np.ndarray]:
    """gate/up f32 [d_ff, d_model], down f32 [d_model, d_ff], scaled like trained FFNs (~1/sqrt(fan_in))."""
    return {
        "gate": (rng.standard_normal((d_ff, d_model)) / np.sqrt(d_model)).astype(np.float32),
        "up": (rng.standard_normal((d_ff, d_model)) / np.sqrt(d_model)).astype(np.float32),
        "down": (rng.standard_normal((d_model, d_ff)) / np.sqrt(d_ff)).astype(np.float32),
    }


def expert_payload(weights: dict[str, np.ndarray], *, expert: int, layer: int = 0, model_id: str = MODEL,
                   quant: str | dict | None = None) -> bytes:
    return encode_expert_payload(gate=weights["gate"], up=weights["up"], down=weights["down"], quant=quant,
                                 model_id=model_id, layer=layer, expert=expert)


def swiglu_reference(w: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """f64 down(silu(gate·x) ⊙ up·x), the DeepseekV3MLP / Qwen3MoeMLP forward."""
    x = x.astype(np.float64)
    g = x @ w["gate"].astype(np.float64).T
    u = x @ w["up"].astype(np.float64).T
    return (g / (1.0 + np.exp(-g)) * u) @ w["down"].astype(np.float64).T


def qwen_gate(rng: np.random.Generator, *, d_model: int, n_routed: int, top_k: int, norm: bool,
              layer: int = 0, model_id: str = MODEL) -> tuple[bytes, np.ndarray]:
    weight = rng.standard_normal((n_routed, d_model)).astype(np.float32)
    payload = encode_gate_payload(model_id=model_id, layer=layer, weight=weight, router="softmax",
                                  top_k=top_k, norm_topk_prob=norm)
    return payload, weight


def deepseek_gate(rng: np.random.Generator, *, d_model: int, n_routed: int, top_k: int, n_group: int,
                  topk_group: int, n_shared: int, scale: float = 2.5, norm: bool = True,
                  bias_shift: float = 0.0, layer: int = 0,
                  model_id: str = MODEL) -> tuple[bytes, np.ndarray, np.ndarray]:
    weight = (rng.standard_normal((n_routed, d_model)) * 0.3).astype(np.float32)
    bias = (rng.standard_normal(n_routed) * 0.1 + bias_shift).astype(np.float32)
    payload = encode_gate_payload(model_id=model_id, layer=layer, weight=weight, router="sigmoid", top_k=top_k,
                                  norm_topk_prob=norm, routed_scaling_factor=scale, n_group=n_group,
                                  topk_group=topk_group, n_shared_experts=n_shared,
                                  e_score_correction_bias=bias)
    return payload, weight, bias


def dense_gate(*, d_model: int, d_ff: int, n_slices: int, slice_align: int = 1, layer: int = 0,
               model_id: str = MODEL) -> bytes:
    return encode_dense_gate_payload(model_id=model_id, layer=layer, d_model=d_model, d_ff=d_ff, n_slices=n_slices,
                                     slice_align=slice_align)


def dense_slices(weights: dict[str, np.ndarray], n_slices: int, align: int = 1) -> dict[int, dict[str, np.ndarray]]:
    """A dense layer's {gate, up, down} cut into the slices of the protocol's rule: slice s holds
    d_ff rows [a, b) of gate/up and the same columns of down."""
    d_ff = weights["gate"].shape[0]
    return {s: {"gate": weights["gate"][a:b], "up": weights["up"][a:b],
                "down": np.ascontiguousarray(weights["down"][:, a:b])}
            for s, (a, b) in enumerate(dense_slice_bounds(d_ff, n_slices, align))}


# --- numpy translations of the transformers reference blocks -----------------------------------


def _torch_topk(values: np.ndarray, k: int) -> np.ndarray:
    # torch.topk(sorted=False): the k largest; the order is irrelevant to callers
    return np.argsort(-values, axis=-1, kind="stable")[..., :k]


def qwen3_router_reference(hidden: np.ndarray, weight: np.ndarray, top_k: int, norm_topk_prob: bool):
    """Qwen3MoeSparseMoeBlock.forward routing: softmax(float) -> topk -> optional renorm."""
    logits = hidden.astype(np.float32) @ weight.T
    e = np.exp(logits - logits.max(-1, keepdims=True))
    probs = e / e.sum(-1, keepdims=True)
    idx = _torch_topk(probs, top_k)
    w = np.take_along_axis(probs, idx, -1)
    if norm_topk_prob:
        w = w / w.sum(-1, keepdims=True)
    return idx, w


def deepseek_v3_router_reference(hidden, weight, bias, *, top_k, n_group, topk_group, norm_topk_prob,
                                 routed_scaling_factor, masked_fill=-np.inf):
    """DeepseekV3TopkRouter.forward; masked_fill=0.0 reproduces transformers 4.x."""
    n_routed = weight.shape[0]
    scores = 1.0 / (1.0 + np.exp(-(hidden.astype(np.float32) @ weight.T)))
    choice = scores + bias[None, :]
    grouped = choice.reshape(-1, n_group, n_routed // n_group)
    group_scores = np.sort(grouped, -1)[..., -2:].sum(-1)
    group_idx = _torch_topk(group_scores, topk_group)
    group_mask = np.zeros_like(group_scores)
    np.put_along_axis(group_mask, group_idx, 1.0, -1)
    score_mask = np.repeat(group_mask, n_routed // n_group, axis=-1).astype(bool)
    choice = np.where(score_mask, choice, masked_fill)
    idx = _torch_topk(choice, top_k)
    w = np.take_along_axis(scores, idx, -1)
    if norm_topk_prob:
        w = w / (w.sum(-1, keepdims=True) + 1e-20)
    return idx, w * routed_scaling_factor


def moe_block_reference(hidden, idx, w, experts: dict[int, dict[str, np.ndarray]], shared: list[int]):
    """Combine as Qwen3MoeSparseMoeBlock / DeepseekV3MoE.moe (+ shared experts unscaled), in f64."""
    out = np.zeros(hidden.shape, dtype=np.float64)
    for t in range(hidden.shape[0]):
        for j in range(idx.shape[1]):
            out[t] += w[t, j] * swiglu_reference(experts[int(idx[t, j])], hidden[t : t + 1])[0]
        for e in shared:
            out[t] += swiglu_reference(experts[e], hidden[t : t + 1])[0]
    return out


def run_in_threads(work: Callable[[int], list[np.ndarray]], n: int = 2) -> list[list[np.ndarray]]:
    """Run work(0) … work(n-1) in n threads at once; their results, by thread index."""
    results: dict[int, list[np.ndarray]] = {}

    def target(i: int) -> None:
        results[i] = work(i)

    workers = [threading.Thread(target=target, args=(i,)) for i in range(n)]
    for th in workers:
        th.start()
    for th in workers:
        th.join()
    return [results[i] for i in range(n)]
